"""CSI v0 messages from the version-neutral values of plugin/core.py.

Capabilities and capacity ranges have the same shape as in v1, so
:mod:`plugin.translate` reads them (the access mode names and numbers of v0
are a prefix of v1's).
"""

from __future__ import annotations

from lvm.backend import ContentSource, Snapshot, Volume
from plugin.core import Core
from protos.v0 import csi_pb2 as csi


def topology_to(core: Core) -> csi.Topology:
    return csi.Topology(segments=core.topology)


def volume_to(volume: Volume, core: Core) -> csi.Volume:
    message = csi.Volume(
        id=volume.id,
        capacity_bytes=volume.size,
        attributes=core.volume_context(volume),
        accessible_topology=[topology_to(core)],
    )
    if volume.content_source is not None and volume.content_source.kind == ContentSource.SNAPSHOT:
        message.content_source.snapshot.id = volume.content_source.id
    return message


def content_source_from(request) -> ContentSource | None:
    """v0.3 restores from snapshots only (its VolumeContentSource has no volume)."""
    if not request.HasField("volume_content_source"):
        return None
    return ContentSource(ContentSource.SNAPSHOT, request.volume_content_source.snapshot.id)


def snapshot_to(snapshot: Snapshot) -> csi.Snapshot:
    status = csi.SnapshotStatus.READY if snapshot.ready else csi.SnapshotStatus.UPLOADING
    return csi.Snapshot(
        size_bytes=snapshot.size,
        id=snapshot.id,
        source_volume_id=snapshot.source_volume_id,
        created_at=snapshot.created_ns,
        status=csi.SnapshotStatus(type=status),
    )
