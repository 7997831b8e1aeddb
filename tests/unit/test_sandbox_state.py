"""The loop sandbox without loop devices: on-disk state, repair plans, and LoopBackend over fake loops."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
from pathlib import Path

import pytest

from lvm.backend import Capacity, Condition, SizeRange
from lvm.errors import BackendUnavailable, CommandFailed, InvalidParameters, OutOfRange, VolumeBusy, VolumeExists, VolumeNotFound
from lvm.loop import LoopDevice, list_attached, mount_points_of, parse_backing_file, wipe_ends
from lvm.names import lv_name_for
from lvm.profiles import LINEAR, Layout, Profile
from lvm.sandbox import LoopBackend
from lvm.sandbox_state import (
    DirScan,
    VolumeRecord,
    classify_entries,
    image_size_for,
    is_compatible,
    parse_metadata,
    plan_repair,
    plan_resize,
    scan,
)
from lvm.units import MiB

RAID1 = Profile(Layout.RAID1, mirrors=1)


class FakeLoops:
    """Loop devices as a dict; records calls; ``fail_attach`` / ``busy`` inject faults."""

    def __init__(self, attached: list[LoopDevice] = ()):
        self.devices = {d.device: d for d in attached}
        self.calls: list[tuple[str, str]] = []
        self.busy: dict[str, str] = {}
        self.fail_attach = False
        self.sizes: dict[str, int] = {}  # what size() answers, per device (None when absent)
        self.reason: str | None = None
        self._next = 100
        self._lock = threading.Lock()

    def attached(self) -> list[LoopDevice]:
        with self._lock:
            return sorted(self.devices.values(), key=lambda d: d.device)

    def backing_file(self, device: str) -> str | None:
        with self._lock:
            found = self.devices.get(device)
            return found.backing_file if found and not found.deleted else None

    def attach(self, image: str) -> str:
        with self._lock:
            self.calls.append(("attach", image))
            if self.fail_attach:
                raise CommandFailed("losetup: no free loop device")
            device = f"/dev/loop{self._next}"
            self._next += 1
            self.devices[device] = LoopDevice(device, os.path.realpath(image))
            self.sizes[device] = os.path.getsize(image)  # like the kernel: the file's size when attached
            return device

    def detach(self, device: str) -> None:
        with self._lock:
            self.calls.append(("detach", device))
            self.devices.pop(device, None)
            self.sizes.pop(device, None)

    def set_capacity(self, device: str) -> None:
        """Like the kernel: the device takes its backing file's size."""
        with self._lock:
            self.calls.append(("set_capacity", device))
            self.sizes[device] = os.path.getsize(self.devices[device].backing_file)

    def size(self, device: str) -> int | None:
        with self._lock:
            return self.sizes.get(device)

    def busy_reason(self, device: str) -> str | None:
        return self.busy.get(device)

    def unavailable_reason(self) -> str | None:
        return self.reason

    def device_of(self, image: Path) -> str | None:
        return next((d.device for d in self.attached() if d.backing_file == os.path.realpath(image)), None)


def make_backend(work_dir: Path, loops: FakeLoops | None = None, capacity: int = 64 * MiB, **kwargs) -> LoopBackend:
    return LoopBackend(
        work_dir, capacity, default_size=4 * MiB,
        loops=loops if loops is not None else FakeLoops(), **kwargs,
    )


def record(volume_id: str = "vol1", size: int = 4 * MiB, name: str | None = None) -> VolumeRecord:
    return VolumeRecord(volume_id, name or volume_id, size, (("type", "linear"),), "2024-01-01T00:00:00+00:00")


def write_volume(volumes_dir: Path, rec: VolumeRecord) -> None:
    volumes_dir.mkdir(parents=True, exist_ok=True)
    with open(volumes_dir / f"{rec.id}.img", "wb") as f:
        f.truncate(rec.size)
    (volumes_dir / f"{rec.id}.json").write_text(rec.to_json())


# --- pure parts ---------------------------------------------------------------------------------


def test_parse_backing_file_strips_deleted_suffix():
    assert parse_backing_file("/w/volumes/a.img\n") == ("/w/volumes/a.img", False)
    assert parse_backing_file("/w/volumes/a.img (deleted)\n") == ("/w/volumes/a.img", True)


def test_list_attached_reads_a_sysfs_tree(tmp_path):
    for name, backing in (("loop0", "/a.img\n"), ("loop3", "/b.img (deleted)\n"), ("loop1", None), ("vda", "/x")):
        (tmp_path / name).mkdir()
        if backing is not None:
            (tmp_path / name / "loop").mkdir()
            (tmp_path / name / "loop" / "backing_file").write_text(backing)
    assert list_attached(tmp_path) == [
        LoopDevice("/dev/loop0", "/a.img", False),
        LoopDevice("/dev/loop3", "/b.img", True),
    ]
    assert list_attached(tmp_path / "missing") == []


