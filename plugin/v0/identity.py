"""CSI v0 Identity service."""

from __future__ import annotations

from google.protobuf.wrappers_pb2 import BoolValue

from plugin.core import Core
from protos.v0 import csi_pb2 as csi
from protos.v0 import csi_pb2_grpc

_SERVICE = csi.PluginCapability.Service


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
                csi.PluginCapability(service=_SERVICE(type=_SERVICE.ACCESSIBILITY_CONSTRAINTS)),
            ]
        )

    def Probe(self, request, context):
        self.core.probe()  # BackendUnavailable -> FAILED_PRECONDITION with the reason
        return csi.ProbeResponse(ready=BoolValue(value=True))
