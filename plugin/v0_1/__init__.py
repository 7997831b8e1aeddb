"""CSI 0.1 (spec 0.1.0, ``package csi``; what Apache Mesos 1.5 speaks): servicers over :class:`plugin.core.Core`.

What differs from later versions: every request carries the ``version`` the
CO assumes (checked by :mod:`plugin.v0_1.validation`), GetSupportedVersions,
ControllerProbe/NodeProbe, GetNodeID, ``VolumeInfo``, no topology, and no
staging: NodePublishVolume stages a mount volume itself into a private
directory (:mod:`plugin.v0_1.staging`) and NodeUnpublishVolume unstages it.
"""

from __future__ import annotations

import grpc

from plugin.core import Core


def register(server: grpc.Server, core: Core) -> None:
    from plugin.v0_1.controller import ControllerServicer
    from plugin.v0_1.identity import IdentityServicer
    from plugin.v0_1.node import NodeServicer
    from protos.v0_1 import csi_pb2_grpc

    csi_pb2_grpc.add_IdentityServicer_to_server(IdentityServicer(core), server)
    csi_pb2_grpc.add_ControllerServicer_to_server(ControllerServicer(core), server)
    csi_pb2_grpc.add_NodeServicer_to_server(NodeServicer(core), server)
