"""CSI 0.1 Controller service: translation only; the work is in Core and the backend.

0.1 has no topology: volumes are created on this node, capacity is this node's.
ControllerPublish/Unpublish are not offered and answer UNIMPLEMENTED.
"""

from __future__ import annotations

from plugin.core import Core
from plugin.translate import capabilities_from, size_range_from
from plugin.v0_1.translate import volume_info_to
from protos.v0_1 import csi_pb2 as csi
from protos.v0_1 import csi_pb2_grpc

_RPC = csi.ControllerServiceCapability.RPC
CAPABILITIES = (_RPC.CREATE_DELETE_VOLUME, _RPC.LIST_VOLUMES, _RPC.GET_CAPACITY)


class ControllerServicer(csi_pb2_grpc.ControllerServicer):
    def __init__(self, core: Core):
        self.core = core

    def CreateVolume(self, request, context):
        volume = self.core.create_volume(
            request.name,
            size_range_from(request),
            capabilities_from(request.volume_capabilities),
            dict(request.parameters),
        )
        return csi.CreateVolumeResponse(volume_info=volume_info_to(volume, self.core))

    def DeleteVolume(self, request, context):
        self.core.delete_volume(request.volume_id)
        return csi.DeleteVolumeResponse()

    def ValidateVolumeCapabilities(self, request, context):
        problem = self.core.validate_capabilities(request.volume_id, capabilities_from(request.volume_capabilities))
        return csi.ValidateVolumeCapabilitiesResponse(supported=problem is None, message=problem or "")

    def ListVolumes(self, request, context):
        volumes, next_token = self.core.list_volumes(request.max_entries, request.starting_token)
        return csi.ListVolumesResponse(
            entries=[csi.ListVolumesResponse.Entry(volume_info=volume_info_to(v, self.core)) for v in volumes],
            next_token=next_token,
        )

    def GetCapacity(self, request, context):
        capacity = self.core.capacity(dict(request.parameters), capabilities_from(request.volume_capabilities))
        return csi.GetCapacityResponse(available_capacity=capacity.available)

    def ControllerProbe(self, request, context):
        self.core.probe()  # BackendUnavailable -> FAILED_PRECONDITION with the reason
        return csi.ControllerProbeResponse()

    def ControllerGetCapabilities(self, request, context):
        return csi.ControllerGetCapabilitiesResponse(
            capabilities=[csi.ControllerServiceCapability(rpc=_RPC(type=t)) for t in CAPABILITIES]
        )
