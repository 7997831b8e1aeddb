"""LvmBackend's day two against FakeLvm: expansion, health, a degraded volume group, mirror changes."""

from __future__ import annotations

import pytest

from lvm.backend import Capacity, SizeRange, expansion_target
from lvm.errors import InvalidParameters, OutOfRange, VolumeGroupDegraded, VolumeNotFound
from tests.fake_lvm2 import FakeLvm
from lvm.lvm2 import Lvm2
from lvm.profiles import Layout, Profile
from lvm.units import MiB
from lvm.volume_group import LvmBackend, profile_of

VG = "vg0"
DEVICES = {"/dev/fa": 64 * MiB, "/dev/fb": 100 * MiB, "/dev/fc": 40 * MiB}  # 63, 99, 39 extents
RAID1 = Profile(Layout.RAID1, mirrors=1)


@pytest.fixture
def fake() -> FakeLvm:
    fake = FakeLvm()
    fake.add_volume_group(VG, DEVICES)
    return fake


@pytest.fixture
def backend(fake) -> LvmBackend:
    return LvmBackend(VG, Lvm2(fake), wipe=lambda path: None, raid_supported=lambda: True)


def lv_of(backend: LvmBackend, volume_id: str):
    return backend.lvm2.report(VG).lv(volume_id)


# -- expansion_target ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "current, required, limit, granularity, expected",
    [
        (8 * MiB, 0, 0, MiB, 8 * MiB),  # nothing asked: unchanged
        (8 * MiB, 4 * MiB, 0, MiB, 8 * MiB),  # never shrinks
        (8 * MiB, 8 * MiB + 1, 0, MiB, 9 * MiB),  # rounded up to the granule
        (8 * MiB, 9 * MiB, 10 * MiB, 2 * MiB, 10 * MiB),
    ],
)
def test_expansion_target(current, required, limit, granularity, expected):
    assert expansion_target(current, SizeRange(required, limit), granularity) == expected


def test_expansion_target_out_of_range():
    with pytest.raises(OutOfRange):
        expansion_target(8 * MiB, SizeRange(9 * MiB, 9 * MiB + 5), 2 * MiB)


# -- expansion on LVM --------------------------------------------------------------------------


def test_linear_grows_to_exactly_what_capacity_said_and_not_one_extent_more(backend, fake):
    volume = backend.create_volume("grow", SizeRange(8 * MiB), Profile())
    free = backend.capacity(Profile()).available
    with pytest.raises(OutOfRange) as err:
        backend.expand_volume(volume.id, SizeRange(volume.size + free + MiB))
    assert "can grow to" in str(err.value)
    assert lv_of(backend, volume.id).size == 8 * MiB  # nothing changed
    assert backend.expand_volume(volume.id, SizeRange(volume.size + free)) == volume.size + free
    assert lv_of(backend, volume.id).size == volume.size + free
    assert backend.capacity(Profile()) == Capacity.none()


def test_expansion_is_idempotent_and_never_shrinks(backend, fake):
    volume = backend.create_volume("grow", SizeRange(8 * MiB), Profile())
    assert backend.expand_volume(volume.id, SizeRange(12 * MiB)) == 12 * MiB
    calls = fake.invocations["lvextend"]
    assert backend.expand_volume(volume.id, SizeRange(12 * MiB)) == 12 * MiB
    assert backend.expand_volume(volume.id, SizeRange(4 * MiB)) == 12 * MiB
    assert fake.invocations["lvextend"] == calls


