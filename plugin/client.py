"""A small CSI v1 client over the Unix socket, for operators (``csilvm client``), demos and tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import grpc
from google.protobuf import json_format

from plugin.server import socket_path_of
from protos.v1 import csi_pb2 as csi
from protos.v1 import csi_pb2_grpc

_MODE = csi.VolumeCapability.AccessMode.Mode


def volume_capability(block: bool = False, fs_type: str = "", mount_flags=(), mode: str = "SINGLE_NODE_WRITER"):
    access_mode = csi.VolumeCapability.AccessMode(mode=_MODE.Value(mode))
    if block:
        return csi.VolumeCapability(block=csi.VolumeCapability.BlockVolume(), access_mode=access_mode)
    return csi.VolumeCapability(
        mount=csi.VolumeCapability.MountVolume(fs_type=fs_type, mount_flags=list(mount_flags)),
        access_mode=access_mode,
    )


def as_dict(message) -> dict:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


@dataclass
class CsiClient:
    """Stubs for the three services on one channel; ``timeout`` applies to every call."""

    endpoint: str
    timeout: float = 60.0

    def __post_init__(self):
        self.channel = grpc.insecure_channel(f"unix://{socket_path_of(self.endpoint)}")
        self.identity = csi_pb2_grpc.IdentityStub(self.channel)
        self.controller = csi_pb2_grpc.ControllerStub(self.channel)
        self.node = csi_pb2_grpc.NodeStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def probe(self):
        return self.identity.Probe(csi.ProbeRequest(), timeout=self.timeout)

    def info(self):
        return self.identity.GetPluginInfo(csi.GetPluginInfoRequest(), timeout=self.timeout)

    def plugin_capabilities(self):
        return self.identity.GetPluginCapabilities(csi.GetPluginCapabilitiesRequest(), timeout=self.timeout)

    def controller_capabilities(self):
        return self.controller.ControllerGetCapabilities(csi.ControllerGetCapabilitiesRequest(), timeout=self.timeout)

    def node_capabilities(self):
        return self.node.NodeGetCapabilities(csi.NodeGetCapabilitiesRequest(), timeout=self.timeout)

    def node_info(self):
        return self.node.NodeGetInfo(csi.NodeGetInfoRequest(), timeout=self.timeout)

    def capacity(self, parameters: Mapping[str, str] | None = None, block: bool = False, fs_type: str = ""):
        return self.controller.GetCapacity(
            csi.GetCapacityRequest(
                parameters=dict(parameters or {}),
                volume_capabilities=[volume_capability(block=block, fs_type=fs_type)],
            ),
            timeout=self.timeout,
        )

    def list_volumes(self, max_entries: int = 0, starting_token: str = ""):
        return self.controller.ListVolumes(
            csi.ListVolumesRequest(max_entries=max_entries, starting_token=starting_token), timeout=self.timeout
        )

    def all_volumes(self, page_size: int = 100) -> list:
        volumes, token = [], ""
        while True:
            response = self.list_volumes(page_size, token)
            volumes += [entry.volume for entry in response.entries]
            token = response.next_token
            if not token:
                return volumes

    def create(
        self, name: str, required: int = 0, limit: int = 0, parameters=None, block=False, fs_type="",
        from_snapshot: str = "", from_volume: str = "",
    ):
        """CreateVolume; ``from_snapshot`` restores a snapshot, ``from_volume`` clones a volume."""
        request = csi.CreateVolumeRequest(
            name=name,
            capacity_range=csi.CapacityRange(required_bytes=required, limit_bytes=limit),
            volume_capabilities=[volume_capability(block=block, fs_type=fs_type)],
            parameters=dict(parameters or {}),
        )
        if from_snapshot:
            request.volume_content_source.snapshot.snapshot_id = from_snapshot
        elif from_volume:
            request.volume_content_source.volume.volume_id = from_volume
        return self.controller.CreateVolume(request, timeout=self.timeout).volume

    def snapshot(self, name: str, source_volume_id: str, parameters=None):
        return self.controller.CreateSnapshot(
            csi.CreateSnapshotRequest(name=name, source_volume_id=source_volume_id, parameters=dict(parameters or {})),
            timeout=self.timeout,
        ).snapshot

    def delete_snapshot(self, snapshot_id: str):
        return self.controller.DeleteSnapshot(csi.DeleteSnapshotRequest(snapshot_id=snapshot_id), timeout=self.timeout)

    def get_snapshot(self, snapshot_id: str):
        return self.controller.GetSnapshot(csi.GetSnapshotRequest(snapshot_id=snapshot_id), timeout=self.timeout).snapshot

    def list_snapshots(self, max_entries: int = 0, starting_token: str = "", snapshot_id: str = "", source_volume_id: str = ""):
        return self.controller.ListSnapshots(
            csi.ListSnapshotsRequest(
                max_entries=max_entries, starting_token=starting_token,
                snapshot_id=snapshot_id, source_volume_id=source_volume_id,
            ),
            timeout=self.timeout,
        )

    def delete(self, volume_id: str):
        return self.controller.DeleteVolume(csi.DeleteVolumeRequest(volume_id=volume_id), timeout=self.timeout)

    def stage(self, volume_id: str, staging_path: str, block=False, fs_type="", mount_flags=()):
        return self.node.NodeStageVolume(
            csi.NodeStageVolumeRequest(
                volume_id=volume_id,
                staging_target_path=staging_path,
                volume_capability=volume_capability(block=block, fs_type=fs_type, mount_flags=mount_flags),
            ),
            timeout=self.timeout,
        )

    def unstage(self, volume_id: str, staging_path: str):
        return self.node.NodeUnstageVolume(
            csi.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=staging_path), timeout=self.timeout
        )

    def publish(self, volume_id, staging_path, target_path, block=False, fs_type="", mount_flags=(), readonly=False):
        return self.node.NodePublishVolume(
            csi.NodePublishVolumeRequest(
                volume_id=volume_id,
                staging_target_path=staging_path,
                target_path=target_path,
                volume_capability=volume_capability(block=block, fs_type=fs_type, mount_flags=mount_flags),
                readonly=readonly,
            ),
            timeout=self.timeout,
        )

    def unpublish(self, volume_id: str, target_path: str):
        return self.node.NodeUnpublishVolume(
            csi.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target_path), timeout=self.timeout
        )

    def stats(self, volume_id: str, volume_path: str):
        return self.node.NodeGetVolumeStats(
            csi.NodeGetVolumeStatsRequest(volume_id=volume_id, volume_path=volume_path), timeout=self.timeout
        )

    def expand(self, volume_id: str, required: int, limit: int = 0, block: bool = False):
        return self.controller.ControllerExpandVolume(
            csi.ControllerExpandVolumeRequest(
                volume_id=volume_id,
                capacity_range=csi.CapacityRange(required_bytes=required, limit_bytes=limit),
                volume_capability=volume_capability(block=block),
            ),
            timeout=self.timeout,
        )

    def node_expand(self, volume_id: str, volume_path: str, staging_path: str = "", required: int = 0):
        return self.node.NodeExpandVolume(
            csi.NodeExpandVolumeRequest(
                volume_id=volume_id,
                volume_path=volume_path,
                staging_target_path=staging_path,
                capacity_range=csi.CapacityRange(required_bytes=required),
            ),
            timeout=self.timeout,
        )

    def get_volume(self, volume_id: str):
        return self.controller.ControllerGetVolume(
            csi.ControllerGetVolumeRequest(volume_id=volume_id), timeout=self.timeout
        )

    def modify(self, volume_id: str, mutable_parameters: Mapping[str, str]):
        return self.controller.ControllerModifyVolume(
            csi.ControllerModifyVolumeRequest(volume_id=volume_id, mutable_parameters=dict(mutable_parameters)),
            timeout=self.timeout,
        )