def test_mount_points_of_matches_major_minor_and_unescapes():
    text = (
        "22 1 7:3 / /mnt/with\\040space rw,relatime shared:1 - ext4 /dev/loop3 rw\n"
        "23 1 7:30 / /mnt/other rw - ext4 /dev/loop30 rw\n"
        "24 1 7:3 /sub /bind rw - ext4 /dev/loop3 rw\n"
    )
    assert mount_points_of(7, 3, text) == ["/mnt/with space", "/bind"]
    assert mount_points_of(7, 4, text) == []


def test_wipe_ends_zeroes_first_and_last_span_only(tmp_path):
    path = tmp_path / "img"
    size = 4 * MiB
    path.write_bytes(b"\xab" * size)
    wipe_ends(path, size, span=MiB)
    data = path.read_bytes()
    assert data[:MiB] == bytes(MiB)
    assert data[-MiB:] == bytes(MiB)
    assert data[MiB:-MiB] == b"\xab" * (2 * MiB)


def test_wipe_ends_on_a_file_smaller_than_the_span(tmp_path):
    path = tmp_path / "img"
    path.write_bytes(b"\xab" * 1000)
    wipe_ends(path, 1000, span=MiB)
    assert path.read_bytes() == bytes(1000)


def test_classify_entries_sorts_names_and_ignores_foreign_files():
    entries = classify_entries(
        ["a.img", "a.json", "b.img", "c.json", "d.json.tmp", "notes.txt", "bad name.img", "..img", "-x.json", ".lock"]
    )
    assert entries.image_ids == {"a", "b"}
    assert entries.metadata_ids == {"a", "c"}
    assert entries.tmp_files == ("d.json.tmp",)


def test_metadata_round_trip_and_rejections():
    rec = record("v", name="some/co name")
    assert parse_metadata("v", rec.to_json()) == rec
    assert rec.profile == LINEAR
    with pytest.raises(ValueError):
        parse_metadata("other", rec.to_json())  # metadata of another id
    with pytest.raises(ValueError):
        parse_metadata("v", "{not json")
    for broken in ({"size": -1}, {"size": "4"}, {"size": True}, {"name": 3}, {"format": 2}, {"parameters": {"type": 1}}):
        data = json.loads(rec.to_json()) | broken
        with pytest.raises(ValueError):
            parse_metadata("v", json.dumps(data))


def test_scan_sorts_whole_volumes_from_leftovers(tmp_path):
    write_volume(tmp_path, record("b"))
    write_volume(tmp_path, record("a", size=8 * MiB))
    (tmp_path / "orphan.img").write_bytes(b"")
    (tmp_path / "gone.json").write_text(record("gone").to_json())
    (tmp_path / "x.json.tmp").write_text("{")
    (tmp_path / "bad.img").write_bytes(b"")
    (tmp_path / "bad.json").write_text("{garbage")
    state = scan(tmp_path)
    assert [r.id for r in state.records] == ["a", "b"]
    assert state.used == 12 * MiB
    assert state.orphan_images == ("orphan",)
    assert state.orphan_metadata == ("gone",)
    assert state.tmp_files == ("x.json.tmp",)
    assert state.unreadable == ("bad",)
    by_id = {r.id: r for r in state.records}
    assert by_id["a"].size == 8 * MiB and "zzz" not in by_id


def test_plan_repair(tmp_path):
    vdir = tmp_path / "volumes"
    state = DirScan(
        records=(record("whole"), record("attached")),
        orphan_images=("orphan",),
        orphan_metadata=("gone",),
        unreadable=("bad",),
        tmp_files=("x.json.tmp",),
    )
    attached = [
        LoopDevice("/dev/loop1", str(vdir / "attached.img")),
        LoopDevice("/dev/loop2", str(vdir / "orphan.img")),
        LoopDevice("/dev/loop3", str(vdir / "removed.img"), deleted=True),  # ours, rm'ed under it
        LoopDevice("/dev/loop4", "/elsewhere/removed.img", deleted=True),  # not ours
        LoopDevice("/dev/loop5", str(vdir / "whole.img"), deleted=True),  # an old image of "whole"
        LoopDevice("/dev/loop6", str(vdir / "bad.img")),
    ]
    plan = plan_repair(state, attached, vdir)
    assert plan.detach == ("/dev/loop2", "/dev/loop3", "/dev/loop5")
    assert set(plan.remove) == {vdir / "orphan.img", vdir / "gone.json", vdir / "x.json.tmp"}
    assert plan.attach == (vdir / "whole.img",)
    assert plan_repair(DirScan((record("a"),), (), (), (), ()), [LoopDevice("/dev/loop0", str(vdir / "a.img"))], vdir).empty


def test_is_compatible_explains_each_mismatch():
    rec = record("v", size=8 * MiB)
    assert is_compatible(rec, "v", SizeRange(), LINEAR) is None
    assert is_compatible(rec, "v", SizeRange(required=8 * MiB, limit=8 * MiB), LINEAR) is None
    assert "belongs to" in is_compatible(rec, "w", SizeRange(), LINEAR)
    assert "outside the requested range" in is_compatible(rec, "v", SizeRange(required=9 * MiB), LINEAR)
    assert "outside the requested range" in is_compatible(rec, "v", SizeRange(limit=4 * MiB), LINEAR)
    assert "parameters" in is_compatible(rec, "v", SizeRange(), RAID1)


