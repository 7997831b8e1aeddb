"""LvmBackend against FakeLvm: idempotency, exact capacity, safe deletes, costs, errors, locking."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lvm import names
from lvm.backend import Capacity, SizeRange
from lvm.capacity import granularity_extents
from lvm.errors import (
    BackendUnavailable,
    CommandFailed,
    CommandNotFound,
    OutOfRange,
    VolumeBusy,
    VolumeExists,
    VolumeNotFound,
)
from tests.fake_lvm2 import FakeLvm
from lvm.lvm2 import NO_UDEV_CONFIG, Lvm2, VolumeGroupNotFound, classify
from lvm.profiles import Layout, Profile
from lvm.units import GiB, MiB
from lvm.volume_group import LvmBackend, profile_from_tags, profile_tags

VG = "vg0"
DEVICES = {"/dev/fa": 64 * MiB, "/dev/fb": 100 * MiB, "/dev/fc": 40 * MiB}  # 63, 99, 39 extents
PROFILES = [
    Profile(),
    Profile(Layout.RAID0),
    Profile(Layout.RAID0, stripes=2),
    Profile(Layout.RAID0, stripes=3, stripe_size=128 * 1024),
    Profile(Layout.RAID1, mirrors=1),
    Profile(Layout.RAID1, mirrors=2),
]
WAIT = 10.0  # seconds a test waits for another thread before calling it a hang


class Wipes(list):
    def __call__(self, path: str) -> None:
        self.append(path)


@pytest.fixture
def fake() -> FakeLvm:
    fake = FakeLvm()
    fake.add_volume_group(VG, DEVICES)
    return fake


@pytest.fixture
def wipes() -> Wipes:
    return Wipes()


@pytest.fixture
def backend(fake, wipes) -> LvmBackend:
    return LvmBackend(VG, Lvm2(fake), default_size=8 * MiB, wipe=wipes, raid_supported=lambda: True)


def calls(fake: FakeLvm) -> dict[str, int]:
    return {k: v for k, v in fake.invocations.items() if v}


# -- create ----------------------------------------------------------------------


def test_create_returns_what_get_volume_reads_back(backend, fake):
    fake.invocations.clear()
    volume = backend.create_volume("pvc-1", SizeRange(required=10 * MiB), Profile())
    assert calls(fake) == {"fullreport": 1, "lvcreate": 1}
    assert (volume.id, volume.size, volume.device, volume.name) == ("pvc-1", 10 * MiB, "/dev/vg0/pvc-1", "pvc-1")
    assert backend.get_volume("pvc-1") == volume


@pytest.mark.parametrize("profile", PROFILES, ids=str)
def test_profile_reads_back_exactly(backend, profile):
    created = backend.create_volume("v", SizeRange(), profile)
    assert created.profile == profile
    assert backend.get_volume("v") == created
    assert profile_from_tags(profile_tags(profile)) == profile


def test_create_is_idempotent(backend, fake):
    first = backend.create_volume("pvc-1", SizeRange(required=10 * MiB), Profile(Layout.RAID1, mirrors=1))
    fake.invocations.clear()
    again = backend.create_volume("pvc-1", SizeRange(required=5 * MiB, limit=20 * MiB), Profile(Layout.RAID1, mirrors=1))
    assert again == first
    assert calls(fake) == {"fullreport": 1}


def test_default_size_and_granularity(backend):
    assert backend.create_volume("a", SizeRange(), Profile()).size == 8 * MiB
    # 3 stripes: 8 MiB rounds up to 9 extents
    assert backend.create_volume("b", SizeRange(), Profile(Layout.RAID0, stripes=3)).size == 9 * MiB
    assert backend.create_volume("c", SizeRange(limit=5 * MiB), Profile(Layout.RAID0, stripes=2)).size == 4 * MiB


@pytest.mark.parametrize(
    ("size", "profile", "reason"),
    [
        (SizeRange(required=20 * MiB), Profile(), "outside the requested range"),
        (SizeRange(limit=5 * MiB), Profile(), "outside the requested range"),
        (SizeRange(required=10 * MiB), Profile(Layout.RAID1, mirrors=1), "not type=raid1 mirrors=1"),
        (SizeRange(required=10 * MiB), Profile(Layout.RAID0, stripes=2), "not type=raid0 stripes=2"),
    ],
)
def test_incompatible_existing_volume(backend, fake, size, profile, reason):
    backend.create_volume("pvc-1", SizeRange(required=10 * MiB), Profile())
    with pytest.raises(VolumeExists, match=reason):
        backend.create_volume("pvc-1", size, profile)
    assert fake.invocations["lvcreate"] == 1


def test_lv_made_by_hand_is_not_taken_over(backend, fake):
    fake.add_lv(VG, "data", 10)
    with pytest.raises(VolumeExists, match="made by hand"):
        backend.create_volume("data", SizeRange(), Profile())


def test_lv_of_another_co_name_is_not_taken_over(backend, fake):
    fake.add_lv(VG, "pvc-1", 10, tags=[names.name_tag("pvc-other")])
    with pytest.raises(VolumeExists, match='belongs to volume "pvc-other"'):
        backend.create_volume("pvc-1", SizeRange(), Profile())


def test_co_names_outside_lvm_alphabet(backend):
    name = "ns/claim ü+1"
    volume = backend.create_volume(name, SizeRange(), Profile())
    assert volume.id == names.lv_name_for(name) and volume.id != name
    assert [v.name for v in backend.list_volumes()] == [name]
    assert backend.create_volume(name, SizeRange(), Profile()) == volume


def test_lvcreate_argv(fake):
    backend = LvmBackend(VG, Lvm2(fake, config=NO_UDEV_CONFIG), wipe=Wipes(), raid_supported=lambda: True)
    backend.create_volume("r", SizeRange(required=4 * MiB), Profile(Layout.RAID0, stripes=2, stripe_size=64 * 1024))
    argv, timeout, env = [c for c in fake.calls if c[0][1] == "lvcreate"][0]
    assert argv == (
        "lvm", "lvcreate", "--config", NO_UDEV_CONFIG, "--yes", "--wipesignatures", "y", "-n", "r", "-l", "4",
        "--addtag", "csilvm.name.r", "--addtag", "csilvm.profile.stripes.2",
        "--addtag", "csilvm.profile.stripesize.65536", "--addtag", "csilvm.profile.type.raid0",
        "--type", "raid0", "-i", "2", "-I", "64", "--", VG, "/dev/fb", "/dev/fa",
    )
    assert timeout == 120.0
    assert env["LVM_SUPPRESS_FD_WARNINGS"] == "1" and env["LC_ALL"] == "C"
    report_argv, report_timeout, _ = [c for c in fake.calls if c[0][1] == "fullreport"][0]
    assert report_argv == ("lvm", "fullreport", "--config", NO_UDEV_CONFIG, "--nolocking", "--reportformat", "json",
                           "--units", "b", "--nosuffix", "-a", "--", VG)
    assert report_timeout == 30.0


# -- capacity ----------------------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES, ids=str)
def test_capacity_is_exact(backend, fake, profile):
    fake.invocations.clear()
    cap = backend.capacity(profile)
    assert calls(fake) == {"fullreport": 1}
    assert cap.maximum_volume_size > 0 and cap.available >= cap.maximum_volume_size
    granule = granularity_extents(profile, fake.free_extents(VG)) * MiB
    with pytest.raises(OutOfRange, match="largest that fits now"):
        backend.create_volume("too-big", SizeRange(required=cap.maximum_volume_size + granule), profile)
    assert fake.invocations["lvcreate"] == 0
    volume = backend.create_volume("max", SizeRange(required=cap.maximum_volume_size), profile)
    assert volume.size == cap.maximum_volume_size


def test_known_capacities(backend):
    assert backend.capacity(Profile()) == Capacity(201 * MiB, 201 * MiB, MiB)
    assert backend.capacity(Profile(Layout.RAID1, mirrors=1)) == Capacity(99 * MiB, 62 * MiB, MiB)
    assert backend.capacity(Profile(Layout.RAID0, stripes=3)) == Capacity(117 * MiB, 117 * MiB, 3 * MiB)
    assert backend.capacity(Profile(Layout.RAID1, mirrors=3)) == Capacity.none()


def test_capacity_skips_pvs_that_are_not_allocatable(backend, fake):
    fake.set_allocatable("/dev/fb", False)
    assert backend.capacity(Profile()).maximum_volume_size == (63 + 39) * MiB
    assert backend.capacity(Profile(Layout.RAID1, mirrors=2)) == Capacity.none()


def test_raid_without_kernel_support(fake):
    backend = LvmBackend(VG, Lvm2(fake), wipe=Wipes(), raid_supported=lambda: False)
    assert backend.capacity(Profile(Layout.RAID1, mirrors=1)) == Capacity.none()
    assert backend.capacity(Profile()).maximum_volume_size == 201 * MiB
    with pytest.raises(OutOfRange, match="dm-raid"):
        backend.create_volume("r", SizeRange(), Profile(Layout.RAID1, mirrors=1))
    assert fake.invocations["lvcreate"] == 0


def test_too_few_pvs_for_profile(backend):
    with pytest.raises(OutOfRange, match="needs 4 physical volumes"):
        backend.create_volume("r", SizeRange(), Profile(Layout.RAID1, mirrors=3))


def test_out_of_range_request(backend):
    with pytest.raises(OutOfRange):
        backend.create_volume("r", SizeRange(required=10 * MiB, limit=5 * MiB), Profile())


pv_sizes = st.lists(st.integers(min_value=2, max_value=300), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=pv_sizes, profile=st.sampled_from(PROFILES), used=st.integers(min_value=0, max_value=50))
def test_capacity_agrees_with_the_fake_allocator(sizes, profile, used):
    """The capacity model and FakeLvm's independent allocator agree at the boundary."""
    fake = FakeLvm()
    fake.add_volume_group(VG, {f"/dev/p{i}": (mib + 1) * MiB for i, mib in enumerate(sizes)})
    if used and used < sizes[0]:
        fake.add_lv(VG, "existing", used, pvs=["/dev/p0"])
    backend = LvmBackend(VG, Lvm2(fake), wipe=Wipes(), raid_supported=lambda: True)
    cap = backend.capacity(profile)
    assume(cap.maximum_volume_size > 0)
    granule = granularity_extents(profile, fake.free_extents(VG)) * MiB
    # One granule more is refused by lvm2 itself, even with every PV to choose from.
    layout_args = {
        Layout.LINEAR: ["--type", "linear"],
        Layout.RAID0: ["--type", "raid0", "-i", str(granule // MiB)],
        Layout.RAID1: ["--type", "raid1", "-m", str(profile.mirrors)],
    }[profile.layout]
    with pytest.raises(OutOfRange):
        Lvm2(fake).lvcreate(VG, "over", (cap.maximum_volume_size + granule) // MiB, layout_args=layout_args)
    before = sum(fake.free_extents(VG).values())
    volume = backend.create_volume("max", SizeRange(required=cap.maximum_volume_size), profile)
    assert volume.size == cap.maximum_volume_size
    held = fake.lv_areas(VG, "max")
    assert before - sum(fake.free_extents(VG).values()) == sum(held.values())
    assert len(held) == {Layout.LINEAR: len(held), Layout.RAID0: granule // MiB,
                         Layout.RAID1: profile.mirrors + 1}[profile.layout]


# -- delete -------------------------------------------------------------------------


def test_delete_wipes_then_removes(backend, fake, wipes):
    backend.create_volume("pvc-1", SizeRange(), Profile())
    fake.invocations.clear()
    backend.delete_volume("pvc-1")
    assert calls(fake) == {"fullreport": 1, "lvremove": 1}
    assert wipes == ["/dev/vg0/pvc-1"]
    assert [c[0][-1] for c in fake.calls if c[0][1] == "lvremove"] == ["vg0/pvc-1"]
    assert fake.lv_names(VG) == []
    with pytest.raises(VolumeNotFound):
        backend.get_volume("pvc-1")


def test_delete_unknown_id_is_success(backend, fake, wipes):
    backend.delete_volume("nothing-here")
    assert calls(fake) == {"fullreport": 1}
    assert wipes == []


@pytest.mark.parametrize("volume_id", ["../x", "vg/lv", "vg0/pvc-1", "-rf", "", ".", "..", "a b", "x" * 128,
                                       "--yes", "pvc\n1", "r1_rimage_0"])
def test_weird_ids_never_reach_lvremove(backend, fake, wipes, volume_id):
    backend.create_volume("pvc-1", SizeRange(), Profile())
    fake.add_lv(VG, "r1", 4, segtype="raid1", mirrors=1)  # has hidden r1_rimage_0
    backend.delete_volume(volume_id)
    assert fake.invocations["lvremove"] == 0 and wipes == []
    assert fake.lv_names(VG) == ["pvc-1", "r1"]
    with pytest.raises(VolumeNotFound):
        backend.get_volume(volume_id)


def test_delete_open_volume_is_busy_and_not_wiped(backend, fake, wipes):
    backend.create_volume("pvc-1", SizeRange(), Profile())
    fake.set_open(VG, "pvc-1")
    with pytest.raises(VolumeBusy):
        backend.delete_volume("pvc-1")
    assert wipes == [] and fake.invocations["lvremove"] == 0


def test_delete_inactive_volume_skips_wipe(backend, fake, wipes):
    fake.add_lv(VG, "old", 4, active=False)
    backend.delete_volume("old")
    assert wipes == [] and fake.lv_names(VG) == []


def test_wipe_failure_keeps_the_volume(fake):
    def broken_wipe(path):
        raise PermissionError(13, "Permission denied", path)

    backend = LvmBackend(VG, Lvm2(fake), default_size=MiB, wipe=broken_wipe, raid_supported=lambda: True)
    backend.create_volume("pvc-1", SizeRange(), Profile())
    with pytest.raises(CommandFailed, match="could not wipe /dev/vg0/pvc-1"):
        backend.delete_volume("pvc-1")
    assert fake.lv_names(VG) == ["pvc-1"]


def test_delete_racing_another_remover_is_success(backend, fake):
    backend.create_volume("pvc-1", SizeRange(), Profile())
    fake.fail_next("lvremove", '  Failed to find logical volume "vg0/pvc-1"')
    backend.delete_volume("pvc-1")


# -- list -----------------------------------------------------------------------------


def test_preexisting_lvs_are_listed(backend, fake):
    fake.add_lv(VG, "zeta", 5)
    fake.add_lv(VG, "striped", 4, segtype="striped", stripes=2, tags=["owner_ops"])
    fake.add_lv(VG, "mirror", 3, segtype="raid1", mirrors=1)
    backend.create_volume("pvc-1", SizeRange(), Profile(Layout.RAID0, stripes=2))
    volumes = backend.list_volumes()
    assert [v.id for v in volumes] == ["mirror", "pvc-1", "striped", "zeta"]
    by_id = {v.id: v for v in volumes}
    assert by_id["zeta"].name is None and by_id["zeta"].profile == Profile() and by_id["zeta"].size == 5 * MiB
    assert by_id["striped"].profile == Profile(Layout.RAID0, stripes=2, stripe_size=64 * 1024)
    assert by_id["mirror"].profile == Profile(Layout.RAID1, mirrors=1)
    assert by_id["pvc-1"].name == "pvc-1" and by_id["pvc-1"].profile == Profile(Layout.RAID0, stripes=2)
    assert by_id["striped"].attributes == {
        "vg": VG, "lv_name": "striped", "segtype": "striped", "lv_attr": "-wi-a-----", "tags": "owner_ops"}
    assert by_id["striped"].device == "/dev/vg0/striped"


@pytest.mark.parametrize("count", [1, 200])
def test_list_costs_one_report_whatever_the_count(count):
    fake = FakeLvm()
    fake.add_volume_group(VG, {"/dev/big": 4 * GiB})
    for i in range(count):
        fake.add_lv(VG, f"lv{i:03d}", 1, tags=[names.name_tag(f"pvc-{i}")])
    backend = LvmBackend(VG, Lvm2(fake), wipe=Wipes(), raid_supported=lambda: True)
    assert len(backend.list_volumes()) == count
    assert calls(fake) == {"fullreport": 1}
    backend.get_volume("lv000")
    backend.capacity(Profile())
    assert calls(fake) == {"fullreport": 3}


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stderr", "error"),
    [
        ('  Volume group "vg0" has insufficient free space (10 extents): 20 required.', OutOfRange),
        ("  Insufficient suitable allocatable extents for logical volume x: 4 more required", OutOfRange),
        ('  Logical Volume "x" already exists in volume group "vg0"', VolumeExists),
        ('  Failed to find logical volume "vg0/x"', VolumeNotFound),
        ('  Volume group "vg0" not found\n  Cannot process volume group vg0', VolumeGroupNotFound),
        ("  /dev/mapper/control: open failed: No such device\n"
         "  Failure to communicate with kernel device-mapper driver.\n"
         "  striped: Required device-mapper target(s) not detected in your kernel.", BackendUnavailable),
        ("  Logical volume vg0/x in use.", VolumeBusy),
        ("  Can't remove open logical volume \"x\"", VolumeBusy),
        ("  Metadata on /dev/fa has wrong VG name", CommandFailed),
    ],
)
def test_classify(stderr, error):
    assert classify(stderr) is error


@pytest.mark.parametrize(
    ("subcommand", "stderr", "error"),
    [
        ("lvcreate", '  Volume group "vg0" has insufficient free space (3 extents): 8 required.', OutOfRange),
        ("lvcreate", "  raid1: Required device-mapper target(s) not detected in your kernel.", BackendUnavailable),
        ("lvcreate", "  WARNING: something odd on /dev/fa.\n  Aborting.", CommandFailed),
        ("fullreport", '  Volume group "vg0" not found\n  Cannot process volume group vg0', BackendUnavailable),
    ],
)
def test_injected_create_failures_are_classified(backend, fake, subcommand, stderr, error):
    fake.fail_next(subcommand, stderr)
    with pytest.raises(error) as caught:
        backend.create_volume("pvc-1", SizeRange(), Profile(Layout.RAID1, mirrors=1))
    if error is CommandFailed:
        assert type(caught.value) is CommandFailed
    assert stderr.strip().splitlines()[-1] in str(caught.value), "the operator must see lvm2's words"
    assert fake.lv_names(VG) == []


def test_injected_busy_on_lvremove(backend, fake):
    backend.create_volume("pvc-1", SizeRange(), Profile())
    fake.fail_next("lvremove", "  Logical volume vg0/pvc-1 in use.")
    with pytest.raises(VolumeBusy, match="in use"):
        backend.delete_volume("pvc-1")
    assert fake.lv_names(VG) == ["pvc-1"]


def test_probe(backend, fake):
    backend.probe()
    fake.remove_volume_group(VG)
    with pytest.raises(BackendUnavailable, match="vg0"):
        backend.probe()


def test_probe_without_lvm2():
    class Missing:
        def run(self, argv, **kwargs):
            raise CommandNotFound("lvm is not installed (not found on PATH)", argv=tuple(argv))

    with pytest.raises(BackendUnavailable, match="not installed"):
        LvmBackend(VG, Lvm2(Missing())).probe()


# -- locking ------------------------------------------------------------------------------


def test_reads_are_not_blocked_by_a_slow_mutation(backend, fake):
    entered, release = threading.Event(), threading.Event()

    def slow_lvcreate(argv):
        entered.set()
        assert release.wait(WAIT), "test did not release lvcreate"

    fake.before("lvcreate", slow_lvcreate)
    creator = threading.Thread(target=backend.create_volume, args=("slow", SizeRange(), Profile()))
    creator.start()
    try:
        assert entered.wait(WAIT)
        result: dict[str, Capacity] = {}
        reader = threading.Thread(target=lambda: result.setdefault("cap", backend.capacity(Profile())))
        reader.start()
        reader.join(WAIT)
        assert not reader.is_alive(), "capacity waited for the mutation lock"
        assert result["cap"].maximum_volume_size == 201 * MiB
        # A second mutation does wait for the first.
        deleter = threading.Thread(target=backend.delete_volume, args=("slow",))
        deleter.start()
        deleter.join(0.2)
        assert deleter.is_alive() and fake.invocations["lvremove"] == 0
    finally:
        release.set()
        creator.join(WAIT)
    deleter.join(WAIT)
    assert not deleter.is_alive()
    assert fake.lv_names(VG) == []
    assert fake.invocations["lvremove"] == 1


# -- ensure_volume_group ---------------------------------------------------------------------


def test_ensure_creates_the_volume_group():
    fake = FakeLvm(dict(DEVICES))
    backend = LvmBackend(VG, Lvm2(fake), devices=list(DEVICES), wipe=Wipes())
    backend.ensure_volume_group()
    assert calls(fake) == {"fullreport": 1, "pvs": 1, "pvcreate": 1, "vgcreate": 1}
    vgcreate = [c[0] for c in fake.calls if c[0][1] == "vgcreate"][0]
    assert vgcreate == ("lvm", "vgcreate", "--physicalextentsize", "1m", "--addtag", "csilvm", "--", VG, *DEVICES)
    assert backend.capacity(Profile()).maximum_volume_size == 201 * MiB
    fake.invocations.clear()
    backend.ensure_volume_group()
    assert calls(fake) == {"fullreport": 1}


def test_ensure_reuses_existing_pvs():
    fake = FakeLvm(dict(DEVICES))
    Lvm2(fake).pvcreate(["/dev/fa"])
    LvmBackend(VG, Lvm2(fake), devices=list(DEVICES), wipe=Wipes()).ensure_volume_group()
    assert [c[0][-2:] for c in fake.calls if c[0][1] == "pvcreate"][-1] == ("/dev/fb", "/dev/fc")


def test_ensure_refuses_other_devices(fake):
    backend = LvmBackend(VG, Lvm2(fake), devices=["/dev/fa", "/dev/fb"], wipe=Wipes())
    with pytest.raises(BackendUnavailable, match="not on the configured devices"):
        backend.ensure_volume_group()


def test_ensure_refuses_untagged_volume_group():
    fake = FakeLvm()
    fake.add_volume_group(VG, DEVICES, tags=())
    with pytest.raises(BackendUnavailable, match="no \"csilvm\" tag"):
        LvmBackend(VG, Lvm2(fake), devices=list(DEVICES), wipe=Wipes()).ensure_volume_group()
    # Without devices, the operator's VG is used as it is.
    LvmBackend(VG, Lvm2(fake), wipe=Wipes()).ensure_volume_group()


def test_ensure_refuses_devices_of_another_volume_group():
    fake = FakeLvm()
    fake.add_volume_group("other", {"/dev/fa": 64 * MiB})
    fake.add_device("/dev/fb", 64 * MiB)
    with pytest.raises(BackendUnavailable, match=r"/dev/fa \(in volume group other\)"):
        LvmBackend(VG, Lvm2(fake), devices=["/dev/fa", "/dev/fb"], wipe=Wipes()).ensure_volume_group()
    assert fake.invocations["vgcreate"] == 0 and fake.invocations["pvcreate"] == 0


def test_ensure_without_devices_needs_the_volume_group():
    with pytest.raises(BackendUnavailable, match="does not exist"):
        LvmBackend(VG, Lvm2(FakeLvm()), wipe=Wipes()).ensure_volume_group()


def test_concurrent_probes_share_one_report(backend, fake):
    entered, release = threading.Event(), threading.Event()

    def slow_report(argv):
        entered.set()
        assert release.wait(WAIT), "test did not release the report"

    fake.invocations.clear()
    fake.before("fullreport", slow_report)
    probes = [threading.Thread(target=backend.probe) for _ in range(5)]
    probes[0].start()
    assert entered.wait(WAIT)
    for t in probes[1:]:
        t.start()
    deadline = time.monotonic() + WAIT
    while backend._probe.followers < 4:  # every later Probe waits for the running report
        assert time.monotonic() < deadline, "the other probes did not join the running report"
        time.sleep(0.001)
    fake.before("fullreport", None)
    release.set()
    for t in probes:
        t.join(WAIT)
        assert not t.is_alive()
    assert fake.invocations["fullreport"] == 1
    backend.probe()  # once it returned, the next Probe runs its own report
    assert fake.invocations["fullreport"] == 2


def test_a_failed_shared_probe_fails_every_waiter(backend, fake):
    from lvm.single_flight import SingleFlight

    flight: SingleFlight[int] = SingleFlight()
    entered, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def failing() -> int:
        entered.set()
        release.wait(WAIT)
        raise CommandFailed("lvm: boom")

    def call(fn) -> None:
        try:
            flight.run(fn)
        except CommandFailed as exc:
            errors.append(exc)

    leader = threading.Thread(target=call, args=(failing,))
    leader.start()
    assert entered.wait(WAIT)
    follower = threading.Thread(target=call, args=(lambda: 1,))
    follower.start()
    release.set()
    leader.join(WAIT)
    follower.join(WAIT)
    assert [str(e) for e in errors] == ["lvm: boom", "lvm: boom"]
    assert flight.run(lambda: 7) == 7
