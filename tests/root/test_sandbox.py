"""LoopBackend on real loop devices (root only): every device a test attaches is detached at teardown."""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing
import os
import shutil
import signal
import stat
import struct
import threading
from pathlib import Path

import pytest

from lvm import images, loop, sandbox_state
from lvm.backend import Capacity, Condition, SizeRange
from lvm.command import SubprocessRunner
from lvm.errors import OutOfRange, VolumeBusy, VolumeExists, VolumeNotFound
from lvm.loop import find_attached, list_attached, loop_supported, wipe_ends
from lvm.profiles import LINEAR, Layout, Profile
from lvm.sandbox import LoopBackend
from lvm.units import MiB


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (loop devices)"
    return loop_supported()


_REASON = _skip_reason()
pytestmark = [pytest.mark.root, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

DEFAULT = 4 * MiB


@pytest.fixture
def work_dir(tmp_path):
    """A work dir; at teardown, every loop device backed by a file under tmp_path is detached."""
    yield tmp_path / "work"
    prefix = os.path.realpath(tmp_path) + os.sep
    for device in list_attached():
        if device.backing_file.startswith(prefix):
            loop.detach(device.device)


def make(work_dir: Path, capacity: int = 64 * MiB) -> LoopBackend:
    return LoopBackend(work_dir, capacity, DEFAULT)


def write_at(path: str, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_at(path: str, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def ours(tmp_path: Path) -> list[loop.LoopDevice]:
    prefix = os.path.realpath(tmp_path) + os.sep
    return [d for d in list_attached() if d.backing_file.startswith(prefix)]


def device_size(device: str) -> int:
    return int(Path(f"/sys/block/{os.path.basename(device)}/size").read_text()) * 512


BLKGETSIZE64 = 0x80081272  # <linux/fs.h>: _IOR(0x12, 114, size_t)


def block_size(device: str) -> int:
    """The size the block layer gives ``device`` (what ``blockdev --getsize64`` prints), not sysfs'."""
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = struct.unpack("=Q", fcntl.ioctl(fd, BLKGETSIZE64, bytes(8)))[0]
        assert os.lseek(fd, 0, os.SEEK_END) == size
        return size
    finally:
        os.close(fd)


def metadata_size(backend: LoopBackend, volume_id: str) -> int:
    return sandbox_state.parse_metadata(volume_id, backend.metadata_path(volume_id).read_text()).size


def test_probe(work_dir):
    make(work_dir).probe()


def test_create_get_list_delete(work_dir):
    backend = make(work_dir)
    vol = backend.create_volume("pvc-1", SizeRange(required=5 * MiB + 1), LINEAR)
    assert (vol.id, vol.size, vol.name) == ("pvc-1", 6 * MiB, "pvc-1")
    assert stat.S_ISBLK(os.stat(vol.device).st_mode)
    assert device_size(vol.device) == 6 * MiB
    assert find_attached(vol.attributes["image"]) == vol.device
    assert vol.attributes == {"backend": "loop", "image": str(backend.image_path("pvc-1"))}
    assert backend.get_volume("pvc-1") == vol
    assert backend.list_volumes() == [vol]
    backend.delete_volume("pvc-1")
    assert find_attached(vol.attributes["image"]) is None
    assert os.listdir(backend.volumes_dir) == []
    assert backend.list_volumes() == []
    with pytest.raises(VolumeNotFound):
        backend.get_volume("pvc-1")
    backend.delete_volume("pvc-1")


def test_create_is_idempotent(work_dir, tmp_path):
    backend = make(work_dir)
    first = backend.create_volume("v", SizeRange(), LINEAR)
    assert backend.create_volume("v", SizeRange(limit=DEFAULT), LINEAR) == first
    assert len(backend.list_volumes()) == 1 and len(ours(tmp_path)) == 1


def test_incompatible_request_is_volume_exists(work_dir):
    backend = make(work_dir)
    backend.create_volume("v", SizeRange(), LINEAR)
    with pytest.raises(VolumeExists, match="outside the requested range"):
        backend.create_volume("v", SizeRange(required=2 * DEFAULT), LINEAR)


def test_capacity_is_exact(work_dir):
    backend = make(work_dir, capacity=40 * MiB)
    backend.create_volume("a", SizeRange(required=10 * MiB), LINEAR)
    cap = backend.capacity(LINEAR)
    assert cap == Capacity(30 * MiB, 30 * MiB, MiB)
    with pytest.raises(OutOfRange, match="30MiB"):
        backend.create_volume("b", SizeRange(required=cap.maximum_volume_size + MiB), LINEAR)
    big = backend.create_volume("b", SizeRange(required=cap.maximum_volume_size), LINEAR)
    assert device_size(big.device) == 30 * MiB
    assert backend.capacity(LINEAR) == Capacity(0, 0, MiB)
    with pytest.raises(OutOfRange):
        backend.create_volume("c", SizeRange(), LINEAR)


def test_raid_is_out_of_range_with_no_capacity(work_dir, tmp_path):
    backend = make(work_dir)
    raid1 = Profile(Layout.RAID1, mirrors=1)
    with pytest.raises(OutOfRange, match="only type=linear"):
        backend.create_volume("r", SizeRange(), raid1)
    assert backend.capacity(raid1) == Capacity.none()
    assert backend.capacity(Profile(Layout.RAID0, stripes=2)) == Capacity.none()
    assert ours(tmp_path) == [] and os.listdir(backend.volumes_dir) == []


def test_wipe_ends_on_a_real_device(tmp_path, work_dir):
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.truncate(4 * MiB)
    device = loop.attach(image)
    for offset in (0, MiB, 3 * MiB):
        write_at(device, offset, b"\x5a" * MiB)
    wipe_ends(device, 4 * MiB)
    assert read_at(device, 0, MiB) == bytes(MiB)
    assert read_at(device, 3 * MiB, MiB) == bytes(MiB)
    assert read_at(device, MiB, MiB) == b"\x5a" * MiB
    # The zeros reached the image, not only the device's page cache.
    data = image.read_bytes()
    assert data[:MiB] == bytes(MiB) and data[-MiB:] == bytes(MiB) and data[MiB : 2 * MiB] == b"\x5a" * MiB


def test_a_volume_recreated_after_delete_reads_zeros(work_dir):
    backend = make(work_dir)
    vol = backend.create_volume("v", SizeRange(), LINEAR)
    write_at(vol.device, 0, b"SIGN")
    write_at(vol.device, vol.size - 4, b"TAIL")
    backend.delete_volume("v")
    again = backend.create_volume("v", SizeRange(), LINEAR)
    assert read_at(again.device, 0, 4) == bytes(4) and read_at(again.device, again.size - 4, 4) == bytes(4)


def test_restart_sees_the_same_volumes(work_dir, tmp_path):
    backend = make(work_dir)
    before = [backend.create_volume(n, SizeRange(), LINEAR) for n in ("a", "b")]
    backend.close()
    restarted = make(work_dir)
    assert restarted.list_volumes() == before
    assert len(ours(tmp_path)) == 2


def test_reboot_reattaches_and_keeps_data(work_dir, tmp_path):
    backend = make(work_dir)
    vol = backend.create_volume("a", SizeRange(), LINEAR)
    backend.create_volume("b", SizeRange(), LINEAR)
    write_at(vol.device, MiB, b"DATA")
    backend.close()
    for device in ours(tmp_path):  # a reboot: every loop device is gone
        loop.detach(device.device)
    assert ours(tmp_path) == []
    rebooted = make(work_dir)
    volumes = rebooted.list_volumes()
    assert [v.id for v in volumes] == ["a", "b"] and all(v.device for v in volumes)
    assert {d.device for d in ours(tmp_path)} == {v.device for v in volumes}
    assert read_at(volumes[0].device, MiB, 4) == b"DATA"


def test_leftovers_of_an_interrupted_create_are_repaired(work_dir, tmp_path):
    backend = make(work_dir)
    backend.create_volume("whole", SizeRange(), LINEAR)
    backend.close()
    vdir = work_dir / "volumes"
    orphan = vdir / "orphan.img"
    with open(orphan, "wb") as f:
        f.truncate(DEFAULT)
    loop.attach(orphan)  # killed after attaching, before the metadata
    (vdir / "half.json.tmp").write_text("{")
    (vdir / "gone.json").write_text((vdir / "whole.json").read_text().replace('"whole"', '"gone"'))
    repaired = make(work_dir)
    assert sorted(os.listdir(vdir)) == ["whole.img", "whole.json"]
    assert [d.backing_file for d in ours(tmp_path)] == [str(vdir / "whole.img")]
    assert [v.id for v in repaired.list_volumes()] == ["whole"]


def _create_and_die_before_commit(work_dir: Path) -> None:
    """Child: create a volume, SIGKILLed after attaching the image, before writing its metadata."""
    images.write_atomically = lambda path, text: os.kill(os.getpid(), signal.SIGKILL)
    make(work_dir).create_volume("v", SizeRange(), LINEAR)
    os._exit(0)


def test_kill_9_during_create_leaves_nothing_after_restart(work_dir, tmp_path):
    child = multiprocessing.get_context("fork").Process(target=_create_and_die_before_commit, args=(work_dir,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL
    assert len(ours(tmp_path)) == 1 and os.listdir(work_dir / "volumes") == ["v.img"]
    backend = make(work_dir)
    assert backend.list_volumes() == [] and ours(tmp_path) == []
    assert os.listdir(work_dir / "volumes") == []
    assert backend.create_volume("v", SizeRange(), LINEAR).size == DEFAULT


def test_parallel_creates_make_one_volume_per_name(work_dir, tmp_path):
    backend = make(work_dir, capacity=256 * MiB)
    names = [f"pvc-{i}" for i in range(8)]
    results, errors = [], []
    barrier = threading.Barrier(16)

    def worker(index: int) -> None:
        barrier.wait()
        try:
            results.append(backend.create_volume(names[index % 8], SizeRange(), LINEAR))
        except Exception as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(v.id for v in backend.list_volumes()) == names
    assert len(ours(tmp_path)) == 8 and len({v.device for v in results}) == 8


@pytest.mark.parametrize("volume_id", ["../x", "a/b", "", "..", "/x", "x/../../x"])
def test_malformed_ids_touch_nothing_outside(work_dir, tmp_path, volume_id):
    backend = make(work_dir)
    backend.create_volume("x", SizeRange(), LINEAR)
    sentinels = [tmp_path / "x.img", tmp_path / "x.json", work_dir / "x.img", work_dir / "x.json"]
    for path in sentinels:
        path.write_text("keep")
    backend.delete_volume(volume_id)
    assert all(p.read_text() == "keep" for p in sentinels)
    assert [v.id for v in backend.list_volumes()] == ["x"] and len(ours(tmp_path)) == 1


def test_exclusively_open_volume_is_busy(work_dir, tmp_path):
    backend = make(work_dir)
    vol = backend.create_volume("v", SizeRange(), LINEAR)
    write_at(vol.device, 0, b"KEEP")
    fd = os.open(vol.device, os.O_RDONLY | os.O_EXCL)
    try:
        with pytest.raises(VolumeBusy, match="open exclusively"):
            backend.delete_volume("v")
    finally:
        os.close(fd)
    assert read_at(vol.device, 0, 4) == b"KEEP" and backend.get_volume("v").device == vol.device
    backend.delete_volume("v")
    assert ours(tmp_path) == []


@pytest.mark.skipif(shutil.which("mkfs.ext4") is None, reason="mkfs.ext4 is not installed")
def test_mounted_volume_is_busy(work_dir, tmp_path):
    runner = SubprocessRunner()
    backend = make(work_dir, capacity=64 * MiB)
    vol = backend.create_volume("v", SizeRange(required=16 * MiB), LINEAR)
    runner.run(["mkfs.ext4", "-q", "-F", vol.device])
    target = tmp_path / "mnt"
    target.mkdir()
    runner.run(["mount", vol.device, str(target)])
    try:
        with pytest.raises(VolumeBusy, match="mounted at"):
            backend.delete_volume("v")
    finally:
        with contextlib.suppress(Exception):
            runner.run(["umount", str(target)])
    assert read_at(vol.device, 1024 + 56, 2) == b"\x53\xef"  # the ext4 magic: not wiped
    backend.delete_volume("v")
    assert ours(tmp_path) == []


def test_attach_and_detach_with_the_loop_ioctls(tmp_path, work_dir):
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.truncate(4 * MiB)
    device = loop.attach(image)
    assert find_attached(image) == device
    assert int(Path(f"/sys/block/{os.path.basename(device)}/size").read_text()) * 512 == 4 * MiB
    assert Path(f"/sys/block/{os.path.basename(device)}/ro").read_text().strip() == "0"
    loop.detach(device)
    assert find_attached(image) is None
    loop.detach(device)  # already detached: success


def test_parallel_attaches_race_for_free_devices_and_all_succeed(tmp_path, work_dir):
    """Threads asking for a free device at once get the same one; the losers retry (EBUSY)."""
    images = []
    for i in range(8):
        images.append(tmp_path / f"d{i}.img")
        with open(images[-1], "wb") as f:
            f.truncate(MiB)
    devices: dict[str, str] = {}
    barrier = threading.Barrier(len(images))

    def attach(image: Path) -> None:
        barrier.wait()
        devices[str(image)] = loop.attach(image)

    threads = [threading.Thread(target=attach, args=(image,)) for image in images]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(devices.values())) == len(images)
    assert {find_attached(image) for image in images} == set(devices.values())


# -- day two: expansion and condition on real loop devices -----------------------------------------


def test_expanding_an_attached_volume_grows_its_device_and_keeps_its_data(work_dir):
    backend = make(work_dir)
    vol = backend.create_volume("v", SizeRange(required=8 * MiB), LINEAR)
    write_at(vol.device, 0, b"HEAD")
    write_at(vol.device, 8 * MiB - 4, b"TAIL")
    holder = os.open(vol.device, os.O_RDONLY)  # held open across the expansion, as a file system would
    try:
        assert backend.expand_volume("v", SizeRange(required=20 * MiB + 1)) == 21 * MiB
        assert block_size(vol.device) == 21 * MiB == device_size(vol.device)
        assert os.lseek(holder, 0, os.SEEK_END) == 21 * MiB
    finally:
        os.close(holder)
    assert read_at(vol.device, 0, 4) == b"HEAD" and read_at(vol.device, 8 * MiB - 4, 4) == b"TAIL"
    assert read_at(vol.device, 8 * MiB, 4) == bytes(4)  # the new space reads zeros
    write_at(vol.device, 21 * MiB - 4, b"END!")
    assert read_at(vol.device, 21 * MiB - 4, 4) == b"END!"
    again = backend.get_volume("v")
    assert (again.device, again.size) == (vol.device, 21 * MiB)
    assert os.path.getsize(backend.image_path("v")) == 21 * MiB == metadata_size(backend, "v")
    assert backend.expand_volume("v", SizeRange(required=MiB)) == 21 * MiB  # never shrinks
    backend.close()
    assert make(work_dir).get_volume("v").size == 21 * MiB


def test_expansion_takes_exactly_the_free_capacity_and_refuses_one_mib_more(work_dir):
    backend = make(work_dir, capacity=64 * MiB)
    backend.create_volume("other", SizeRange(required=10 * MiB), LINEAR)
    vol = backend.create_volume("v", SizeRange(required=8 * MiB), LINEAR)
    free = backend.capacity(LINEAR).available
    assert free == 46 * MiB
    with pytest.raises(OutOfRange, match="46MiB .* free"):
        backend.expand_volume("v", SizeRange(required=vol.size + free + MiB))
    assert block_size(vol.device) == 8 * MiB and os.path.getsize(backend.image_path("v")) == 8 * MiB
    assert metadata_size(backend, "v") == 8 * MiB and backend.capacity(LINEAR).available == free
    assert backend.expand_volume("v", SizeRange(required=vol.size + free)) == 54 * MiB
    assert block_size(vol.device) == 54 * MiB and backend.capacity(LINEAR) == Capacity(0, 0, MiB)
    with pytest.raises(OutOfRange, match="free"):
        backend.expand_volume("v", SizeRange(required=55 * MiB))
    assert block_size(vol.device) == 54 * MiB and metadata_size(backend, "v") == 54 * MiB


def test_condition_is_abnormal_once_the_loop_device_is_detached_by_hand(work_dir):
    backend = make(work_dir)
    vol = backend.create_volume("v", SizeRange(), LINEAR)
    assert backend.volume_condition("v") == Condition()
    if shutil.which("losetup"):
        SubprocessRunner().run(["losetup", "-d", vol.device])
    else:
        loop.detach(vol.device)  # LOOP_CLR_FD, as losetup -d does
    condition = backend.volume_condition("v")
    assert condition.abnormal and "not attached" in condition.message
    assert find_attached(backend.image_path("v")) is None, "looking repairs nothing"
    reattached = backend.get_volume("v")  # what a stage does
    assert reattached.condition.abnormal and "re-attached" in reattached.condition.message
    assert backend.volume_condition("v") == Condition()


def test_condition_is_abnormal_once_the_image_is_removed_by_hand(work_dir):
    backend = make(work_dir)
    vol = backend.create_volume("v", SizeRange(), LINEAR)
    write_at(vol.device, 0, b"DATA")
    os.unlink(backend.image_path("v"))
    condition = backend.volume_condition("v")  # not NOT_FOUND: the CO still has the volume
    assert condition.abnormal and f"{vol.device} still holds it" in condition.message
    assert read_at(vol.device, 0, 4) == b"DATA"  # which is why the message says to copy it off
    loop.detach(vol.device)
    condition = backend.volume_condition("v")
    assert condition.abnormal and "is gone" in condition.message
    backend.delete_volume("v")  # finishes like an interrupted delete
    with pytest.raises(VolumeNotFound):
        backend.volume_condition("v")


def _expand_and_die(work_dir: Path, where: str, size: int) -> None:
    """Child: expand v to ``size``, SIGKILLed before the metadata's rename or before LOOP_SET_CAPACITY."""
    kill = lambda *args: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
    if where == "before rename":
        images.write_atomically = kill
    else:
        loop.set_capacity = kill
    make(work_dir).expand_volume("v", SizeRange(required=size))
    os._exit(0)


def _kill_during_expansion(work_dir: Path, where: str, size: int = 16 * MiB) -> None:
    child = multiprocessing.get_context("fork").Process(target=_expand_and_die, args=(work_dir, where, size))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL


def test_kill_9_before_the_metadata_rename_keeps_the_old_size_and_converges(work_dir, tmp_path):
    backend = make(work_dir)
    vol = backend.create_volume("v", SizeRange(required=8 * MiB), LINEAR)
    write_at(vol.device, 8 * MiB - 4, b"TAIL")
    _kill_during_expansion(work_dir, "before rename")
    image = backend.image_path("v")
    assert os.path.getsize(image) == 16 * MiB  # the harmless leftover
    assert metadata_size(backend, "v") == 8 * MiB and block_size(vol.device) == 8 * MiB
    assert backend.volume_condition("v") == Condition() and backend.get_volume("v").size == 8 * MiB
    backend.close()
    restarted = make(work_dir)  # cuts the image back to the metadata's size
    assert os.path.getsize(image) == 8 * MiB and restarted.get_volume("v").device == vol.device
    assert sorted(os.listdir(work_dir / "volumes")) == ["v.img", "v.json"]
    assert restarted.expand_volume("v", SizeRange(required=16 * MiB)) == 16 * MiB  # the retry
    assert block_size(vol.device) == 16 * MiB and read_at(vol.device, 8 * MiB - 4, 4) == b"TAIL"
    assert len(ours(tmp_path)) == 1


def test_kill_9_before_the_loop_device_is_told_is_reported_and_finished(work_dir, tmp_path):
    backend = make(work_dir)
    vol = backend.create_volume("v", SizeRange(required=8 * MiB), LINEAR)
    _kill_during_expansion(work_dir, "before set_capacity")
    assert metadata_size(backend, "v") == 16 * MiB and block_size(vol.device) == 8 * MiB
    condition = backend.volume_condition("v")
    assert condition.abnormal and "expand the volume again" in condition.message
    assert backend.expand_volume("v", SizeRange(required=16 * MiB)) == 16 * MiB  # the CO's retry
    assert block_size(vol.device) == 16 * MiB and backend.volume_condition("v") == Condition()
    backend.close()
    # Killed there again, and never retried: the restart tells the device.
    _kill_during_expansion(work_dir, "before set_capacity", 24 * MiB)
    assert block_size(vol.device) == 16 * MiB and metadata_size(backend, "v") == 24 * MiB
    restarted = make(work_dir)
    assert block_size(vol.device) == 24 * MiB and restarted.volume_condition("v") == Condition()
    assert len(ours(tmp_path)) == 1
