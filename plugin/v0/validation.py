"""Request validation for CSI v0, registered under ``/csi.v0.<Service>/<Method>``.

The v0 requests that csilvm checks have the v1 shapes and field names
(``name``, ``volume_capabilities``, ``capacity_range``,
``volume_content_source``, ``volume_id``, ``staging_target_path``,
``target_path``, ``volume_capability``, ``max_entries``), so the v1 validators
serve them as they are; tests/e2e/test_v0.py proves each one over the wire.
"""

from __future__ import annotations

from typing import Callable, Iterable

from plugin import validation as v1

Validator = Callable[[object], None]

# (service, method) whose v1 validator applies unchanged to the v0 request.
SHARED_WITH_V1 = (
    ("Controller", "DeleteVolume"),
    ("Controller", "ValidateVolumeCapabilities"),
    ("Controller", "ListVolumes"),
    ("Controller", "CreateSnapshot"),
    ("Controller", "DeleteSnapshot"),
    ("Controller", "ListSnapshots"),
    ("Node", "NodeStageVolume"),
    ("Node", "NodeUnstageVolume"),
    ("Node", "NodePublishVolume"),
    ("Node", "NodeUnpublishVolume"),
)


def rekeyed(package: str, methods: Iterable[tuple[str, str]]) -> dict[str, Validator]:
    """The v1 validators of ``methods``, keyed by their full names in ``package``."""
    return {f"/{package}.{s}/{m}": v1.VALIDATORS[f"/csi.v1.{s}/{m}"] for s, m in methods}


VALIDATORS: dict[str, Validator] = rekeyed("csi.v0", SHARED_WITH_V1)


def create_volume(req) -> None:
    """v1's checks, but v0.3's content source names its snapshot by ``id``."""
    v1.require(req.name, "name")
    v1._check_capabilities(req.volume_capabilities)
    v1._check_capacity_range(req.capacity_range)
    if req.HasField("volume_content_source"):
        v1.check_content_source(req.volume_content_source, snapshot_id_field="id")


VALIDATORS["/csi.v0.Controller/CreateVolume"] = create_volume