# --- LoopBackend over fake loop devices --------------------------------------------------------------


def files(backend: LoopBackend) -> list[str]:
    return sorted(os.listdir(backend.volumes_dir))


def test_create_get_list_delete(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    vol = backend.create_volume("pvc-1", SizeRange(required=3 * MiB + 1), LINEAR)
    assert (vol.id, vol.size, vol.name, vol.profile) == ("pvc-1", 4 * MiB, "pvc-1", LINEAR)
    assert vol.device == loops.device_of(backend.image_path("pvc-1"))
    assert vol.attributes == {"backend": "loop", "image": str(tmp_path / "volumes" / "pvc-1.img")}
    assert os.path.getsize(backend.image_path("pvc-1")) == 4 * MiB
    assert backend.get_volume("pvc-1") == vol
    assert backend.list_volumes() == [vol]
    assert files(backend) == ["pvc-1.img", "pvc-1.json"]
    backend.delete_volume("pvc-1")
    assert files(backend) == [] and loops.attached() == []
    with pytest.raises(VolumeNotFound):
        backend.get_volume("pvc-1")
    backend.delete_volume("pvc-1")  # unknown id: success


def test_create_is_idempotent_and_list_is_sorted(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    first = backend.create_volume("b", SizeRange(), LINEAR)
    backend.create_volume("a", SizeRange(), LINEAR)
    assert backend.create_volume("b", SizeRange(required=1, limit=8 * MiB), LINEAR) == first
    assert [v.id for v in backend.list_volumes()] == ["a", "b"]
    assert sum(1 for call in loops.calls if call[0] == "attach") == 2


def test_odd_co_names_map_to_valid_ids_and_collisions_are_volume_exists(tmp_path):
    backend = make_backend(tmp_path)
    vol = backend.create_volume("team/a b", SizeRange(), LINEAR)
    assert vol.id == lv_name_for("team/a b") and vol.name == "team/a b"
    # A CO name that is exactly the sanitized id of another one maps to the same id.
    with pytest.raises(VolumeExists, match="belongs to"):
        backend.create_volume(vol.id, SizeRange(), LINEAR)


def test_incompatible_existing_volume_is_volume_exists(tmp_path):
    backend = make_backend(tmp_path)
    backend.create_volume("v", SizeRange(required=4 * MiB), LINEAR)
    with pytest.raises(VolumeExists, match="outside the requested range"):
        backend.create_volume("v", SizeRange(required=8 * MiB), LINEAR)


def test_only_linear_is_served(tmp_path):
    backend = make_backend(tmp_path)
    with pytest.raises(OutOfRange, match="only type=linear"):
        backend.create_volume("v", SizeRange(), RAID1)
    with pytest.raises(OutOfRange, match="only type=linear"):
        backend.create_volume("v", SizeRange(), Profile(Layout.RAID0, stripes=2))
    assert backend.capacity(RAID1) == Capacity.none()
    assert files(backend) == []


def test_capacity_accounting_is_exact(tmp_path):
    backend = make_backend(tmp_path, capacity=10 * MiB + 12345)
    assert backend.capacity(LINEAR) == Capacity(10 * MiB + 12345, 10 * MiB, MiB)
    backend.create_volume("a", SizeRange(required=3 * MiB), LINEAR)
    cap = backend.capacity(LINEAR)
    assert cap == Capacity(7 * MiB + 12345, 7 * MiB, MiB)
    with pytest.raises(OutOfRange, match="free"):
        backend.create_volume("b", SizeRange(required=cap.maximum_volume_size + MiB), LINEAR)
    backend.create_volume("b", SizeRange(required=cap.maximum_volume_size), LINEAR)
    assert backend.capacity(LINEAR) == Capacity(12345, 0, MiB)
    with pytest.raises(OutOfRange):
        backend.create_volume("c", SizeRange(), LINEAR)
    assert [v.id for v in backend.list_volumes()] == ["a", "b"]


def test_attach_failure_during_create_leaves_nothing(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    loops.fail_attach = True
    with pytest.raises(CommandFailed):
        backend.create_volume("v", SizeRange(), LINEAR)
    assert files(backend) == [] and backend.capacity(LINEAR).available == 64 * MiB


def test_busy_volume_is_not_deleted(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    vol = backend.create_volume("v", SizeRange(), LINEAR)
    loops.busy[vol.device] = f"{vol.device} is mounted at /mnt"
    with pytest.raises(VolumeBusy, match="mounted at /mnt"):
        backend.delete_volume("v")
    assert files(backend) == ["v.img", "v.json"] and loops.device_of(backend.image_path("v"))


@pytest.mark.parametrize("volume_id", ["", "../x", "a/b", "/etc/passwd", "..", ".", "x/../../y", "-x", "a\0b"])
def test_malformed_ids_touch_nothing(tmp_path, volume_id):
    work = tmp_path / "work"
    backend = make_backend(work)
    backend.create_volume("x", SizeRange(), LINEAR)
    sentinels = [tmp_path / "x.img", tmp_path / "x.json", tmp_path / "y.img", work / "x.img", work / "x.json"]
    for path in sentinels:
        path.write_text("keep")
    backend.delete_volume(volume_id)
    with pytest.raises(VolumeNotFound):
        backend.get_volume(volume_id)
    assert all(p.read_text() == "keep" for p in sentinels)
    assert files(backend) == ["x.img", "x.json"]


def test_restart_sees_the_same_volumes_and_reboot_reattaches(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    a = backend.create_volume("a", SizeRange(), LINEAR)
    backend.create_volume("b", SizeRange(required=8 * MiB), LINEAR)
    backend.close()
    with pytest.raises(BackendUnavailable, match="closed"):
        backend.list_volumes()

    attaches_before = len(loops.calls)
    restarted = make_backend(tmp_path, loops)
    assert [v.id for v in restarted.list_volumes()] == ["a", "b"]
    assert restarted.get_volume("a") == a
    assert len(loops.calls) == attaches_before  # still attached: nothing re-attached

    rebooted_loops = FakeLoops()  # nothing attached
    rebooted = make_backend(tmp_path, rebooted_loops)
    assert [c[0] for c in rebooted_loops.calls] == ["attach", "attach"]
    assert [v.device != "" for v in rebooted.list_volumes()] == [True, True]
    assert rebooted.capacity(LINEAR).available == 64 * MiB - 12 * MiB


def test_get_volume_reattaches_a_volume_detached_meanwhile(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    vol = backend.create_volume("v", SizeRange(), LINEAR)
    loops.detach(vol.device)
    assert backend.list_volumes()[0].device == ""
    again = backend.get_volume("v")
    assert again.device and again.device == loops.device_of(backend.image_path("v"))


def test_open_repairs_leftovers_and_keeps_unreadable_volumes(tmp_path):
    vdir = tmp_path / "volumes"
    write_volume(vdir, record("whole"))
    (vdir / "orphan.img").write_bytes(b"")
    (vdir / "gone.json").write_text(record("gone").to_json())
    (vdir / "whole.json.tmp").write_text("{")
    (vdir / "bad.img").write_bytes(b"")
    (vdir / "bad.json").write_text("{garbage")
    (vdir / "README").write_text("foreign")
    loops = FakeLoops([LoopDevice("/dev/loop7", str(vdir / "orphan.img"))])
    backend = make_backend(tmp_path, loops)
    assert files(backend) == ["README", "bad.img", "bad.json", "whole.img", "whole.json"]
    assert ("detach", "/dev/loop7") in loops.calls
    assert [v.id for v in backend.list_volumes()] == ["whole"]
    with pytest.raises(VolumeExists, match="unreadable"):
        backend.create_volume("bad", SizeRange(), LINEAR)
    backend.delete_volume("bad")  # the CO may still delete it
    assert files(backend) == ["README", "whole.img", "whole.json"]


def test_delete_finishes_an_interrupted_delete(tmp_path):
    backend = make_backend(tmp_path)
    backend.create_volume("v", SizeRange(), LINEAR)
    backend.image_path("v").unlink()  # as if killed between removing the image and the metadata
    assert backend.list_volumes() == []
    backend.delete_volume("v")
    assert files(backend) == []


def test_probe_reports_the_reason(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    backend.probe()
    loops.reason = "/dev/loop-control is missing"
    with pytest.raises(BackendUnavailable, match="loop-control is missing"):
        backend.probe()


def test_parallel_creates_end_with_one_volume_per_name(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops, capacity=1024 * MiB)
    names = [f"vol-{i}" for i in range(8)]
    results: list = []
    barrier = threading.Barrier(16)

    def worker(index: int) -> None:
        barrier.wait()
        results.append(backend.create_volume(names[index % 8], SizeRange(), LINEAR))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 16
    assert sorted(v.id for v in backend.list_volumes()) == names
    assert len(loops.attached()) == 8
    assert len({v.device for v in results}) == 8


def test_preprovision_is_idempotent(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    first = backend.preprovision({"m2": 8 * MiB, "m1": 3 * MiB + 1})
    assert [(v.id, v.size) for v in first] == [("m1", 4 * MiB), ("m2", 8 * MiB)]
    assert make_backend(tmp_path, loops).preprovision({"m1": 3 * MiB + 1, "m2": 8 * MiB}) == first
    assert len(loops.attached()) == 2


# --- kill -9 at every step ---------------------------------------------------------------------------

# The system calls a create or delete makes, each a place where a kill -9 may land.
_STEPS = ("open", "ftruncate", "fsync", "write", "replace", "unlink", "pwrite")


def _run_and_kill_at(work_dir: Path, step: int, action: str) -> None:
    """Child process: run ``action`` and SIGKILL itself just before system call number ``step``."""
    count = [0]

    def killing(original):
        def wrapper(*args, **kwargs):
            count[0] += 1
            if count[0] == step:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)
        return wrapper

    loops = FakeLoops()
    backend = make_backend(work_dir, loops)
    for name in _STEPS:
        setattr(os, name, killing(getattr(os, name)))
    loops.attach = killing(loops.attach)
    loops.detach = killing(loops.detach)
    loops.set_capacity = killing(loops.set_capacity)
    if action == "create":
        backend.create_volume("v", SizeRange(), LINEAR)
    elif action == "expand":
        backend.expand_volume("v", SizeRange(required=8 * MiB))
    else:
        backend.delete_volume("v")
    os._exit(0)


@pytest.mark.parametrize("action", ["create", "delete"])
def test_kill_at_any_point_leaves_a_whole_volume_or_nothing(tmp_path, action):
    context = multiprocessing.get_context("fork")
    outcomes = set()
    for step in range(1, 60):
        work = tmp_path / f"step{step}"
        if action == "delete":
            make_backend(work).create_volume("v", SizeRange(), LINEAR)
        child = context.Process(target=_run_and_kill_at, args=(work, step, action))
        child.start()
        child.join(timeout=60)
        assert child.exitcode in (0, -signal.SIGKILL), child.exitcode
        backend = make_backend(work)  # a restart (after a reboot: nothing attached)
        volumes = backend.list_volumes()
        if volumes:
            assert [(v.id, v.size, v.name) for v in volumes] == [("v", 4 * MiB, "v")]
            assert files(backend) == ["v.img", "v.json"] and volumes[0].device
            assert backend.capacity(LINEAR).available == 60 * MiB
        else:
            assert files(backend) == []
            assert backend.capacity(LINEAR).available == 64 * MiB
        outcomes.add((child.exitcode, bool(volumes)))
        if child.exitcode == 0:
            break
    else:
        pytest.fail("the action never completed: raise the step bound")
    # Both outcomes occurred: the kills did land before and after the commit point.
    assert outcomes >= {(-signal.SIGKILL, True), (-signal.SIGKILL, False)}


def test_kill_at_any_point_of_an_expansion_leaves_the_old_or_the_new_size_and_nothing_between(tmp_path):
    """After a restart, image, loop device and capacity agree with the metadata, whichever size it says."""
    context = multiprocessing.get_context("fork")
    sizes = set()
    for step in range(1, 60):
        work = tmp_path / f"step{step}"
        make_backend(work).create_volume("v", SizeRange(), LINEAR)  # 4 MiB
        child = context.Process(target=_run_and_kill_at, args=(work, step, "expand"))
        child.start()
        child.join(timeout=60)
        assert child.exitcode in (0, -signal.SIGKILL), child.exitcode
        loops = FakeLoops()  # a reboot: the restart re-attaches the image, which gives the device its size
        backend = make_backend(work, loops)
        [volume] = backend.list_volumes()
        assert volume.size in (4 * MiB, 8 * MiB)
        assert os.path.getsize(backend.image_path("v")) == volume.size, f"step {step}"
        assert loops.size(volume.device) == volume.size, f"step {step}"
        assert backend.capacity(LINEAR).available == 64 * MiB - volume.size
        assert files(backend) == ["v.img", "v.json"] and not backend.volume_condition("v").abnormal
        # The retried expansion converges from wherever the kill left it.
        assert backend.expand_volume("v", SizeRange(required=8 * MiB)) == 8 * MiB
        assert os.path.getsize(backend.image_path("v")) == 8 * MiB == loops.size(volume.device)
        sizes.add((child.exitcode, volume.size))
        if child.exitcode == 0:
            break
    else:
        pytest.fail("the expansion never completed: raise the step bound")
    assert sizes >= {(-signal.SIGKILL, 4 * MiB), (-signal.SIGKILL, 8 * MiB), (0, 8 * MiB)}


def test_loop_config_matches_the_kernel_struct_layout():
    from lvm.loop import LOOP_INFO64, loop_config

    config = loop_config(7, "/work/volumes/v.img")
    # struct loop_config: u32 fd, u32 block_size, struct loop_info64 (232 bytes), u64 __reserved[8]
    assert LOOP_INFO64.size == 232 and len(config) == 304
    assert int.from_bytes(config[0:4], "little") == 7 and config[4:8] == bytes(4)
    info = LOOP_INFO64.unpack(bytes(config[8:240]))
    assert info[9].rstrip(b"\0") == b"/work/volumes/v.img"  # lo_file_name
    assert info[8] == 0  # lo_flags: read-write, no autoclear, no partition scan
    assert config[240:] == bytes(64)


def test_loop_info_truncates_long_paths_to_the_kernel_name_size():
    from lvm.loop import LO_NAME_SIZE, LOOP_INFO64, loop_info

    name = LOOP_INFO64.unpack(loop_info("/" + "x" * 200))[9]
    assert len(name) == LO_NAME_SIZE and name[-1] == 0


def test_two_backends_sharing_a_work_dir_see_each_others_changes(tmp_path):
    """What one process caches of the work dir is re-read once another changed it (generation)."""
    loops = FakeLoops()
    first, second = make_backend(tmp_path, loops), make_backend(tmp_path, loops)
    assert first.capacity(LINEAR).available == 64 * MiB
    made = second.create_volume("made-by-second", SizeRange(required=8 * MiB), LINEAR)
    assert [v.id for v in first.list_volumes()] == ["made-by-second"]
    assert first.capacity(LINEAR).available == 56 * MiB
    assert first.create_volume("made-by-second", SizeRange(required=8 * MiB), LINEAR) == made
    first.delete_volume("made-by-second")
    assert second.list_volumes() == [] and second.capacity(LINEAR).available == 64 * MiB
    with pytest.raises(VolumeNotFound):
        second.get_volume("made-by-second")


def test_a_volume_removed_by_hand_is_no_longer_listed_nor_counted(tmp_path):
    backend = make_backend(tmp_path)
    backend.create_volume("kept", SizeRange(required=4 * MiB), LINEAR)
    backend.create_volume("removed", SizeRange(required=8 * MiB), LINEAR)
    os.unlink(backend.metadata_path("removed"))  # the directory's mtime changes
    assert [v.id for v in backend.list_volumes()] == ["kept"]
    assert backend.capacity(LINEAR).available == 60 * MiB


def test_a_known_device_is_confirmed_by_the_kernel_before_use(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    vol = backend.create_volume("v", SizeRange(), LINEAR)
    loops.detach(vol.device)  # e.g. detached by hand
    assert backend.device_of("v") is None
    again = backend.get_volume("v")  # re-attached, not the stale device
    assert again.device != vol.device and backend.device_of("v") == again.device


# -- day two: expansion, condition, modify ------------------------------------------------------


def test_expansion_takes_exactly_the_free_capacity_and_changes_nothing_when_refused(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops, capacity=64 * MiB)
    volume = backend.create_volume("grow", SizeRange(16 * MiB), Profile())
    free = backend.capacity(Profile()).available
    with pytest.raises(OutOfRange):
        backend.expand_volume(volume.id, SizeRange(volume.size + free + MiB))
    assert os.path.getsize(backend.image_path(volume.id)) == 16 * MiB
    assert backend.get_volume(volume.id).size == 16 * MiB
    assert backend.expand_volume(volume.id, SizeRange(volume.size + free)) == 64 * MiB
    assert os.path.getsize(backend.image_path(volume.id)) == 64 * MiB
    assert ("set_capacity", volume.device) in loops.calls
    assert backend.capacity(Profile()).available == 0
    again = make_backend(tmp_path, FakeLoops())  # another process reads the metadata
    assert again.get_volume(volume.id).size == 64 * MiB


def test_expansion_never_shrinks_and_is_idempotent(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    volume = backend.create_volume("grow", SizeRange(8 * MiB), Profile())
    assert backend.expand_volume(volume.id, SizeRange(10 * MiB + 1)) == 11 * MiB
    calls = len(loops.calls)
    assert backend.expand_volume(volume.id, SizeRange(11 * MiB)) == 11 * MiB
    assert backend.expand_volume(volume.id, SizeRange(MiB)) == 11 * MiB
    assert len(loops.calls) == calls
    with pytest.raises(VolumeNotFound):
        backend.expand_volume("nope", SizeRange(MiB))


def test_an_expansion_killed_before_the_loop_device_was_told_is_finished_by_the_retry(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    volume = backend.create_volume("grow", SizeRange(8 * MiB), Profile())
    loops.sizes[volume.device] = 8 * MiB
    loops.set_capacity = lambda device: (_ for _ in ()).throw(KeyboardInterrupt())  # the kill
    with pytest.raises(KeyboardInterrupt):
        backend.expand_volume(volume.id, SizeRange(12 * MiB))
    del loops.set_capacity
    condition = backend.volume_condition(volume.id)
    assert condition.abnormal and "expand the volume again" in condition.message
    assert backend.expand_volume(volume.id, SizeRange(12 * MiB)) == 12 * MiB
    assert loops.sizes[volume.device] == 12 * MiB
    assert not backend.volume_condition(volume.id).abnormal


def test_condition_sees_a_lost_loop_device_and_a_lost_image_without_repairing(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    volume = backend.create_volume("v", SizeRange(8 * MiB), Profile())
    assert backend.volume_condition(volume.id) == Condition()
    loops.detach(volume.device)
    condition = backend.volume_condition(volume.id)
    assert condition.abnormal and "not attached" in condition.message
    assert loops.device_of(backend.image_path(volume.id)) is None, "looking repairs nothing"
    repaired = backend.get_volume(volume.id)  # what a stage does: re-attach, and say so once
    assert repaired.condition.abnormal and "re-attached" in repaired.condition.message
    assert not backend.volume_condition(volume.id).abnormal
    os.unlink(backend.image_path(volume.id))
    condition = backend.volume_condition(volume.id)
    assert condition.abnormal and "is gone" in condition.message
    with pytest.raises(VolumeNotFound):
        backend.volume_condition("never-made")


def test_modify_is_a_no_op_to_linear_and_refused_otherwise(tmp_path):
    backend = make_backend(tmp_path, FakeLoops())
    volume = backend.create_volume("v", SizeRange(8 * MiB), Profile())
    assert backend.modify_volume(volume.id, {"type": "linear"}) == volume
    for params in ({"type": "raid1"}, {"mirrors": "1"}, {"XXX_FakeKey": "x"}):
        with pytest.raises(InvalidParameters):
            backend.modify_volume(volume.id, params)
    with pytest.raises(VolumeNotFound):
        backend.modify_volume("nope", {"type": "linear"})


def test_image_size_for_takes_the_metadata_as_the_truth():
    # Grown to the volume's size; a leftover of a killed expansion cut back ...
    assert image_size_for(8 * MiB, 4 * MiB, [4 * MiB]) == 8 * MiB
    assert image_size_for(8 * MiB, 8 * MiB, [8 * MiB]) == 8 * MiB
    assert image_size_for(8 * MiB, 20 * MiB, [8 * MiB]) == 8 * MiB
    assert image_size_for(8 * MiB, 20 * MiB, []) == 8 * MiB
    # ... but never below what a device shows (it may hold data there), nor blindly.
    assert image_size_for(8 * MiB, 20 * MiB, [12 * MiB]) == 12 * MiB
    assert image_size_for(8 * MiB, 20 * MiB, [8 * MiB, 30 * MiB]) == 20 * MiB
    assert image_size_for(8 * MiB, 20 * MiB, [None]) == 20 * MiB


def test_plan_resize(tmp_path):
    vdir = tmp_path / "volumes"
    records = [record("ok", 8 * MiB), record("leftover", 8 * MiB), record("untold", 12 * MiB), record("gone", MiB)]
    image_sizes = {"ok": 8 * MiB, "leftover": 20 * MiB, "untold": 12 * MiB}  # "gone": no image
    devices = {
        "ok": {"/dev/loop1": 8 * MiB},
        "leftover": {"/dev/loop2": 8 * MiB},
        "untold": {"/dev/loop3": 8 * MiB, "/dev/loop4": None},
    }
    resize, refresh = plan_resize(vdir, records, image_sizes, devices)
    assert resize == ((vdir / "leftover.img", 8 * MiB),)
    assert refresh == ("/dev/loop3",)
    assert plan_resize(vdir, records[:1], image_sizes, devices) == ((), ())


def test_expansion_refused_for_a_range_with_no_granule_changes_nothing(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    volume = backend.create_volume("v", SizeRange(8 * MiB), Profile())
    calls = list(loops.calls)
    with pytest.raises(OutOfRange, match="no multiple"):
        backend.expand_volume(volume.id, SizeRange(required=10 * MiB + 1, limit=10 * MiB + 2))
    with pytest.raises(OutOfRange, match="below required"):
        backend.expand_volume(volume.id, SizeRange(required=12 * MiB, limit=10 * MiB))
    with pytest.raises(VolumeNotFound):
        backend.expand_volume("../v", SizeRange(required=12 * MiB))
    assert loops.calls == calls and os.path.getsize(backend.image_path("v")) == 8 * MiB
    assert parse_metadata("v", backend.metadata_path("v").read_text()).size == 8 * MiB


def test_refused_expansion_says_what_is_free(tmp_path):
    backend = make_backend(tmp_path, capacity=40 * MiB)
    backend.create_volume("other", SizeRange(10 * MiB), Profile())
    volume = backend.create_volume("v", SizeRange(10 * MiB), Profile())
    with pytest.raises(OutOfRange, match=r"20MiB \(20971520 bytes\) free .* at most 31457280 bytes"):
        backend.expand_volume(volume.id, SizeRange(31 * MiB))
    assert backend.expand_volume(volume.id, SizeRange(30 * MiB)) == 30 * MiB
    assert backend.capacity(LINEAR) == Capacity(0, 0, MiB)


def _leave_a_killed_expansion(backend: LoopBackend, volume_id: str, image_size: int) -> None:
    """What a kill between the image's ftruncate and the metadata's rename leaves: a larger image, a .tmp."""
    os.truncate(backend.image_path(volume_id), image_size)
    backend.metadata_path(volume_id).with_name(f"{volume_id}.json.tmp").write_text("{")


def test_a_kill_before_the_metadata_rename_keeps_the_old_size_and_the_retry_cuts_the_image(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    volume = backend.create_volume("v", SizeRange(8 * MiB), Profile())
    _leave_a_killed_expansion(backend, "v", 20 * MiB)
    # The metadata is the truth: the volume, its capacity and its device keep the old size.
    assert backend.get_volume("v").size == 8 * MiB
    assert backend.capacity(LINEAR).available == 56 * MiB
    assert not backend.volume_condition("v").abnormal
    # The retry asks less than the leftover: the image is cut to the new size, so is the device.
    assert backend.expand_volume("v", SizeRange(12 * MiB)) == 12 * MiB
    assert os.path.getsize(backend.image_path("v")) == 12 * MiB == loops.sizes[volume.device]
    assert backend.capacity(LINEAR).available == 52 * MiB


def test_open_cuts_back_a_killed_expansion_before_re_attaching(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    volume = backend.create_volume("v", SizeRange(8 * MiB), Profile())
    _leave_a_killed_expansion(backend, "v", 20 * MiB)
    backend.close()
    restarted = make_backend(tmp_path, loops)  # the device stayed attached (at 8 MiB)
    assert os.path.getsize(backend.image_path("v")) == 8 * MiB and files(restarted) == ["v.img", "v.json"]
    assert loops.sizes[volume.device] == 8 * MiB and restarted.get_volume("v").size == 8 * MiB
    _leave_a_killed_expansion(restarted, "v", 20 * MiB)
    restarted.close()
    rebooted_loops = FakeLoops()  # nothing attached: the device would take the image's size
    rebooted = make_backend(tmp_path, rebooted_loops)
    device = rebooted.get_volume("v").device
    assert rebooted_loops.sizes[device] == 8 * MiB == os.path.getsize(backend.image_path("v"))


def test_a_re_attach_never_shows_more_than_the_metadata(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    volume = backend.create_volume("v", SizeRange(8 * MiB), Profile())
    _leave_a_killed_expansion(backend, "v", 20 * MiB)
    loops.detach(volume.device)
    again = backend.get_volume("v")
    assert loops.sizes[again.device] == 8 * MiB == os.path.getsize(backend.image_path("v"))


def test_a_failed_metadata_write_puts_the_image_back(tmp_path, monkeypatch):
    from lvm import images

    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    volume = backend.create_volume("v", SizeRange(8 * MiB), Profile())

    def full(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(images, "write_atomically", full)
    with pytest.raises(OSError, match="No space"):
        backend.expand_volume("v", SizeRange(16 * MiB))
    assert os.path.getsize(backend.image_path("v")) == 8 * MiB and loops.sizes[volume.device] == 8 * MiB
    assert backend.get_volume("v").size == 8 * MiB and backend.capacity(LINEAR).available == 56 * MiB
    assert ("set_capacity", volume.device) not in loops.calls


def test_open_tells_a_device_its_volume_grew_when_the_kill_came_before_set_capacity(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    volume = backend.create_volume("v", SizeRange(8 * MiB), Profile())
    def killed(device: str) -> None:
        raise KeyboardInterrupt  # the kill, after the metadata's rename

    loops.set_capacity = killed
    with pytest.raises(KeyboardInterrupt):
        backend.expand_volume("v", SizeRange(12 * MiB))
    del loops.set_capacity
    backend.close()
    assert loops.sizes[volume.device] == 8 * MiB
    restarted = make_backend(tmp_path, loops)
    assert ("set_capacity", volume.device) in loops.calls and loops.sizes[volume.device] == 12 * MiB
    assert not restarted.volume_condition("v").abnormal


def test_expansion_logs_one_line(tmp_path, caplog):
    backend = make_backend(tmp_path)
    backend.create_volume("v", SizeRange(8 * MiB), Profile())
    with caplog.at_level("INFO", logger="lvm.sandbox"):
        backend.expand_volume("v", SizeRange(12 * MiB))
        backend.expand_volume("v", SizeRange(12 * MiB))
    lines = [r.getMessage() for r in caplog.records if "expanded" in r.getMessage()]
    assert lines == [f"loop sandbox: expanded volume v from {8 * MiB} to {12 * MiB} bytes"]


def test_condition_of_a_volume_whose_image_was_removed_by_hand_is_abnormal_not_not_found(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    volume = backend.create_volume("v", SizeRange(8 * MiB), Profile())
    os.unlink(backend.image_path("v"))
    # The kernel keeps the removed file open behind the device, and says so.
    loops.devices[volume.device] = LoopDevice(volume.device, str(backend.image_path("v")), deleted=True)
    assert backend.list_volumes() == []  # the cache drops it: metadata alone looks like a leftover
    condition = backend.volume_condition("v")
    assert condition.abnormal and volume.device in condition.message and "copy the data" in condition.message
    loops.detach(volume.device)
    condition = backend.volume_condition("v")
    assert condition.abnormal and "is gone" in condition.message
    assert files(backend) == ["v.json"], "looking repairs nothing"
    backend.metadata_path("v").write_text("{garbage")
    assert "unreadable" in backend.volume_condition("v").message
    backend.metadata_path("v").write_text(record("v", 8 * MiB).to_json())
    make_backend(tmp_path, loops)  # a restart still removes metadata alone, as an interrupted delete's
    assert files(backend) == []
    with pytest.raises(VolumeNotFound):
        backend.volume_condition("v")


def test_list_volumes_carries_each_condition(tmp_path):
    loops = FakeLoops()
    backend = make_backend(tmp_path, loops)
    a = backend.create_volume("a", SizeRange(8 * MiB), Profile())
    backend.create_volume("b", SizeRange(8 * MiB), Profile())
    loops.detach(a.device)
    conditions = {v.id: v.condition for v in backend.list_volumes()}
    assert conditions["b"] == Condition()
    assert conditions["a"].abnormal and "not attached" in conditions["a"].message
    assert loops.device_of(backend.image_path("a")) is None, "listing repairs nothing"
