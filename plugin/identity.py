"""CSI v1 Identity service."""

from __future__ import annotations

from google.protobuf.wrappers_pb2 import BoolValue

from plugin.core import Core
from protos.v1 import csi_pb2 as csi
from protos.v1 import csi_pb2_grpc

_SERVICE = csi.PluginCapability.Service
_EXPANSION = csi.PluginCapability.VolumeExpansion


class IdentityServicer(csi_pb2_grpc.IdentityServicer):
    def __init__(self, core: Core):
        self.core = core

    def GetPluginInfo(self, request, context):
        return csi.GetPluginInfoResponse(
            name=self.core.settings.name,
            vendor_version=self.core.settings.vendor_version,
            manifest={"backend": self.core.backend.kind},
        )

    def GetPluginCapabilities(self, request, context):
        return csi.GetPluginCapabilitiesResponse(
            capabilities=[
                csi.PluginCapability(service=_SERVICE(type=_SERVICE.CONTROLLER_SERVICE)),
                csi.PluginCapability(service=_SERVICE(type=_SERVICE.VOLUME_ACCESSIBILITY_CONSTRAINTS)),
                # Volumes grow while published: LVs and loop devices grow under a mounted file system.
                csi.PluginCapability(volume_expansion=_EXPANSION(type=_EXPANSION.ONLINE)),
            ]
        )

    def Probe(self, request, context):
        self.core.probe()  # BackendUnavailable -> FAILED_PRECONDITION with the reason
        return csi.ProbeResponse(ready=BoolValue(value=True))
