"""CSI v0 messages from the version-neutral values of plugin/core.py.

Capabilities and capacity ranges have the same shape as in v1, so
:mod:`plugin.translate` reads them (the access mode names and numbers of v0
are a prefix of v1's).
"""

from __future__ import annotations

from lvm.backend import Volume
from plugin.core import Core
from protos.v0 import csi_pb2 as csi


def topology_to(core: Core) -> csi.Topology:
    return csi.Topology(segments=core.topology)


def volume_to(volume: Volume, core: Core) -> csi.Volume:
    return csi.Volume(
        id=volume.id,
        capacity_bytes=volume.size,
        attributes=core.volume_context(volume),
        accessible_topology=[topology_to(core)],
    )