def test_raid0_grows_by_whole_stripes_on_its_own_pvs(backend, fake):
    volume = backend.create_volume("stripes", SizeRange(8 * MiB), Profile(Layout.RAID0, stripes=2))
    before = set(fake.lv_areas(VG, volume.id))
    assert backend.expand_volume(volume.id, SizeRange(9 * MiB)) == 10 * MiB  # a multiple of 2 extents
    assert set(fake.lv_areas(VG, volume.id)) == before
    # Each stripe can grow by the free extents of the smaller of its two PVs, no more.
    lv = lv_of(backend, volume.id)
    room = min(fake.free_extents(VG)[pv] for pv in before)
    with pytest.raises(OutOfRange):
        backend.expand_volume(volume.id, SizeRange(lv.size + (2 * room + 2) * MiB))
    assert backend.expand_volume(volume.id, SizeRange(lv.size + 2 * room * MiB)) == lv.size + 2 * room * MiB


def test_raid1_grows_every_leg_on_its_own_pv(backend, fake):
    volume = backend.create_volume("mirror", SizeRange(8 * MiB), RAID1)
    legs = lv_of(backend, volume.id).legs
    assert len(legs) == 2 and not set(legs[0]) & set(legs[1])
    room = min(fake.free_extents(VG)[leg[0]] for leg in legs)
    with pytest.raises(OutOfRange):
        backend.expand_volume(volume.id, SizeRange(volume.size + (room + 1) * MiB))
    assert backend.expand_volume(volume.id, SizeRange(volume.size + room * MiB)) == volume.size + room * MiB
    assert lv_of(backend, volume.id).legs == legs


def test_expanding_an_unknown_volume_is_not_found(backend):
    with pytest.raises(VolumeNotFound):
        backend.expand_volume("nope", SizeRange(MiB))
    with pytest.raises(VolumeNotFound):
        backend.expand_volume("../etc", SizeRange(MiB))


# -- health ----------------------------------------------------------------------------------


def test_condition_follows_lvm2_health(backend, fake):
    volume = backend.create_volume("mirror", SizeRange(8 * MiB), RAID1)
    assert not backend.volume_condition(volume.id).abnormal
    fake.set_health(VG, volume.id, "r")
    condition = backend.volume_condition(volume.id)
    assert condition.abnormal and "lvchange --refresh" in condition.message
    fake.set_health(VG, volume.id, "m")
    assert "--syncaction repair" in backend.volume_condition(volume.id).message
    fake.set_health(VG, volume.id, "-", sync_percent="42.00")
    condition = backend.volume_condition(volume.id)
    assert condition.abnormal and "42.00% in sync" in condition.message
    fake.set_health(VG, volume.id, "-")
    assert not backend.volume_condition(volume.id).abnormal
    with pytest.raises(VolumeNotFound):
        backend.volume_condition("nope")


def test_a_missing_pv_stops_changes_but_not_probe_or_healthy_volumes(backend, fake):
    healthy = backend.create_volume("healthy", SizeRange(8 * MiB), Profile())
    mirror = backend.create_volume("mirror", SizeRange(8 * MiB), RAID1)
    lost = next(pv for pv in lv_of(backend, mirror.id).pvs if pv not in lv_of(backend, healthy.id).pvs)
    fake.set_missing(lost)
    fake.set_health(VG, mirror.id, "p")
    backend.probe()  # still ready
    for profile in (Profile(), RAID1, Profile(Layout.RAID0, stripes=2)):
        assert backend.capacity(profile) == Capacity.none()
    assert not backend.volume_condition(healthy.id).abnormal
    condition = backend.volume_condition(mirror.id)
    assert condition.abnormal and "partial" in condition.message and "vgreduce --removemissing" in condition.message
    for change in (
        lambda: backend.create_volume("new", SizeRange(MiB), Profile()),
        lambda: backend.expand_volume(healthy.id, SizeRange(16 * MiB)),
        lambda: backend.modify_volume(healthy.id, {"type": "raid1"}),
        lambda: backend.delete_volume(healthy.id),
    ):
        with pytest.raises(VolumeGroupDegraded) as err:
            change()
        assert "missing physical volume" in str(err.value) and "PV UUID" in str(err.value)
    assert fake.invocations["lvcreate"] == 2 and not fake.invocations["lvremove"]


