"""Validation of the day-two RPCs and of volume paths, as the spec and the conformance suite want them."""

from __future__ import annotations

import grpc
import pytest

from lvm.errors import VolumeNotFound
from plugin import validation
from plugin.client import volume_capability
from plugin.errors import RequestInvalid, status_for
from protos.v1 import csi_pb2 as pb


@pytest.mark.parametrize("validator, request_type, field", [
    (validation.node_get_volume_stats, pb.NodeGetVolumeStatsRequest, "volume_path"),
    (validation.node_expand_volume, pb.NodeExpandVolumeRequest, "volume_path"),
])
def test_a_volume_path_that_does_not_exist_is_not_found_whatever_its_form(validator, request_type, field):
    with pytest.raises(VolumeNotFound):
        validator(request_type(volume_id="v", **{field: "some/path"}))
    with pytest.raises(RequestInvalid, match=f"{field} missing"):
        validator(request_type(volume_id="v"))
    with pytest.raises(RequestInvalid, match="volume_id missing"):
        validator(request_type(**{field: "/abs"}))
    validator(request_type(volume_id="v", **{field: "/abs"}))


def test_controller_expand_needs_an_id_and_a_range():
    with pytest.raises(RequestInvalid, match="volume_id"):
        validation.controller_expand_volume(pb.ControllerExpandVolumeRequest(capacity_range=pb.CapacityRange(required_bytes=1)))
    with pytest.raises(RequestInvalid, match="capacity_range"):
        validation.controller_expand_volume(pb.ControllerExpandVolumeRequest(volume_id="v"))
    with pytest.raises(RequestInvalid, match="negative"):
        validation.controller_expand_volume(
            pb.ControllerExpandVolumeRequest(volume_id="v", capacity_range=pb.CapacityRange(required_bytes=-1))
        )
    with pytest.raises(RequestInvalid, match="access_mode"):
        validation.controller_expand_volume(pb.ControllerExpandVolumeRequest(
            volume_id="v", capacity_range=pb.CapacityRange(required_bytes=1),
            volume_capability=pb.VolumeCapability(block=pb.VolumeCapability.BlockVolume()),
        ))
    validation.controller_expand_volume(pb.ControllerExpandVolumeRequest(
        volume_id="v", capacity_range=pb.CapacityRange(required_bytes=1), volume_capability=volume_capability(block=True),
    ))


def test_get_and_modify_need_their_fields():
    with pytest.raises(RequestInvalid, match="volume_id"):
        validation.controller_get_volume(pb.ControllerGetVolumeRequest())
    with pytest.raises(RequestInvalid, match="mutable_parameters"):
        validation.controller_modify_volume(pb.ControllerModifyVolumeRequest(volume_id="v"))
    with pytest.raises(RequestInvalid, match="volume_id"):
        validation.controller_modify_volume(pb.ControllerModifyVolumeRequest(mutable_parameters={"type": "linear"}))
    validation.controller_modify_volume(pb.ControllerModifyVolumeRequest(volume_id="v", mutable_parameters={"type": "raid1"}))
    for rpc in ("ControllerExpandVolume", "ControllerGetVolume", "ControllerModifyVolume"):
        assert f"/csi.v1.Controller/{rpc}" in validation.VALIDATORS
    assert "/csi.v1.Node/NodeExpandVolume" in validation.VALIDATORS


def test_node_expand_checks_its_optional_fields_only_when_present():
    ok = dict(volume_id="v", volume_path="/target")
    validation.node_expand_volume(pb.NodeExpandVolumeRequest(**ok))  # staging path, capability and range are optional
    validation.node_expand_volume(pb.NodeExpandVolumeRequest(
        **ok, staging_target_path="/staging", volume_capability=volume_capability(block=False),
        capacity_range=pb.CapacityRange(required_bytes=1 << 20),
    ))
    with pytest.raises(RequestInvalid, match="staging_target_path must be an absolute path"):
        validation.node_expand_volume(pb.NodeExpandVolumeRequest(**ok, staging_target_path="staging"))
    with pytest.raises(RequestInvalid, match="neither block nor mount"):
        validation.node_expand_volume(pb.NodeExpandVolumeRequest(**ok, volume_capability=pb.VolumeCapability()))
    with pytest.raises(RequestInvalid, match="negative"):
        validation.node_expand_volume(pb.NodeExpandVolumeRequest(**ok, capacity_range=pb.CapacityRange(limit_bytes=-1)))


def test_a_volume_path_with_a_nul_is_invalid_and_never_looked_up():
    with pytest.raises(RequestInvalid, match="NUL"):
        validation.node_get_volume_stats(pb.NodeGetVolumeStatsRequest(volume_id="v", volume_path="/a\0b"))


def test_a_relative_volume_path_answers_not_found_an_empty_one_invalid_argument():
    with pytest.raises(VolumeNotFound) as err:
        validation.node_get_volume_stats(pb.NodeGetVolumeStatsRequest(volume_id="v", volume_path="some/path"))
    assert status_for(err.value) == grpc.StatusCode.NOT_FOUND
    with pytest.raises(RequestInvalid) as err:
        validation.node_get_volume_stats(pb.NodeGetVolumeStatsRequest(volume_id="v"))
    assert status_for(err.value) == grpc.StatusCode.INVALID_ARGUMENT
