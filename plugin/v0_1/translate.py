"""CSI 0.1 messages from the version-neutral values of plugin/core.py.

Capabilities and capacity ranges have the v1 shape, so :mod:`plugin.translate` reads them.
"""

from __future__ import annotations

from lvm.backend import Volume
from plugin.core import Core
from protos.v0_1 import csi_pb2 as csi

# The versions of the spec this package speaks, as (major, minor, patch).
SUPPORTED_VERSIONS = ((0, 1, 0),)


def version_text(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


def volume_info_to(volume: Volume, core: Core) -> csi.VolumeInfo:
    return csi.VolumeInfo(id=volume.id, capacity_bytes=volume.size, attributes=core.volume_context(volume))
