"""Translation between CSI v1 messages and the version-neutral values of plugin/core.py."""

from __future__ import annotations

from typing import Iterable

from lvm.backend import Condition, SizeRange, Volume
from plugin.core import AccessMode, Capability, Core
from protos.v1 import csi_pb2 as csi

_MODE_NAMES = csi.VolumeCapability.AccessMode.Mode


def capability_from(cap: csi.VolumeCapability) -> Capability:
    try:
        mode = AccessMode(_MODE_NAMES.Name(cap.access_mode.mode))
    except ValueError:  # a mode from a newer spec: not one we serve
        mode = AccessMode.UNKNOWN
    if cap.HasField("block"):
        return Capability(block=True, access_mode=mode)
    return Capability(
        block=False,
        access_mode=mode,
        fs_type=cap.mount.fs_type,
        mount_flags=tuple(cap.mount.mount_flags),
    )


def capabilities_from(caps: Iterable[csi.VolumeCapability]) -> list[Capability]:
    return [capability_from(cap) for cap in caps]


def size_range_from(request) -> SizeRange:
    return SizeRange(request.capacity_range.required_bytes, request.capacity_range.limit_bytes)


def volume_to(volume: Volume, core: Core) -> csi.Volume:
    return csi.Volume(
        volume_id=volume.id,
        capacity_bytes=volume.size,
        volume_context=core.volume_context(volume),
        accessible_topology=[csi.Topology(segments=core.topology)],
    )


def condition_to(condition: Condition) -> csi.VolumeCondition:
    return csi.VolumeCondition(abnormal=condition.abnormal, message=condition.message)
