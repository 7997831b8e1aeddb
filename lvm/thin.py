"""Thin provisioning arithmetic: how much virtual size a thin pool still admits.  Pure functions.

A thin pool of ``P`` bytes of data space, ``U`` of them written, whose thin
volumes (and thin snapshots) have ``V`` bytes of virtual size, admits under an
overprovisioning ratio ``r``

    min(r * P - V,  r * (P - U))

more bytes of virtual size: the ratio bounds the total promised, and the
second term keeps that bound honest as real data fills the pool (a ratio
that looks at virtual sizes only keeps promising space a nearly full pool
does not have).  Above the high-water mark (data or metadata fill at or over
``full_percent``) a pool admits nothing: no new volumes, no new snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass

from lvm.errors import InvalidParameters
from lvm.units import parse_size


@dataclass(frozen=True)
class PoolSize:
    """How large a pool csilvm creates: bytes, or a percentage of the volume group."""

    bytes: int = 0
    percent_of_vg: float = 0.0

    @classmethod
    def parse(cls, text: str) -> PoolSize:
        text = text.strip()
        if text.endswith("%"):
            try:
                percent = float(text[:-1])
            except ValueError:
                raise InvalidParameters(f"thin pool size {text!r} is not a percentage") from None
            if not 0 < percent <= 100:
                raise InvalidParameters(f"thin pool size {text!r} must be above 0% and at most 100%")
            return cls(percent_of_vg=percent)
        size = parse_size(text)
        if size <= 0:
            raise InvalidParameters(f"thin pool size {text!r} must be positive")
        return cls(bytes=size)

    def resolve(self, vg_size: int) -> int:
        """Bytes, for a volume group of ``vg_size`` bytes."""
        return self.bytes or int(vg_size * self.percent_of_vg / 100)

    def __str__(self) -> str:
        return f"{self.percent_of_vg:g}%" if self.percent_of_vg else str(self.bytes)


@dataclass(frozen=True)
class ThinPolicy:
    """The operator's thin provisioning settings (``--thin-*`` flags)."""

    overprovision_ratio: float = 1.0
    full_percent: float = 95.0
    pool_size: PoolSize | None = None  # None: csilvm creates no pool, only adopts existing ones

    def __post_init__(self) -> None:
        if self.overprovision_ratio < 1.0:
            raise InvalidParameters(f"thin overprovision ratio {self.overprovision_ratio} must be at least 1.0")
        if not 0 < self.full_percent <= 100:
            raise InvalidParameters(f"thin pool full percent {self.full_percent} must be above 0 and at most 100")


def admissible(pool_size: int, data_used: int, virtual_allocated: int, ratio: float) -> int:
    """Bytes of virtual size the pool still admits (before the high-water mark and granularity)."""
    by_promise = int(ratio * pool_size) - virtual_allocated
    by_data = int(ratio * (pool_size - data_used))
    return max(0, min(by_promise, by_data))


def above_high_water(data_percent: float, metadata_percent: float, full_percent: float) -> bool:
    return data_percent >= full_percent or metadata_percent >= full_percent


def fill_message(pool: str, data_percent: float, metadata_percent: float, full_percent: float) -> str:
    """Why a pool refuses new volumes and snapshots, and what the operator can do."""
    return (
        f"thin pool {pool} is {data_percent:.2f}% full of data and {metadata_percent:.2f}% of metadata, "
        f"at or above the high-water mark of {full_percent:g}%: it takes no new volumes or snapshots. "
        f"Free space (delete volumes or snapshots, fstrim mounted file systems) or grow the pool"
    )
