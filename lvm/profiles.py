"""Storage profiles: the ``parameters`` of CreateVolume and GetCapacity, parsed into a value.

A profile says how a volume is laid out on the physical volumes:
``type=linear`` (default), ``type=raid0`` with ``stripes`` and ``stripesize``,
``type=raid1`` with ``mirrors``, ``type=thin`` in the thin pool ``pool``.  Mesos disk profiles and Kubernetes
StorageClasses send these keys.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

from lvm.errors import InvalidParameters
from lvm.names import is_valid_lv_name
from lvm.units import parse_size

# Keys the CO adds on its own (external-provisioner --extra-create-metadata,
# fsType hints); they are not ours to judge.
IGNORED_PREFIXES = ("csi.storage.k8s.io/",)


class Layout(str, enum.Enum):
    LINEAR = "linear"
    RAID0 = "raid0"
    RAID1 = "raid1"
    THIN = "thin"


DEFAULT_THIN_POOL = "csilvm-thinpool"


@dataclass(frozen=True)
class Profile:
    """A volume layout.  ``stripes=None`` on raid0 means "every PV with room"; ``pool`` names a thin one's pool."""

    layout: Layout = Layout.LINEAR
    stripes: int | None = None
    stripe_size: int | None = None
    mirrors: int = 0
    pool: str | None = None

    @property
    def thin(self) -> bool:
        return self.layout is Layout.THIN

    @property
    def thin_pool(self) -> str:
        """The pool a thin volume of this profile lives in."""
        return self.pool or DEFAULT_THIN_POOL

    @property
    def min_devices(self) -> int:
        """Distinct physical volumes a volume of this profile needs."""
        if self.layout is Layout.RAID1:
            return self.mirrors + 1
        if self.layout is Layout.RAID0:
            return self.stripes or 2
        return 1

    def as_parameters(self) -> dict[str, str]:
        """The canonical parameters that describe this profile (for volume contexts)."""
        params = {"type": self.layout.value}
        if self.layout is Layout.RAID0:
            if self.stripes is not None:
                params["stripes"] = str(self.stripes)
            if self.stripe_size is not None:
                params["stripesize"] = str(self.stripe_size)
        if self.layout is Layout.RAID1:
            params["mirrors"] = str(self.mirrors)
        if self.layout is Layout.THIN:
            params["pool"] = self.thin_pool
        return params


LINEAR = Profile()

_ALLOWED_KEYS = {
    Layout.LINEAR: {"type"},
    Layout.RAID0: {"type", "stripes", "stripesize"},
    Layout.RAID1: {"type", "mirrors"},
    Layout.THIN: {"type", "pool"},
}


def _positive_int(key: str, text: str, *, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidParameters(f"parameter {key}={text!r} is not a whole number") from None
    if value < minimum:
        raise InvalidParameters(f"parameter {key}={value} must be at least {minimum}")
    return value


def parse_profile(parameters: Mapping[str, str]) -> Profile:
    """Parse CSI ``parameters`` into a :class:`Profile`; unknown keys are InvalidParameters."""
    params = {k: v for k, v in parameters.items() if not k.startswith(IGNORED_PREFIXES)}
    type_text = params.get("type", Layout.LINEAR.value)
    try:
        layout = Layout(type_text.lower())
    except ValueError:
        raise InvalidParameters(f"unknown volume type {type_text!r}: use linear, raid0, raid1 or thin") from None
    unknown = sorted(set(params) - _ALLOWED_KEYS[layout])
    if unknown:
        raise InvalidParameters(
            f"unknown parameter(s) {', '.join(unknown)} for type={layout.value}; "
            f"allowed: {', '.join(sorted(_ALLOWED_KEYS[layout]))}"
        )
    if layout is Layout.RAID0:
        stripes = _positive_int("stripes", params["stripes"], minimum=2) if "stripes" in params else None
        stripe_size = None
        if "stripesize" in params:
            stripe_size = parse_size(params["stripesize"])
            if stripe_size < 4096 or stripe_size & (stripe_size - 1):
                raise InvalidParameters(f"stripesize {params['stripesize']!r} must be a power of two of at least 4KiB")
        return Profile(Layout.RAID0, stripes=stripes, stripe_size=stripe_size)
    if layout is Layout.RAID1:
        mirrors = _positive_int("mirrors", params["mirrors"], minimum=1) if "mirrors" in params else 1
        return Profile(Layout.RAID1, mirrors=mirrors)
    if layout is Layout.THIN:
        pool = params.get("pool", DEFAULT_THIN_POOL)
        if not is_valid_lv_name(pool):
            raise InvalidParameters(f"pool={pool!r} is not a valid logical volume name")
        return Profile(Layout.THIN, pool=pool)
    return LINEAR
