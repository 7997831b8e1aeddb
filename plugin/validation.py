"""Request validation for CSI v1, a layer of its own in front of the servicers.

Each validator checks presence and shape of fields, and raises
:class:`RequestInvalid` with a sentence naming the field.  The servicers can
then assume well-formed requests.  The interceptor in plugin/interceptors.py
looks validators up by the full RPC name.
"""

from __future__ import annotations

import os
from typing import Callable

from lvm.errors import VolumeNotFound
from protos.v1 import csi_pb2 as csi
from plugin.errors import RequestInvalid

Validator = Callable[[object], None]
VALIDATORS: dict[str, Validator] = {}

_MODE = csi.VolumeCapability.AccessMode


def _rpc(service: str, method: str):
    def register(fn: Validator) -> Validator:
        VALIDATORS[f"/csi.v1.{service}/{method}"] = fn
        return fn

    return register


def require(value, what: str) -> None:
    if not value:
        raise RequestInvalid(f"{what} missing in request")


def require_path(path: str, what: str) -> None:
    require(path, what)
    if not os.path.isabs(path) or "\0" in path:
        raise RequestInvalid(f"{what} must be an absolute path, got {path!r}")


def check_capability(cap: csi.VolumeCapability, what: str = "volume_capability") -> None:
    if cap.WhichOneof("access_type") is None:
        raise RequestInvalid(f"{what} has neither block nor mount access type")
    if not cap.HasField("access_mode") or cap.access_mode.mode == _MODE.UNKNOWN:
        raise RequestInvalid(f"{what} has no access_mode")


def _check_capabilities(caps, what: str = "volume_capabilities") -> None:
    require(len(caps), what)
    for i, cap in enumerate(caps):
        check_capability(cap, f"{what}[{i}]")


@_rpc("Controller", "CreateVolume")
def create_volume(req: csi.CreateVolumeRequest) -> None:
    require(req.name, "name")
    _check_capabilities(req.volume_capabilities)
    _check_capacity_range(req.capacity_range)
    if req.HasField("volume_content_source"):
        check_content_source(req.volume_content_source)


def check_content_source(source, snapshot_id_field: str = "snapshot_id") -> None:
    """A content source names a snapshot or a volume, by a non-empty id (v0 calls the snapshot's ``id``)."""
    kind = source.WhichOneof("type")
    if kind is None:
        raise RequestInvalid("volume_content_source names neither a snapshot nor a volume")
    if kind == "snapshot":
        require(getattr(source.snapshot, snapshot_id_field), f"volume_content_source.snapshot.{snapshot_id_field}")
    else:
        require(source.volume.volume_id, "volume_content_source.volume.volume_id")


@_rpc("Controller", "DeleteVolume")
def delete_volume(req: csi.DeleteVolumeRequest) -> None:
    require(req.volume_id, "volume_id")


@_rpc("Controller", "ValidateVolumeCapabilities")
def validate_volume_capabilities(req: csi.ValidateVolumeCapabilitiesRequest) -> None:
    require(req.volume_id, "volume_id")
    _check_capabilities(req.volume_capabilities)


@_rpc("Controller", "ListVolumes")
def list_volumes(req: csi.ListVolumesRequest) -> None:
    if req.max_entries < 0:
        raise RequestInvalid(f"max_entries must not be negative, got {req.max_entries}")


@_rpc("Controller", "CreateSnapshot")
def create_snapshot(req: csi.CreateSnapshotRequest) -> None:
    require(req.source_volume_id, "source_volume_id")
    require(req.name, "name")


@_rpc("Controller", "DeleteSnapshot")
def delete_snapshot(req: csi.DeleteSnapshotRequest) -> None:
    require(req.snapshot_id, "snapshot_id")


@_rpc("Controller", "GetSnapshot")
def get_snapshot(req: csi.GetSnapshotRequest) -> None:
    require(req.snapshot_id, "snapshot_id")