def test_lvm2s_own_refusal_while_a_pv_is_missing_is_classified(fake, backend):
    volume = backend.create_volume("v", SizeRange(8 * MiB), Profile())
    fake.fail_next("lvextend", "  WARNING: Couldn't find device with uuid X.\n  Cannot change VG vg0 while PVs are missing.\n"
                   "  See vgreduce --removemissing and vgextend --restoremissing.\n  Cannot process volume group vg0")
    with pytest.raises(VolumeGroupDegraded):
        backend.expand_volume(volume.id, SizeRange(9 * MiB))


# -- mirror changes (ControllerModifyVolume) ----------------------------------------------------------


def test_linear_to_raid1_and_back(backend, fake):
    volume = backend.create_volume("v", SizeRange(8 * MiB), Profile())
    modified = backend.modify_volume(volume.id, {"type": "raid1", "mirrors": "1"})
    assert modified.profile == RAID1 and modified.size == volume.size
    lv = lv_of(backend, volume.id)
    assert lv.segtype == "raid1" and len(lv.legs) == 2 and "csilvm.profile.type.raid1" in lv.tags
    assert backend.modify_volume(volume.id, {"mirrors": "2"}).profile == Profile(Layout.RAID1, mirrors=2)
    assert len(lv_of(backend, volume.id).legs) == 3
    back = backend.modify_volume(volume.id, {"type": "linear"})
    lv = lv_of(backend, volume.id)
    assert back.profile == Profile() and lv.segtype == "linear"
    assert "csilvm.profile.type.linear" in lv.tags and not any("raid1" in t or "mirrors" in t for t in lv.tags)
    calls = fake.invocations["lvconvert"]
    assert backend.modify_volume(volume.id, {"type": "linear"}).profile == Profile()  # idempotent
    assert fake.invocations["lvconvert"] == calls


def test_modify_refuses_what_cannot_change_in_place(backend, fake):
    striped = backend.create_volume("s", SizeRange(8 * MiB), Profile(Layout.RAID0, stripes=2))
    linear = backend.create_volume("l", SizeRange(8 * MiB), Profile())
    for volume_id, params in ((striped.id, {"stripes": "3"}), (striped.id, {"type": "linear"}),
                              (linear.id, {"type": "raid0"}), (linear.id, {"mirrors": "1"})):
        with pytest.raises(InvalidParameters):
            backend.modify_volume(volume_id, params)
    assert not fake.invocations["lvconvert"]


def test_modify_out_of_range_when_legs_cannot_be_placed(backend, fake):
    volume = backend.create_volume("v", SizeRange(8 * MiB), Profile())
    with pytest.raises(OutOfRange) as err:
        backend.modify_volume(volume.id, {"type": "raid1", "mirrors": "3"})  # 4 legs, 3 PVs
    assert "physical volume" in str(err.value)
    big = backend.create_volume("big", SizeRange(90 * MiB), Profile())  # only /dev/fb holds 90 extents
    with pytest.raises(OutOfRange):
        backend.modify_volume(big.id, {"type": "raid1"})
    assert not fake.invocations["lvconvert"]
    assert lv_of(backend, big.id).segtype == "linear"


def test_layout_wins_over_tags_left_by_an_interrupted_modify(backend, fake):
    volume = backend.create_volume("v", SizeRange(8 * MiB), Profile())
    fake.fail_next("lvchange", "  killed")  # the conversion is done, the tags are not
    with pytest.raises(Exception):
        backend.modify_volume(volume.id, {"type": "raid1"})
    lv = lv_of(backend, volume.id)
    assert lv.segtype == "raid1" and "csilvm.profile.type.linear" in lv.tags
    assert profile_of(lv) == RAID1
    assert backend.modify_volume(volume.id, {"type": "raid1"}).profile == RAID1  # the retry converges
    assert "csilvm.profile.type.raid1" in lv_of(backend, volume.id).tags
