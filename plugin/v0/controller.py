"""CSI v0 Controller service: translation only; the work is in Core and the backend.

ControllerPublish/Unpublish are not offered (not in the capabilities) and
answer UNIMPLEMENTED.  Snapshots run on the same Core as v1's.
"""

from __future__ import annotations

from plugin.core import Core
from plugin.translate import capabilities_from, size_range_from
from plugin.v0.translate import content_source_from, snapshot_to, volume_to
from protos.v0 import csi_pb2 as csi
from protos.v0 import csi_pb2_grpc

_RPC = csi.ControllerServiceCapability.RPC
CAPABILITIES = (
    _RPC.CREATE_DELETE_VOLUME,
    _RPC.LIST_VOLUMES,
    _RPC.GET_CAPACITY,
    _RPC.CREATE_DELETE_SNAPSHOT,
    _RPC.LIST_SNAPSHOTS,
)


class ControllerServicer(csi_pb2_grpc.ControllerServicer):
    def __init__(self, core: Core):
        self.core = core

    def CreateVolume(self, request, context):
        requisite = [dict(t.segments) for t in request.accessibility_requirements.requisite]
        volume = self.core.create_volume(
            request.name,
            size_range_from(request),
            capabilities_from(request.volume_capabilities),
            dict(request.parameters),
            requisite,
            content_source=content_source_from(request),
        )
        return csi.CreateVolumeResponse(volume=volume_to(volume, self.core))

    def DeleteVolume(self, request, context):
        self.core.delete_volume(request.volume_id)
        return csi.DeleteVolumeResponse()

    def ValidateVolumeCapabilities(self, request, context):
        problem = self.core.validate_capabilities(request.volume_id, capabilities_from(request.volume_capabilities))
        segments = [dict(t.segments) for t in request.accessible_topology]
        if not problem and not self.core.topology_admits(segments):
            problem = f"the volume is only accessible from {self.core.topology}"
        return csi.ValidateVolumeCapabilitiesResponse(supported=problem is None, message=problem or "")

    def ListVolumes(self, request, context):
        volumes, next_token = self.core.list_volumes(request.max_entries, request.starting_token)
        return csi.ListVolumesResponse(
            entries=[csi.ListVolumesResponse.Entry(volume=volume_to(v, self.core)) for v in volumes],
            next_token=next_token,
        )

    def GetCapacity(self, request, context):
        topology = dict(request.accessible_topology.segments) if request.HasField("accessible_topology") else None
        capacity = self.core.capacity(dict(request.parameters), capabilities_from(request.volume_capabilities), topology)
        return csi.GetCapacityResponse(available_capacity=capacity.available)

    def CreateSnapshot(self, request, context):
        snapshot = self.core.create_snapshot(request.name, request.source_volume_id, dict(request.parameters))
        return csi.CreateSnapshotResponse(snapshot=snapshot_to(snapshot))

    def DeleteSnapshot(self, request, context):
        self.core.delete_snapshot(request.snapshot_id)
        return csi.DeleteSnapshotResponse()

    def ListSnapshots(self, request, context):
        snapshots, next_token = self.core.list_snapshots(
            request.max_entries, request.starting_token, request.snapshot_id, request.source_volume_id
        )
        return csi.ListSnapshotsResponse(
            entries=[csi.ListSnapshotsResponse.Entry(snapshot=snapshot_to(s)) for s in snapshots],
            next_token=next_token,
        )

    def ControllerGetCapabilities(self, request, context):
        return csi.ControllerGetCapabilitiesResponse(
            capabilities=[csi.ControllerServiceCapability(rpc=_RPC(type=t)) for t in CAPABILITIES]
        )
