"""Request validation for CSI 0.1, registered under ``/csi.<Service>/<Method>``.

Every 0.1 request but GetSupportedVersions carries ``version``: it must be
one that GetSupportedVersions lists, else INVALID_ARGUMENT.  Field checks
reuse plugin/validation.py where the request has the v1 shape.
"""

from __future__ import annotations

from typing import Callable

from plugin import validation as v1
from plugin.errors import RequestInvalid
from plugin.v0.validation import Validator, rekeyed
from plugin.v0_1.translate import SUPPORTED_VERSIONS, version_text
from protos.v0_1 import csi_pb2 as csi

PACKAGE = "csi"


def check_version(request) -> None:
    if not request.HasField("version"):
        raise RequestInvalid("version missing in request: CSI 0.1 requests carry the API version the CO assumes")
    asked = (request.version.major, request.version.minor, request.version.patch)
    if asked not in SUPPORTED_VERSIONS:
        supported = ", ".join(version_text(v) for v in SUPPORTED_VERSIONS)
        raise RequestInvalid(f"CSI version {version_text(asked)} is not supported: this plugin speaks CSI {supported}")


def _capabilities(caps) -> None:
    v1.require(len(caps), "volume_capabilities")
    for i, cap in enumerate(caps):
        v1.check_capability(cap, f"volume_capabilities[{i}]")


def create_volume(req: csi.CreateVolumeRequest) -> None:
    v1.require(req.name, "name")
    _capabilities(req.volume_capabilities)


def node_publish_volume(req: csi.NodePublishVolumeRequest) -> None:
    v1.require(req.volume_id, "volume_id")
    v1.require_path(req.target_path, "target_path")
    v1.require(req.HasField("volume_capability"), "volume_capability")
    v1.check_capability(req.volume_capability)


_FIELD_CHECKS: dict[str, Validator] = {
    f"/{PACKAGE}.Controller/CreateVolume": create_volume,
    f"/{PACKAGE}.Node/NodePublishVolume": node_publish_volume,
    **rekeyed(PACKAGE, [("Controller", "DeleteVolume"), ("Controller", "ValidateVolumeCapabilities"),
                        ("Node", "NodeUnpublishVolume")]),
}


def _with_version(check: Validator | None) -> Validator:
    def validate(request) -> None:
        check_version(request)
        if check is not None:
            check(request)

    return validate


def _build() -> dict[str, Callable[[object], None]]:
    """A validator for every method of the 0.1 services whose request has ``version``."""
    validators = {}
    for service in csi.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            name = f"/{service.full_name}/{method.name}"
            if "version" in method.input_type.fields_by_name:
                validators[name] = _with_version(_FIELD_CHECKS.get(name))
    return validators


VALIDATORS = _build()
