"""CSI v0 Node service: translation only; the work is in Core and mount/.

In v0 the CO creates the target path and removes it after
NodeUnpublishVolume, so the plugin only unmounts it.
"""

from __future__ import annotations

from plugin.core import Core
from plugin.translate import capability_from
from plugin.v0.translate import topology_to
from protos.v0 import csi_pb2 as csi
from protos.v0 import csi_pb2_grpc

_RPC = csi.NodeServiceCapability.RPC
CAPABILITIES = (_RPC.STAGE_UNSTAGE_VOLUME,)


class NodeServicer(csi_pb2_grpc.NodeServicer):
    def __init__(self, core: Core):
        self.core = core

    def NodeStageVolume(self, request, context):
        self.core.stage(request.volume_id, request.staging_target_path, capability_from(request.volume_capability))
        return csi.NodeStageVolumeResponse()

    def NodeUnstageVolume(self, request, context):
        self.core.unstage(request.volume_id, request.staging_target_path)
        return csi.NodeUnstageVolumeResponse()

    def NodePublishVolume(self, request, context):
        self.core.publish(
            request.volume_id,
            request.staging_target_path,
            request.target_path,
            capability_from(request.volume_capability),
            request.readonly,
        )
        return csi.NodePublishVolumeResponse()

    def NodeUnpublishVolume(self, request, context):
        self.core.unpublish(request.volume_id, request.target_path, remove_target=False)
        return csi.NodeUnpublishVolumeResponse()

    def NodeGetId(self, request, context):
        return csi.NodeGetIdResponse(node_id=self.core.settings.node_id)

    def NodeGetCapabilities(self, request, context):
        return csi.NodeGetCapabilitiesResponse(
            capabilities=[csi.NodeServiceCapability(rpc=_RPC(type=t)) for t in CAPABILITIES]
        )

    def NodeGetInfo(self, request, context):
        settings = self.core.settings
        return csi.NodeGetInfoResponse(
            node_id=settings.node_id,
            max_volumes_per_node=settings.max_volumes_per_node,
            accessible_topology=topology_to(self.core),
        )
