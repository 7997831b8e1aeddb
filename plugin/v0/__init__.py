"""CSI v0 (spec 0.3, ``package csi.v0``; what 0.2 clients speak too): servicers over :class:`plugin.core.Core`.

Differences from v1 that the servicers honour: ``Volume.id``/``attributes``,
``NodeGetId`` beside ``NodeGetInfo``, ValidateVolumeCapabilities answers
``supported``/``message``, and the CO owns the publish target (it creates it;
NodeUnpublishVolume unmounts but never removes it).
"""

from __future__ import annotations

import grpc

from plugin.core import Core


def register(server: grpc.Server, core: Core) -> None:
    from plugin.v0.controller import ControllerServicer
    from plugin.v0.identity import IdentityServicer
    from plugin.v0.node import NodeServicer
    from protos.v0 import csi_pb2_grpc

    csi_pb2_grpc.add_IdentityServicer_to_server(IdentityServicer(core), server)
    csi_pb2_grpc.add_ControllerServicer_to_server(ControllerServicer(core), server)
    csi_pb2_grpc.add_NodeServicer_to_server(NodeServicer(core), server)
