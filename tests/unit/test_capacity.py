"""The capacity model: exact maxima, placements on distinct PVs, and lvm2's rmeta formula."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lvm.backend import Capacity
from lvm.capacity import (
    DEFAULT_REGION_SIZE,
    available_extents,
    capacity,
    granularity_extents,
    max_volume_extents,
    placement,
    rmeta_extents,
)
from lvm.errors import OutOfRange
from lvm.profiles import Layout, Profile
from lvm.units import GiB, KiB, MiB, TiB

EXTENT = MiB
LINEAR = Profile()
RAID0_ALL = Profile(Layout.RAID0)
RAID0_2 = Profile(Layout.RAID0, stripes=2)
RAID0_3 = Profile(Layout.RAID0, stripes=3)
RAID1_1 = Profile(Layout.RAID1, mirrors=1)
RAID1_2 = Profile(Layout.RAID1, mirrors=2)
ALL_PROFILES = [LINEAR, RAID0_ALL, RAID0_2, RAID0_3, RAID1_1, RAID1_2]


# -- lvm2's rmeta formula ------------------------------------------------------


@pytest.mark.parametrize(
    ("data_extents", "extent_size", "region_size", "expected"),
    [
        (1, MiB, 2 * MiB, 1),  # 8 KiB of superblocks fit one extent
        (1_000_000, MiB, 2 * MiB, 1),  # ~1 TiB: 500000 regions, 62500 bitmap bytes
        # 1 MiB = 2048 sectors: 8 KiB + 8323072 regions / 8 bytes fill it exactly.
        (2 * 8_323_072, MiB, 2 * MiB, 1),
        (2 * 8_323_072 + 2, MiB, 2 * MiB, 2),
        (100, 4 * KiB, 2 * MiB, 2),  # 4 KiB extents: the 8 KiB of superblocks alone take two
        (10, 4 * MiB, 512 * KiB, 1),
    ],
)
def test_rmeta_extents_follows_lvm2(data_extents, extent_size, region_size, expected):
    assert rmeta_extents(data_extents, extent_size, region_size) == expected


def test_rmeta_grows_with_a_smaller_region_size():
    # 16 TiB in 4 KiB regions: 2^32 regions -> 512 MiB of bitmap.
    extents = 16 * TiB // MiB
    assert rmeta_extents(extents, MiB, 4 * KiB) == 513
    assert rmeta_extents(extents, MiB, DEFAULT_REGION_SIZE) == 2


# -- examples ------------------------------------------------------------------


def test_linear_sums_every_pv():
    cap = capacity({"a": 63, "b": 99, "c": 39}, EXTENT, LINEAR)
    assert cap == Capacity(available=201 * MiB, maximum_volume_size=201 * MiB, minimum_volume_size=MiB)


def test_linear_placement_uses_largest_pvs_first_and_only_as_many_as_needed():
    free = {"a": 63, "b": 99, "c": 39}
    assert placement(free, EXTENT, LINEAR, 50 * MiB).pvs == ("b",)
    assert placement(free, EXTENT, LINEAR, 150 * MiB).pvs == ("b", "a")
    assert placement(free, EXTENT, LINEAR, 201 * MiB).pvs == ("b", "a", "c")
    with pytest.raises(OutOfRange, match="largest that fits now is 201MiB"):
        placement(free, EXTENT, LINEAR, 202 * MiB)


def test_raid0_with_explicit_stripes():
    free = {"a": 63, "b": 99, "c": 39}
    cap = capacity(free, EXTENT, RAID0_2)
    assert cap.maximum_volume_size == 2 * 63 * MiB  # the 2nd largest PV bounds each stripe
    assert cap.minimum_volume_size == 2 * MiB
    # groups of 2 over (99, 63, 39): min(201 // 2, 102 // 1) = 100 pairs
    assert cap.available == 200 * MiB
    where = placement(free, EXTENT, RAID0_2, 126 * MiB)
    assert where.pvs == ("b", "a") and where.stripes == 2 and where.extents == 126
    with pytest.raises(OutOfRange):
        placement(free, EXTENT, RAID0_2, 128 * MiB)


def test_raid0_three_stripes_bounded_by_smallest():
    cap = capacity({"a": 63, "b": 99, "c": 39}, EXTENT, RAID0_3)
    assert cap == Capacity(available=3 * 39 * MiB, maximum_volume_size=3 * 39 * MiB, minimum_volume_size=3 * MiB)


def test_raid0_all_pvs_layers():
    free = {"a": 63, "b": 99, "c": 39, "d": 0}
    cap = capacity(free, EXTENT, RAID0_ALL)
    assert granularity_extents(RAID0_ALL, free) == 3  # d has no room, so it is not a stripe
    assert cap.maximum_volume_size == 3 * 39 * MiB
    # 3 x 39, then 2 x 24 (a and b), then b's 36 extents are alone: 117 + 48
    assert cap.available == (117 + 48) * MiB
    assert placement(free, EXTENT, RAID0_ALL, 117 * MiB).pvs == ("b", "a", "c")


def test_raid0_size_must_be_a_multiple_of_the_stripes():
    with pytest.raises(ValueError):
        placement({"a": 10, "b": 10}, EXTENT, RAID0_2, 3 * MiB)


def test_raid1_reserves_rmeta_on_each_leg():
    free = {"a": 63, "b": 99, "c": 39}
    cap = capacity(free, EXTENT, RAID1_1)
    assert cap.maximum_volume_size == 62 * MiB  # 63 on the 2nd largest PV, minus one rmeta extent
    assert cap.minimum_volume_size == MiB
    # legs: min(201 // 2, 102) = 100 extents, one volume's rmeta off
    assert cap.available == 99 * MiB
    where = placement(free, EXTENT, RAID1_1, 62 * MiB)
    assert where.pvs == ("b", "a") and where.mirrors == 1 and where.metadata_extents == 1
    with pytest.raises(OutOfRange):
        placement(free, EXTENT, RAID1_1, 63 * MiB)


def test_raid1_two_mirrors():
    cap = capacity({"a": 63, "b": 99, "c": 39}, EXTENT, RAID1_2)
    assert cap == Capacity(available=38 * MiB, maximum_volume_size=38 * MiB, minimum_volume_size=MiB)


@pytest.mark.parametrize(
    ("free", "profile"),
    [
        ({"a": 100}, RAID0_2),
        ({"a": 100}, RAID0_ALL),
        ({"a": 100, "b": 0}, RAID1_1),
        ({"a": 100, "b": 100}, RAID0_3),
        ({"a": 100, "b": 100}, RAID1_2),
        ({"a": 100, "b": 1}, RAID1_1),  # one extent leaves no room for data next to rmeta
        ({}, LINEAR),
        ({"a": 0}, LINEAR),
    ],
)
def test_unplaceable_profile_has_no_capacity(free, profile):
    assert capacity(free, EXTENT, profile) == Capacity.none()
    with pytest.raises(OutOfRange):
        placement(free, EXTENT, profile, 2 * 3 * EXTENT)


def test_too_few_pvs_message_says_how_many_are_needed():
    with pytest.raises(OutOfRange, match="needs 3 physical volumes"):
        placement({"a": 5, "b": 5}, EXTENT, RAID1_2, MiB)


def test_large_extents():
    free = {"a": 1000, "b": 1000}
    cap = capacity(free, 4 * MiB, RAID1_1)
    assert cap.maximum_volume_size == 999 * 4 * MiB
    assert capacity(free, 4 * MiB, LINEAR).maximum_volume_size == 2000 * 4 * MiB


# -- properties ------------------------------------------------------------------

free_maps = st.dictionaries(
    st.sampled_from([f"/dev/pv{i}" for i in range(7)]), st.integers(min_value=0, max_value=5000), max_size=7
)
profiles = st.sampled_from(ALL_PROFILES + [Profile(Layout.RAID0, stripes=4), Profile(Layout.RAID1, mirrors=3)])
extent_sizes = st.sampled_from([4 * KiB, 64 * KiB, MiB, 4 * MiB])
region_sizes = st.sampled_from([64 * KiB, 512 * KiB, 2 * MiB])


def _granule(profile, free, extent_size):
    return granularity_extents(profile, free) * extent_size


@settings(max_examples=300, deadline=None)
@given(free=free_maps, profile=profiles, extent_size=extent_sizes, region_size=region_sizes)
def test_maximum_is_placeable_and_one_granule_more_is_not(free, profile, extent_size, region_size):
    cap = capacity(free, extent_size, profile, region_size)
    assume(cap.maximum_volume_size > 0)
    where = placement(free, extent_size, profile, cap.maximum_volume_size, region_size)
    assert len(set(where.pvs)) == len(where.pvs), "PVs must be distinct"
    assert where.extents * extent_size == cap.maximum_volume_size
    if profile.layout is Layout.LINEAR:
        assert sum(free[pv] for pv in where.pvs) >= where.extents
    elif profile.layout is Layout.RAID0:
        assert len(where.pvs) == where.stripes == granularity_extents(profile, free)
        assert all(free[pv] >= where.extents // where.stripes for pv in where.pvs)
    else:
        assert len(where.pvs) == profile.mirrors + 1
        assert where.metadata_extents == rmeta_extents(where.extents, extent_size, region_size)
        assert all(free[pv] >= where.extents + where.metadata_extents for pv in where.pvs)
    with pytest.raises(OutOfRange):
        placement(free, extent_size, profile, cap.maximum_volume_size + _granule(profile, free, extent_size), region_size)


@settings(max_examples=300, deadline=None)
@given(free=free_maps, profile=profiles, extent_size=extent_sizes)
def test_every_granule_up_to_the_maximum_is_placeable(free, profile, extent_size):
    cap = capacity(free, extent_size, profile)
    assume(cap.maximum_volume_size > 0)
    granule = _granule(profile, free, extent_size)
    assert cap.minimum_volume_size == granule
    assert cap.maximum_volume_size % granule == 0
    for size in {granule, cap.maximum_volume_size // granule // 2 * granule or granule, cap.maximum_volume_size}:
        placement(free, extent_size, profile, size)


@settings(max_examples=300, deadline=None)
@given(free=free_maps, profile=profiles, extent_size=extent_sizes)
def test_available_is_never_below_maximum_nor_above_free_space(free, profile, extent_size):
    cap = capacity(free, extent_size, profile)
    assert cap.available >= cap.maximum_volume_size >= cap.minimum_volume_size >= 0
    assert cap.available <= sum(free.values()) * extent_size
    if profile.layout is Layout.RAID1 and cap.available:
        assert cap.available * (profile.mirrors + 1) <= sum(free.values()) * extent_size


@settings(max_examples=300, deadline=None)
@given(free=free_maps, profile=profiles, pv=st.sampled_from([f"/dev/pv{i}" for i in range(7)]),
       extra=st.integers(min_value=1, max_value=500))
def test_more_free_space_never_lowers_capacity(free, profile, pv, extra):
    grown = dict(free)
    grown[pv] = grown.get(pv, 0) + extra
    before, after = capacity(free, MiB, profile), capacity(grown, MiB, profile)
    if profile.layout is Layout.RAID0 and profile.stripes is None:
        # "every PV with room" may gain a stripe, which changes the layout itself.
        assume(granularity_extents(profile, free) == granularity_extents(profile, grown))
    assert after.maximum_volume_size >= before.maximum_volume_size
    assert after.available >= before.available


@settings(max_examples=200, deadline=None)
@given(free=free_maps, profile=profiles, extent_size=extent_sizes)
def test_available_volumes_can_be_packed_greedily_for_linear_and_raid0(free, profile, extent_size):
    """Creating maximum-size volumes one after another takes exactly ``available`` (raid0/linear)."""
    assume(profile.layout is not Layout.RAID1)
    promised = available_extents(profile, free, extent_size)
    remaining, taken = dict(free), 0
    for _ in range(100):
        n = max_volume_extents(profile, remaining, extent_size)
        if n == 0 or granularity_extents(profile, remaining) is None:
            break
        where = placement(remaining, extent_size, profile, n * extent_size)
        per_pv = n if profile.layout is Layout.LINEAR else n // where.stripes
        for pv in where.pvs:
            use = min(per_pv, remaining[pv]) if profile.layout is Layout.LINEAR else per_pv
            remaining[pv] -= use
            if profile.layout is Layout.LINEAR:
                per_pv -= use
        taken += n
    if profile.layout is Layout.LINEAR or profile.stripes is None:
        assert taken == promised
    else:
        assert taken <= promised


def test_max_volume_extents_example_for_docs():
    assert max_volume_extents(RAID1_1, {"a": 10 * GiB // MiB, "b": 10 * GiB // MiB}, MiB) == 10 * 1024 - 1