@_rpc("Controller", "ListSnapshots")
def list_snapshots(req: csi.ListSnapshotsRequest) -> None:
    if req.max_entries < 0:
        raise RequestInvalid(f"max_entries must not be negative, got {req.max_entries}")


@_rpc("Controller", "GetCapacity")
def get_capacity(req: csi.GetCapacityRequest) -> None:
    # Malformed capabilities mean "cannot serve": capacity 0, not an error.
    return None


@_rpc("Node", "NodeStageVolume")
def node_stage_volume(req: csi.NodeStageVolumeRequest) -> None:
    require(req.volume_id, "volume_id")
    require_path(req.staging_target_path, "staging_target_path")
    require(req.HasField("volume_capability"), "volume_capability")
    check_capability(req.volume_capability)


@_rpc("Node", "NodeUnstageVolume")
def node_unstage_volume(req: csi.NodeUnstageVolumeRequest) -> None:
    require(req.volume_id, "volume_id")
    require_path(req.staging_target_path, "staging_target_path")


@_rpc("Node", "NodePublishVolume")
def node_publish_volume(req: csi.NodePublishVolumeRequest) -> None:
    require(req.volume_id, "volume_id")
    require_path(req.target_path, "target_path")
    require(req.HasField("volume_capability"), "volume_capability")
    check_capability(req.volume_capability)
    if req.volume_capability.HasField("mount"):
        require_path(req.staging_target_path, "staging_target_path")


@_rpc("Node", "NodeUnpublishVolume")
def node_unpublish_volume(req: csi.NodeUnpublishVolumeRequest) -> None:
    require(req.volume_id, "volume_id")
    require_path(req.target_path, "target_path")


def require_existing_path(path: str, what: str) -> None:
    """A path the CO says the volume is at: absent is INVALID_ARGUMENT, but a path that does not exist,
    whatever its form (the conformance suite sends "some/path"), is NOT_FOUND."""
    require(path, what)
    if "\0" in path:
        raise RequestInvalid(f"{what} must not contain NUL characters")
    if not os.path.isabs(path):
        raise VolumeNotFound(f"{what} {path!r} does not exist (a volume path is absolute)")


@_rpc("Node", "NodeGetVolumeStats")
def node_get_volume_stats(req: csi.NodeGetVolumeStatsRequest) -> None:
    require(req.volume_id, "volume_id")
    require_existing_path(req.volume_path, "volume_path")


@_rpc("Node", "NodeExpandVolume")
def node_expand_volume(req: csi.NodeExpandVolumeRequest) -> None:
    require(req.volume_id, "volume_id")
    require_existing_path(req.volume_path, "volume_path")
    if req.staging_target_path:
        require_path(req.staging_target_path, "staging_target_path")
    if req.HasField("volume_capability"):
        check_capability(req.volume_capability)
    _check_capacity_range(req.capacity_range)


def _check_capacity_range(capacity_range: csi.CapacityRange) -> None:
    if capacity_range.required_bytes < 0 or capacity_range.limit_bytes < 0:
        raise RequestInvalid("capacity_range bytes must not be negative")


@_rpc("Controller", "ControllerExpandVolume")
def controller_expand_volume(req: csi.ControllerExpandVolumeRequest) -> None:
    require(req.volume_id, "volume_id")
    require(req.HasField("capacity_range"), "capacity_range")
    _check_capacity_range(req.capacity_range)
    if req.HasField("volume_capability"):
        check_capability(req.volume_capability)


@_rpc("Controller", "ControllerGetVolume")
def controller_get_volume(req: csi.ControllerGetVolumeRequest) -> None:
    require(req.volume_id, "volume_id")


@_rpc("Controller", "ControllerModifyVolume")
def controller_modify_volume(req: csi.ControllerModifyVolumeRequest) -> None:
    require(req.volume_id, "volume_id")
    require(req.mutable_parameters, "mutable_parameters")
