"""CSI 0.1 Node service: translation only; the work is in Core and mount/.

0.1 has no staging: NodePublishVolume of a mount volume stages it into a
private directory first (:mod:`plugin.v0_1.staging`); NodeUnpublishVolume
unstages it when no other target uses it.  The CO owns the target path (it
creates and removes it), so it is unmounted, never removed.
"""

from __future__ import annotations

from plugin.core import Core
from plugin.translate import capability_from
from plugin.v0_1.staging import PrivateStaging
from protos.v0_1 import csi_pb2 as csi
from protos.v0_1 import csi_pb2_grpc


class NodeServicer(csi_pb2_grpc.NodeServicer):
    def __init__(self, core: Core, staging: PrivateStaging | None = None):
        self.core = core
        self.staging = staging or PrivateStaging(core)

    def NodePublishVolume(self, request, context):
        capability = capability_from(request.volume_capability)
        staging = ""
        if not capability.block:  # a block volume is bound from its device node: nothing to stage
            staging = self.staging.path_for(request.volume_id)
            self.core.stage(request.volume_id, staging, capability)
        self.core.publish(request.volume_id, staging, request.target_path, capability, request.readonly)
        return csi.NodePublishVolumeResponse()

    def NodeUnpublishVolume(self, request, context):
        self.core.unpublish(request.volume_id, request.target_path, remove_target=False)
        self.staging.release(request.volume_id)
        return csi.NodeUnpublishVolumeResponse()

    def GetNodeID(self, request, context):
        return csi.GetNodeIDResponse(node_id=self.core.settings.node_id)

    def NodeProbe(self, request, context):
        self.core.probe()  # BackendUnavailable -> FAILED_PRECONDITION with the reason
        return csi.NodeProbeResponse()

    def NodeGetCapabilities(self, request, context):
        return csi.NodeGetCapabilitiesResponse()  # 0.1 defines no node capability but UNKNOWN
