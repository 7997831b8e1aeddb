"""The generated code is current, and the messages match the CSI spec's names and numbers."""

from __future__ import annotations

import pytest

from protos.v1 import csi_pb2


def test_generated_code_is_not_stale():
    pytest.importorskip("grpc_tools", reason="grpcio-tools (test extra) regenerates the code")
    from protos.generate import stale_files

    assert stale_files() == [], "run: python -m protos.generate"


# A sample of the spec's field numbers that independent CSI clients depend on.
SPEC_FIELDS = {
    "CreateVolumeRequest": {"name": 1, "capacity_range": 2, "volume_capabilities": 3, "parameters": 4, "secrets": 5,
                            "volume_content_source": 6, "accessibility_requirements": 7, "mutable_parameters": 8},
    "Volume": {"capacity_bytes": 1, "volume_id": 2, "volume_context": 3, "content_source": 4, "accessible_topology": 5},
    "GetCapacityResponse": {"available_capacity": 1, "maximum_volume_size": 2, "minimum_volume_size": 3},
    "NodePublishVolumeRequest": {"volume_id": 1, "publish_context": 2, "staging_target_path": 3, "target_path": 4,
                                 "volume_capability": 5, "readonly": 6, "secrets": 7, "volume_context": 8},
    "NodeStageVolumeRequest": {"volume_id": 1, "publish_context": 2, "staging_target_path": 3, "volume_capability": 4,
                               "secrets": 5, "volume_context": 6},
    "NodeGetVolumeStatsRequest": {"volume_id": 1, "volume_path": 2, "staging_target_path": 3},
    "NodeGetVolumeStatsResponse": {"usage": 1, "volume_condition": 2},
    "NodeGetInfoResponse": {"node_id": 1, "max_volumes_per_node": 2, "accessible_topology": 3},
    "ListVolumesResponse": {"entries": 1, "next_token": 2},
    "ValidateVolumeCapabilitiesResponse": {"confirmed": 1, "message": 2},
    "VolumeUsage": {"available": 1, "total": 2, "used": 3, "unit": 4},
    "ControllerExpandVolumeRequest": {"volume_id": 1, "capacity_range": 2, "secrets": 3, "volume_capability": 4},
    "NodeExpandVolumeRequest": {"volume_id": 1, "volume_path": 2, "capacity_range": 3, "staging_target_path": 4,
                                "volume_capability": 5, "secrets": 6},
    "Snapshot": {"size_bytes": 1, "snapshot_id": 2, "source_volume_id": 3, "creation_time": 4, "ready_to_use": 5,
                 "group_snapshot_id": 6},
}


@pytest.mark.parametrize("message", sorted(SPEC_FIELDS))
def test_field_numbers_match_the_spec(message):
    descriptor = csi_pb2.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in descriptor.fields} == SPEC_FIELDS[message]


def test_package_services_and_enums():
    assert csi_pb2.DESCRIPTOR.package == "csi.v1"
    assert set(csi_pb2.DESCRIPTOR.services_by_name) == {"Identity", "Controller", "GroupController", "SnapshotMetadata", "Node"}
    mode = csi_pb2.VolumeCapability.AccessMode.Mode
    assert mode.Value("SINGLE_NODE_MULTI_WRITER") == 7
    rpc = csi_pb2.ControllerServiceCapability.RPC.Type
    assert rpc.Value("MODIFY_VOLUME") == 14 and rpc.Value("GET_CAPACITY") == 4
    node_rpc = csi_pb2.NodeServiceCapability.RPC.Type
    assert node_rpc.Value("VOLUME_MOUNT_GROUP") == 6


def test_secret_fields_carry_the_csi_secret_option():
    field = csi_pb2.CreateVolumeRequest.DESCRIPTOR.fields_by_name["secrets"]
    assert field.GetOptions().Extensions[csi_pb2.csi_secret] is True
