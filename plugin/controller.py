"""CSI v1 Controller service: translation only; the work is in Core and the backend."""

from __future__ import annotations

from google.protobuf.wrappers_pb2 import Int64Value

from plugin.core import Core
from plugin.translate import (
    capabilities_from,
    capability_from,
    condition_to,
    content_source_from,
    size_range_from,
    snapshot_to,
    volume_to,
)
from protos.v1 import csi_pb2 as csi
from protos.v1 import csi_pb2_grpc

_RPC = csi.ControllerServiceCapability.RPC
CAPABILITIES = (
    _RPC.CREATE_DELETE_VOLUME,
    _RPC.LIST_VOLUMES,
    _RPC.GET_CAPACITY,
    _RPC.SINGLE_NODE_MULTI_WRITER,
    _RPC.EXPAND_VOLUME,
    _RPC.GET_VOLUME,
    _RPC.VOLUME_CONDITION,
    _RPC.MODIFY_VOLUME,
    _RPC.CREATE_DELETE_SNAPSHOT,
    _RPC.LIST_SNAPSHOTS,
    _RPC.CLONE_VOLUME,
    # Last: CSI 1.12's newest capability, which conformance suites older than the spec stop at.
    _RPC.GET_SNAPSHOT,
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
            dict(request.mutable_parameters),
            content_source_from(request),
        )
        return csi.CreateVolumeResponse(volume=volume_to(volume, self.core))

    def DeleteVolume(self, request, context):
        self.core.delete_volume(request.volume_id)
        return csi.DeleteVolumeResponse()

    def ValidateVolumeCapabilities(self, request, context):
        problem = self.core.validate_capabilities(request.volume_id, capabilities_from(request.volume_capabilities))
        if problem:
            return csi.ValidateVolumeCapabilitiesResponse(message=problem)
        return csi.ValidateVolumeCapabilitiesResponse(
            confirmed=csi.ValidateVolumeCapabilitiesResponse.Confirmed(
                volume_context=request.volume_context,
                volume_capabilities=request.volume_capabilities,
                parameters=request.parameters,
            )
        )

    def ListVolumes(self, request, context):
        volumes, next_token = self.core.list_volumes(request.max_entries, request.starting_token)
        return csi.ListVolumesResponse(
            entries=[
                csi.ListVolumesResponse.Entry(
                    volume=volume_to(v, self.core),
                    # The spec wants each volume's condition from a plugin with VOLUME_CONDITION.
                    status=csi.ListVolumesResponse.VolumeStatus(volume_condition=condition_to(self.core.condition_of(v))),
                )
                for v in volumes
            ],
            next_token=next_token,
        )

    def GetCapacity(self, request, context):
        capabilities = capabilities_from(request.volume_capabilities)
        topology = dict(request.accessible_topology.segments) if request.HasField("accessible_topology") else None
        capacity = self.core.capacity(dict(request.parameters), capabilities, topology)
        return csi.GetCapacityResponse(
            available_capacity=capacity.available,
            maximum_volume_size=Int64Value(value=capacity.maximum_volume_size),
            minimum_volume_size=Int64Value(value=capacity.minimum_volume_size),
        )

    def ControllerExpandVolume(self, request, context):
        capability = capability_from(request.volume_capability) if request.HasField("volume_capability") else None
        size, node_expansion_required = self.core.expand_volume(
            request.volume_id, size_range_from(request), capability
        )
        return csi.ControllerExpandVolumeResponse(
            capacity_bytes=size, node_expansion_required=node_expansion_required
        )

    def ControllerGetVolume(self, request, context):
        volume, condition = self.core.volume_status(request.volume_id)
        return csi.ControllerGetVolumeResponse(
            volume=volume_to(volume, self.core),
            status=csi.ControllerGetVolumeResponse.VolumeStatus(volume_condition=condition_to(condition)),
        )

    def ControllerModifyVolume(self, request, context):
        self.core.modify_volume(request.volume_id, dict(request.mutable_parameters))
        return csi.ControllerModifyVolumeResponse()

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

    def GetSnapshot(self, request, context):
        return csi.GetSnapshotResponse(snapshot=snapshot_to(self.core.get_snapshot(request.snapshot_id)))

    def ControllerGetCapabilities(self, request, context):
        return csi.ControllerGetCapabilitiesResponse(
            capabilities=[csi.ControllerServiceCapability(rpc=_RPC(type=t)) for t in CAPABILITIES]
        )
