"""Translation between CSI v1 messages and the version-neutral values of plugin/core.py."""

from __future__ import annotations

from typing import Iterable

from google.protobuf.timestamp_pb2 import Timestamp

from lvm.backend import Condition, ContentSource, SizeRange, Snapshot, Volume
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


def content_source_from(request) -> ContentSource | None:
    """The v1 CreateVolume's volume_content_source (validation made sure it names an id)."""
    if not request.HasField("volume_content_source"):
        return None
    source = request.volume_content_source
    if source.HasField("snapshot"):
        return ContentSource(ContentSource.SNAPSHOT, source.snapshot.snapshot_id)
    return ContentSource(ContentSource.VOLUME, source.volume.volume_id)


def content_source_to(source: ContentSource) -> csi.VolumeContentSource:
    if source.kind == ContentSource.SNAPSHOT:
        return csi.VolumeContentSource(snapshot=csi.VolumeContentSource.SnapshotSource(snapshot_id=source.id))
    return csi.VolumeContentSource(volume=csi.VolumeContentSource.VolumeSource(volume_id=source.id))


def volume_to(volume: Volume, core: Core) -> csi.Volume:
    message = csi.Volume(
        volume_id=volume.id,
        capacity_bytes=volume.size,
        volume_context=core.volume_context(volume),
        accessible_topology=[csi.Topology(segments=core.topology)],
    )
    if volume.content_source is not None:
        message.content_source.CopyFrom(content_source_to(volume.content_source))
    return message


def timestamp_of(nanoseconds: int) -> Timestamp:
    return Timestamp(seconds=nanoseconds // 1_000_000_000, nanos=nanoseconds % 1_000_000_000)


def snapshot_to(snapshot: Snapshot) -> csi.Snapshot:
    return csi.Snapshot(
        size_bytes=snapshot.size,
        snapshot_id=snapshot.id,
        source_volume_id=snapshot.source_volume_id,
        creation_time=timestamp_of(snapshot.created_ns),
        ready_to_use=snapshot.ready,
    )


def condition_to(condition: Condition) -> csi.VolumeCondition:
    return csi.VolumeCondition(abnormal=condition.abnormal, message=condition.message)
