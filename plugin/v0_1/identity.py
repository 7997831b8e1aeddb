"""CSI 0.1 Identity service."""

from __future__ import annotations

from plugin.core import Core
from plugin.v0_1.translate import SUPPORTED_VERSIONS
from protos.v0_1 import csi_pb2 as csi
from protos.v0_1 import csi_pb2_grpc


class IdentityServicer(csi_pb2_grpc.IdentityServicer):
    def __init__(self, core: Core):
        self.core = core

    def GetSupportedVersions(self, request, context):
        return csi.GetSupportedVersionsResponse(
            supported_versions=[csi.Version(major=a, minor=b, patch=c) for a, b, c in SUPPORTED_VERSIONS]
        )

    def GetPluginInfo(self, request, context):
        return csi.GetPluginInfoResponse(
            name=self.core.settings.name,
            vendor_version=self.core.settings.vendor_version,
            manifest={"backend": self.core.backend.kind},
        )
