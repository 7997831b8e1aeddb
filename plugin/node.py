"""CSI v1 Node service: translation only; the work is in Core and mount/."""

from __future__ import annotations

from plugin.core import Core
from plugin.translate import capability_from, condition_to
from protos.v1 import csi_pb2 as csi
from protos.v1 import csi_pb2_grpc

_RPC = csi.NodeServiceCapability.RPC
CAPABILITIES = (
    _RPC.STAGE_UNSTAGE_VOLUME,
    _RPC.GET_VOLUME_STATS,
    _RPC.SINGLE_NODE_MULTI_WRITER,
    _RPC.EXPAND_VOLUME,
    _RPC.VOLUME_CONDITION,
)
_UNIT = csi.VolumeUsage.Unit


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
        self.core.unpublish(request.volume_id, request.target_path)
        return csi.NodeUnpublishVolumeResponse()

    def NodeGetVolumeStats(self, request, context):
        stats = self.core.stats(request.volume_id, request.volume_path)
        usage = [csi.VolumeUsage(unit=_UNIT.BYTES, total=stats.bytes_total)]
        if stats.bytes_used is not None:
            usage[0].used = stats.bytes_used
            usage[0].available = stats.bytes_available
            usage.append(
                csi.VolumeUsage(
                    unit=_UNIT.INODES,
                    total=stats.inodes_total,
                    used=stats.inodes_used,
                    available=stats.inodes_available,
                )
            )
        return csi.NodeGetVolumeStatsResponse(usage=usage, volume_condition=condition_to(stats.condition))

    def NodeExpandVolume(self, request, context):
        size = self.core.node_expand(request.volume_id, request.volume_path, request.staging_target_path)
        return csi.NodeExpandVolumeResponse(capacity_bytes=size)

    def NodeGetCapabilities(self, request, context):
        return csi.NodeGetCapabilitiesResponse(
            capabilities=[csi.NodeServiceCapability(rpc=_RPC(type=t)) for t in CAPABILITIES]
        )

    def NodeGetInfo(self, request, context):
        settings = self.core.settings
        return csi.NodeGetInfoResponse(
            node_id=settings.node_id,
            max_volumes_per_node=settings.max_volumes_per_node,
            accessible_topology=csi.Topology(segments=self.core.topology),
        )
