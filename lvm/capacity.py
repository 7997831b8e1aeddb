"""Capacity and placement arithmetic over free extents: pure functions, no I/O.

csilvm chooses the physical volumes of every new LV itself and passes them to
``lvcreate``, so what GetCapacity reports is exactly what CreateVolume can do:
a volume of ``maximum_volume_size`` is placed by :func:`placement`, one
granule more is not.

Inputs are the free extent counts of the allocatable PVs (``{pv: extents}``)
and the extent size in bytes.  Layout rules:

* linear: any PVs; one extent granularity.
* raid0 with ``s`` stripes: ``s`` distinct PVs, ``n/s`` extents on each; the
  size is a multiple of ``s`` extents.  ``stripes=None`` means every PV with
  a free extent (at least two).
* raid1 with ``m`` mirrors: ``m+1`` legs on distinct PVs, each leg holding the
  ``n`` data extents and ``r(n)`` metadata extents (``_rmeta``) on one PV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from lvm.backend import Capacity
from lvm.errors import OutOfRange
from lvm.profiles import Layout, Profile
from lvm.units import MiB, format_size

DEFAULT_REGION_SIZE = 2 * MiB  # lvm2's default raid region size (lvm.conf activation/raid_region_size)
SECTOR = 512


@dataclass(frozen=True)
class Placement:
    """What to ask lvcreate for: ``-l extents`` on exactly these PVs."""

    extents: int  # logical extents of the LV (the data of one raid1 leg)
    pvs: tuple[str, ...]
    stripes: int | None = None  # raid0 ``-i``
    mirrors: int | None = None  # raid1 ``-m``
    metadata_extents: int = 0  # raid1: rmeta extents on each leg's PV


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def rmeta_extents(data_extents: int, extent_size: int, region_size: int = DEFAULT_REGION_SIZE) -> int:
    """Extents of one raid ``_rmeta`` sub-LV, as lvm2 computes them.

    lib/metadata/raid_manip.c ``_raid_rmeta_extents``: the raid superblock and
    the write-intent bitmap (one bit per region) rounded up to whole extents.
    """
    extent_sectors = extent_size // SECTOR
    regions = data_extents * extent_size // region_size
    metadata_bytes = 2 * 4096 + _ceil_div(regions, 8)
    sectors = _ceil_div(metadata_bytes, SECTOR)
    return _ceil_div(sectors, extent_sectors)


def _by_free(free: Mapping[str, int]) -> list[tuple[str, int]]:
    """PVs with free extents, largest first (ties by name, so placement is deterministic)."""
    return sorted(((pv, n) for pv, n in free.items() if n > 0), key=lambda item: (-item[1], item[0]))


def stripe_count(profile: Profile, free: Mapping[str, int]) -> int | None:
    """The raid0 stripe count for ``profile`` on these PVs; None when it cannot be placed."""
    candidates = len(_by_free(free))
    stripes = profile.stripes if profile.stripes is not None else candidates
    if stripes < 2 or candidates < stripes:
        return None
    return stripes


def granularity_extents(profile: Profile, free: Mapping[str, int]) -> int | None:
    """Volume sizes of ``profile`` are multiples of this many extents; None when unplaceable."""
    if profile.layout is Layout.RAID0:
        return stripe_count(profile, free)
    if profile.layout is Layout.RAID1 and len(_by_free(free)) < profile.mirrors + 1:
        return None
    return 1


def _largest_raid1_data(leg_extents: int, extent_size: int, region_size: int) -> int:
    """The largest ``n`` with ``n + r(n) <= leg_extents`` (0 when none); r is non-decreasing."""
    low, high = 0, leg_extents
    while low < high:
        mid = (low + high + 1) // 2
        if mid + rmeta_extents(mid, extent_size, region_size) <= leg_extents:
            low = mid
        else:
            high = mid - 1
    return low


def _packing_bound(frees: list[int], k: int) -> int:
    """The most groups of ``k`` extents on ``k`` distinct PVs that these PVs hold together.

    The classic bound: after setting aside the ``j`` largest PVs (each can give
    at most one extent per group), the rest must supply ``k - j`` extents per
    group.  It is attained, so it is the exact total for divisible volumes.
    """
    ordered = sorted(frees, reverse=True)
    if len(ordered) < k:
        return 0
    return min(sum(ordered[j:]) // (k - j) for j in range(k))


def max_volume_extents(
    profile: Profile, free: Mapping[str, int], extent_size: int, region_size: int = DEFAULT_REGION_SIZE
) -> int:
    """Logical extents of the largest single volume of ``profile`` (0 when none fits)."""
    ordered = [n for _, n in _by_free(free)]
    if profile.layout is Layout.LINEAR:
        return sum(ordered)
    if profile.layout is Layout.RAID0:
        stripes = stripe_count(profile, free)
        return 0 if stripes is None else stripes * ordered[stripes - 1]
    legs = profile.mirrors + 1
    if len(ordered) < legs:
        return 0
    return _largest_raid1_data(ordered[legs - 1], extent_size, region_size)


def available_extents(
    profile: Profile, free: Mapping[str, int], extent_size: int, region_size: int = DEFAULT_REGION_SIZE
) -> int:
    """Logical extents that volumes of ``profile`` can take in total; never below the maximum.

    * linear: every free extent.
    * raid0, ``s`` stripes: ``s`` x the packing bound for groups of ``s``.
    * raid0, ``stripes=None``: each volume stripes over every PV with room, so
      PVs fill in layers until one is left: all free extents but the excess of
      the largest PV over the second largest.
    * raid1, ``m`` mirrors: the packing bound for groups of ``m+1`` legs gives
      the leg extents; the rmeta of one volume is subtracted (each further
      volume costs ``r`` more extents per leg, which depends on how the CO
      splits the space, so it is not counted).
    """
    ordered = [n for _, n in _by_free(free)]
    maximum = max_volume_extents(profile, free, extent_size, region_size)
    if maximum == 0:
        return 0
    if profile.layout is Layout.LINEAR:
        total = sum(ordered)
    elif profile.layout is Layout.RAID0 and profile.stripes is None:
        total = sum(ordered) - (ordered[0] - ordered[1])
    elif profile.layout is Layout.RAID0:
        total = profile.stripes * _packing_bound(ordered, profile.stripes)
    else:
        leg_extents = _packing_bound(ordered, profile.mirrors + 1)
        total = _largest_raid1_data(leg_extents, extent_size, region_size)
    return max(total, maximum)


def capacity(
    free: Mapping[str, int], extent_size: int, profile: Profile, region_size: int = DEFAULT_REGION_SIZE
) -> Capacity:
    """GetCapacity for ``profile``; Capacity(0, 0, 0) when not even the smallest volume fits."""
    granularity = granularity_extents(profile, free)
    maximum = max_volume_extents(profile, free, extent_size, region_size)
    if granularity is None or maximum < granularity:
        return Capacity.none()
    return Capacity(
        available=available_extents(profile, free, extent_size, region_size) * extent_size,
        maximum_volume_size=maximum * extent_size,
        minimum_volume_size=granularity * extent_size,
    )


def describe(profile: Profile) -> str:
    """``type=raid1 mirrors=1``: how an operator wrote the profile."""
    return " ".join(f"{k}={v}" for k, v in profile.as_parameters().items())


def placement(
    free: Mapping[str, int],
    extent_size: int,
    profile: Profile,
    size: int,
    region_size: int = DEFAULT_REGION_SIZE,
) -> Placement:
    """Where a volume of ``size`` bytes goes; OutOfRange (saying what fits) when nowhere.

    ``size`` must be a multiple of the profile's granularity (ValueError otherwise).
    """
    granularity = granularity_extents(profile, free)
    if granularity is None:
        raise OutOfRange(
            f"a {describe(profile)} volume needs {profile.min_devices} physical volumes with free space, "
            f"only {len(_by_free(free))} have any"
        )
    if size <= 0 or size % (granularity * extent_size):
        raise ValueError(f"size {size} is not a positive multiple of {granularity} extents of {extent_size} bytes")
    extents = size // extent_size
    ordered = _by_free(free)
    chosen: list[str] = []
    if profile.layout is Layout.LINEAR:
        covered = 0
        for pv, n in ordered:
            if covered >= extents:
                break
            chosen.append(pv)
            covered += n
        if covered >= extents:
            return Placement(extents, tuple(chosen))
    elif profile.layout is Layout.RAID0:
        per_stripe = extents // granularity
        chosen = [pv for pv, n in ordered if n >= per_stripe][:granularity]
        if len(chosen) == granularity:
            return Placement(extents, tuple(chosen), stripes=granularity)
    else:
        metadata = rmeta_extents(extents, extent_size, region_size)
        legs = profile.mirrors + 1
        chosen = [pv for pv, n in ordered if n >= extents + metadata][:legs]
        if len(chosen) == legs:
            return Placement(extents, tuple(chosen), mirrors=profile.mirrors, metadata_extents=metadata)
    largest = max_volume_extents(profile, free, extent_size, region_size) * extent_size
    raise OutOfRange(
        f"{format_size(size)} does not fit a {describe(profile)} volume: the largest that fits now is "
        f"{format_size(largest)} ({largest} bytes; free extents per PV: "
        f"{', '.join(f'{pv}={n}' for pv, n in sorted(free.items())) or 'none'})"
    )


# --- growing and re-laying out an existing LV ---------------------------------------------------
#
# ``legs`` are the PVs of each leg of the LV as the report shows them (a raid
# image with its rmeta, a stripe, or the whole of a linear LV).  Each leg of a
# raid0 or raid1 LV grows on its own PVs, so the stripes and mirrors stay on
# distinct devices; a linear LV grows anywhere.


def _leg_free(leg: tuple[str, ...], free: Mapping[str, int]) -> int:
    return sum(free.get(pv, 0) for pv in leg)


def max_extension_extents(
    profile: Profile,
    legs: tuple[tuple[str, ...], ...],
    free: Mapping[str, int],
    current_extents: int,
    extent_size: int,
    region_size: int = DEFAULT_REGION_SIZE,
) -> int:
    """The most logical extents an LV of ``profile`` on ``legs`` can grow by, now."""
    if profile.layout is Layout.LINEAR:
        return sum(n for _, n in _by_free(free))
    room = min((_leg_free(leg, free) for leg in legs), default=0)
    if profile.layout is Layout.RAID0:
        return room * len(legs)
    current_meta = rmeta_extents(current_extents, extent_size, region_size)
    low, high = 0, room
    while low < high:  # the largest d with d + (r(current + d) - r(current)) <= room
        mid = (low + high + 1) // 2
        if mid + rmeta_extents(current_extents + mid, extent_size, region_size) - current_meta <= room:
            low = mid
        else:
            high = mid - 1
    return low


def extension_pvs(
    profile: Profile,
    legs: tuple[tuple[str, ...], ...],
    free: Mapping[str, int],
    current_extents: int,
    new_extents: int,
    extent_size: int,
    region_size: int = DEFAULT_REGION_SIZE,
) -> tuple[str, ...]:
    """The PVs to pass ``lvextend`` to grow the LV to ``new_extents``; OutOfRange (saying what fits) when
    it does not fit."""
    delta = new_extents - current_extents
    largest = max_extension_extents(profile, legs, free, current_extents, extent_size, region_size)
    if delta > largest:
        grow_to = (current_extents + largest) * extent_size
        where = "anywhere in the volume group" if profile.layout is Layout.LINEAR else "on the physical volumes of its legs"
        raise OutOfRange(
            f"growing a {describe(profile)} volume from {format_size(current_extents * extent_size)} to "
            f"{format_size(new_extents * extent_size)} does not fit: it can grow to {format_size(grow_to)} "
            f"({grow_to} bytes) now, {where} (free extents per PV: "
            f"{', '.join(f'{pv}={n}' for pv, n in sorted(free.items())) or 'none'})"
        )
    if profile.layout is Layout.LINEAR:
        chosen, covered = [], 0
        for pv, n in _by_free(free):
            if covered >= delta:
                break
            chosen.append(pv)
            covered += n
        return tuple(chosen)
    return tuple(dict.fromkeys(pv for leg in legs for pv in leg if free.get(pv, 0) > 0))


def mirror_change_pvs(
    legs: tuple[tuple[str, ...], ...],
    free: Mapping[str, int],
    extents: int,
    mirrors: int,
    extent_size: int,
    region_size: int = DEFAULT_REGION_SIZE,
    *,
    has_metadata: bool,
) -> tuple[str, ...]:
    """The PVs to pass ``lvconvert -m mirrors`` for a linear or raid1 LV of ``extents`` on ``legs``.

    New legs need distinct PVs that hold no part of the LV, each with room
    for the data and one rmeta; a linear LV (``has_metadata`` False) also
    needs room for the rmeta of its existing leg on that leg's PVs.  Removing
    legs needs nothing.  OutOfRange, saying why, when it does not fit.
    """
    new_legs = mirrors + 1 - len(legs)
    if new_legs <= 0:
        return ()
    meta = rmeta_extents(extents, extent_size, region_size)
    used = {pv for leg in legs for pv in leg}
    candidates = [pv for pv, n in _by_free(free) if pv not in used and n >= extents + meta]
    if len(candidates) < new_legs:
        raise OutOfRange(
            f"{mirrors} mirror(s) need {new_legs} more physical volume(s), each with {extents + meta} free extents "
            f"and holding no part of the volume; {len(candidates)} qualify "
            f"(free extents per PV: {', '.join(f'{pv}={n}' for pv, n in sorted(free.items())) or 'none'})"
        )
    chosen = candidates[:new_legs]
    if not has_metadata:
        (leg,) = legs
        if _leg_free(leg, free) < meta:
            raise OutOfRange(
                f"converting to raid1 needs {meta} free extent(s) for the raid metadata on the volume's own "
                f"physical volume(s) {', '.join(leg)}, which are full"
            )
        chosen = [*leg, *chosen]
    return tuple(dict.fromkeys(chosen))
