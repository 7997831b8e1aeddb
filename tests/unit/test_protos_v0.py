"""protos/v0 is exactly CSI 0.3.0, protos/v0_1 has the field numbers of CSI 0.1.0.

The fixture tests/fixtures/protos/csi_v0_3_0.descriptor.json is the
FileDescriptorProto (file name cleared, as JSON) serialized in a csi_pb2.py
generated from the released spec v0.3.0 csi.proto (the one vendored by
ember-csi), extracted once with ``descriptor_pb2.FileDescriptorProto.FromString``
and ``json_format.MessageToDict(..., preserving_proto_field_name=True)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, json_format

from protos.v0 import csi_pb2 as v0
from protos.v0_1 import csi_pb2 as v0_1

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "protos" / "csi_v0_3_0.descriptor.json"


def _strip_json_names(message: descriptor_pb2.DescriptorProto) -> None:
    """protoc records json_name in newer descriptors; the 0.3.0 one predates it (it is derived anyway)."""
    for field in message.field:
        field.ClearField("json_name")
    for nested in message.nested_type:
        _strip_json_names(nested)


def _ours() -> dict:
    proto = descriptor_pb2.FileDescriptorProto()
    v0.DESCRIPTOR.CopyToProto(proto)
    proto.ClearField("name")
    for message in proto.message_type:
        _strip_json_names(message)
    return json_format.MessageToDict(proto, preserving_proto_field_name=True)


REFERENCE = json.loads(FIXTURE.read_text())
OURS = _ours()


def _by_name(kind: str) -> list[tuple[str, str]]:
    return [(kind, item["name"]) for item in REFERENCE.get(kind, [])]


def test_file_level_matches_the_release():
    assert OURS["package"] == REFERENCE["package"] == "csi.v0"
    assert OURS["dependency"] == REFERENCE["dependency"] == ["google/protobuf/wrappers.proto"]
    assert OURS.get("options") == REFERENCE.get("options")
    assert OURS["syntax"] == REFERENCE["syntax"] == "proto3"
    for kind in ("message_type", "enum_type", "service", "extension"):
        assert [i["name"] for i in OURS.get(kind, [])] == [i["name"] for i in REFERENCE.get(kind, [])], kind


@pytest.mark.parametrize("kind, name", _by_name("message_type") + _by_name("service"))
def test_each_message_and_service_matches_the_release(kind, name):
    """Fields (name, number, type, label, type name, oneof), nested types, enums, methods, options."""
    [ours] = [i for i in OURS.get(kind, []) if i["name"] == name]
    [reference] = [i for i in REFERENCE[kind] if i["name"] == name]
    assert ours == reference


def test_whole_descriptor_equals_the_release():
    assert OURS == REFERENCE


def test_v0_rules_the_servicers_rely_on():
    node_get_id = v0.DESCRIPTOR.services_by_name["Node"].methods_by_name["NodeGetId"]
    assert node_get_id.GetOptions().deprecated is True
    assert v0.GetPluginCapabilitiesResponse.DESCRIPTOR.fields_by_name["capabilities"].number == 2
    assert [f.name for f in v0.Volume.DESCRIPTOR.fields][:3] == ["capacity_bytes", "id", "attributes"]
    assert v0.PluginCapability.Service.Type.Value("ACCESSIBILITY_CONSTRAINTS") == 2


# CSI 0.1.0: no released descriptor at hand, so the numbers that Mesos 1.5 depends on are spelled out.
SPEC_0_1_FIELDS = {
    "Version": {"major": 1, "minor": 2, "patch": 3},
    "GetSupportedVersionsResponse": {"supported_versions": 1},
    "GetPluginInfoRequest": {"version": 1},
    "GetPluginInfoResponse": {"name": 1, "vendor_version": 2, "manifest": 3},
    "CreateVolumeRequest": {"version": 1, "name": 2, "capacity_range": 3, "volume_capabilities": 4, "parameters": 5,
                            "user_credentials": 6},
    "CreateVolumeResponse": {"volume_info": 1},
    "VolumeCapability": {"block": 1, "mount": 2, "access_mode": 3},
    "CapacityRange": {"required_bytes": 1, "limit_bytes": 2},
    "VolumeInfo": {"capacity_bytes": 1, "id": 2, "attributes": 3},
    "DeleteVolumeRequest": {"version": 1, "volume_id": 2, "user_credentials": 3},
    "ControllerPublishVolumeRequest": {"version": 1, "volume_id": 2, "node_id": 3, "volume_capability": 4,
                                       "readonly": 5, "user_credentials": 6, "volume_attributes": 7},
    "ControllerPublishVolumeResponse": {"publish_volume_info": 1},
    "ControllerUnpublishVolumeRequest": {"version": 1, "volume_id": 2, "node_id": 3, "user_credentials": 4},
    "ValidateVolumeCapabilitiesRequest": {"version": 1, "volume_id": 2, "volume_capabilities": 3,
                                          "volume_attributes": 4},
    "ValidateVolumeCapabilitiesResponse": {"supported": 1, "message": 2},
    "ListVolumesRequest": {"version": 1, "max_entries": 2, "starting_token": 3},
    "ListVolumesResponse": {"entries": 1, "next_token": 2},
    "GetCapacityRequest": {"version": 1, "volume_capabilities": 2, "parameters": 3},
    "GetCapacityResponse": {"available_capacity": 1},
    "ControllerProbeRequest": {"version": 1},
    "ControllerGetCapabilitiesRequest": {"version": 1},
    "ControllerGetCapabilitiesResponse": {"capabilities": 2},
    "NodePublishVolumeRequest": {"version": 1, "volume_id": 2, "publish_volume_info": 3, "target_path": 4,
                                 "volume_capability": 5, "readonly": 6, "user_credentials": 7, "volume_attributes": 8},
    "NodeUnpublishVolumeRequest": {"version": 1, "volume_id": 2, "target_path": 3, "user_credentials": 4},
    "GetNodeIDRequest": {"version": 1},
    "GetNodeIDResponse": {"node_id": 1},
    "NodeProbeRequest": {"version": 1},
    "NodeGetCapabilitiesRequest": {"version": 1},
    "NodeGetCapabilitiesResponse": {"capabilities": 1},
}


@pytest.mark.parametrize("message", sorted(SPEC_0_1_FIELDS))
def test_0_1_field_numbers_match_the_spec(message):
    descriptor = v0_1.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in descriptor.fields} == SPEC_0_1_FIELDS[message]


def test_0_1_package_services_and_types():
    assert v0_1.DESCRIPTOR.package == "csi"
    methods = {name: [m.name for m in s.methods] for name, s in v0_1.DESCRIPTOR.services_by_name.items()}
    assert methods == {
        "Identity": ["GetSupportedVersions", "GetPluginInfo"],
        "Controller": ["CreateVolume", "DeleteVolume", "ControllerPublishVolume", "ControllerUnpublishVolume",
                       "ValidateVolumeCapabilities", "ListVolumes", "GetCapacity", "ControllerProbe",
                       "ControllerGetCapabilities"],
        "Node": ["NodePublishVolume", "NodeUnpublishVolume", "GetNodeID", "NodeProbe", "NodeGetCapabilities"],
    }
    uint64 = descriptor_pb2.FieldDescriptorProto.TYPE_UINT64
    for message, field in [("CapacityRange", "required_bytes"), ("CapacityRange", "limit_bytes"),
                           ("VolumeInfo", "capacity_bytes"), ("GetCapacityResponse", "available_capacity")]:
        assert v0_1.DESCRIPTOR.message_types_by_name[message].fields_by_name[field].type == uint64
    assert v0_1.ListVolumesRequest.DESCRIPTOR.fields_by_name["max_entries"].type == descriptor_pb2.FieldDescriptorProto.TYPE_UINT32
    assert v0_1.NodeServiceCapability.RPC.Type.keys() == ["UNKNOWN"]  # no staging in 0.1
    assert v0_1.ControllerServiceCapability.RPC.Type.Value("GET_CAPACITY") == 4
    assert "NodeStageVolumeRequest" not in v0_1.DESCRIPTOR.message_types_by_name
