"""Snapshots, restores, clones and thin volumes of LoopBackend on real loop devices (root only)."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import stat
import time
from pathlib import Path

import pytest

from lvm import images, loop, sandbox_state
from lvm.backend import Capacity, ContentSource, SizeRange
from lvm.command import SubprocessRunner
from lvm.errors import (
    InvalidParameters,
    OutOfRange,
    PoolExhausted,
    SnapshotExists,
    SnapshotNotFound,
    SourceNotFound,
    VolumeExists,
    VolumeNotFound,
)
from lvm.loop import list_attached, loop_supported
from lvm.profiles import LINEAR, Layout, Profile
from lvm.sandbox import LoopBackend
from lvm.thin import ThinPolicy
from lvm.units import GiB, MiB

from tests.root.test_sandbox import DEFAULT, block_size, ours, read_at, write_at


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (loop devices)"
    return loop_supported()


_REASON = _skip_reason()
pytestmark = [pytest.mark.root, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

THIN = Profile(Layout.THIN, pool="csilvm-thinpool")


@pytest.fixture
def work_dir(tmp_path):
    """A work dir; at teardown, every loop device backed by a file under tmp_path is detached."""
    yield tmp_path / "work"
    prefix = os.path.realpath(tmp_path) + os.sep
    for device in list_attached():
        if device.backing_file.startswith(prefix):
            loop.detach(device.device)


def make(work_dir: Path, capacity: int = 64 * MiB, **thin) -> LoopBackend:
    return LoopBackend(work_dir, capacity, DEFAULT, thin=ThinPolicy(**thin))


def snapshot_files(backend: LoopBackend) -> list[str]:
    return sorted(os.listdir(backend.snapshots_dir))


def fill(device: str, offset: int, length: int, byte: bytes) -> None:
    """Write ``length`` bytes of ``byte`` at ``offset`` of ``device``, synced (real data in its image)."""
    fd = os.open(device, os.O_WRONLY)
    try:
        chunk = byte * MiB
        for at in range(offset, offset + length, MiB):
            os.pwrite(fd, chunk[: min(MiB, offset + length - at)], at)
        os.fsync(fd)
    finally:
        os.close(fd)


# -- snapshots ------------------------------------------------------------------------------------


def test_a_snapshot_is_a_read_only_copy_that_keeps_the_holes(work_dir):
    backend = make(work_dir, capacity=4 * GiB)
    vol = backend.create_volume("big", SizeRange(required=GiB), LINEAR)
    write_at(vol.device, 0, b"HEAD")
    write_at(vol.device, GiB - 4, b"TAIL")
    before = time.time_ns()
    snap = backend.create_snapshot("snap-1", "big")
    assert snap.id.startswith("snapshot-") and snap.id != vol.id
    assert (snap.source_volume_id, snap.size, snap.ready, snap.name) == ("big", GiB, True, "snap-1")
    assert before <= snap.created_ns <= time.time_ns()
    image = backend.snapshot_image_path(snap.id)
    info = os.stat(image)
    assert info.st_size == GiB
    assert info.st_blocks * 512 <= 2 * MiB, "the copy filled the holes"
    assert stat.S_IMODE(info.st_mode) == 0o444
    assert read_at(str(image), 0, 4) == b"HEAD" and read_at(str(image), GiB - 4, 4) == b"TAIL"
    assert read_at(str(image), MiB, 4) == bytes(4)
    assert snapshot_files(backend) == [f"{snap.id}.img", f"{snap.id}.json"]
    assert backend.get_snapshot(snap.id) == snap and backend.list_snapshots() == [snap]
    assert len(ours(work_dir.parent)) == 1, "a snapshot is never attached"


def test_create_snapshot_is_idempotent_by_name_and_source(work_dir):
    backend = make(work_dir)
    backend.create_volume("a", SizeRange(), LINEAR)
    backend.create_volume("b", SizeRange(), LINEAR)
    first = backend.create_snapshot("s", "a")
    while time.time_ns() <= first.created_ns:  # a new snapshot now would carry a later time
        pass
    assert backend.create_snapshot("s", "a") == first  # same id, same creation time
    with pytest.raises(SnapshotExists, match="of volume 'a', not 'b'"):
        backend.create_snapshot("s", "b")
    backend.close()
    assert make(work_dir).create_snapshot("s", "a") == first  # also after a restart
    assert snapshot_files(make(work_dir)) == [f"{first.id}.img", f"{first.id}.json"]


def test_snapshot_and_volume_ids_never_name_each_other(work_dir):
    backend = make(work_dir)
    vol = backend.create_volume("same", SizeRange(), LINEAR)
    snap = backend.create_snapshot("same", "same")
    assert snap.id != vol.id
    with pytest.raises(VolumeNotFound):
        backend.get_volume(snap.id)
    with pytest.raises(SnapshotNotFound):
        backend.get_snapshot(vol.id)
    backend.delete_volume(snap.id)  # names no volume: success, nothing touched
    backend.delete_snapshot(vol.id)
    assert [v.id for v in backend.list_volumes()] == ["same"] and backend.list_snapshots() == [snap]


def test_unknown_sources_and_ids(work_dir):
    backend = make(work_dir)
    with pytest.raises(SourceNotFound, match="no volume 'nope'"):
        backend.create_snapshot("s", "nope")
    for bad in ("../x", "snapshot-../x", "", "/etc/passwd"):
        with pytest.raises(SourceNotFound):
            backend.create_snapshot("s", bad)
        with pytest.raises(SnapshotNotFound):
            backend.get_snapshot(bad)
        backend.delete_snapshot(bad)  # unknown: success
    with pytest.raises(SourceNotFound, match="no snapshot 'snapshot-nope'"):
        backend.create_volume("r", SizeRange(), LINEAR, ContentSource(ContentSource.SNAPSHOT, "snapshot-nope"))
    with pytest.raises(SourceNotFound, match="no volume 'nope'"):
        backend.create_volume("c", SizeRange(), LINEAR, ContentSource(ContentSource.VOLUME, "nope"))
    backend.delete_snapshot("snapshot-nope")
    assert backend.list_volumes() == [] and backend.list_snapshots() == []
    assert os.listdir(backend.volumes_dir) == [] and snapshot_files(backend) == []


# -- restores and clones ------------------------------------------------------------------------------


def test_restore_to_a_larger_volume_holds_the_old_bytes_then_zeros(work_dir, tmp_path):
    backend = make(work_dir)
    vol = backend.create_volume("v", SizeRange(required=8 * MiB), LINEAR)
    fill(vol.device, 0, 8 * MiB, b"\x11")
    snap = backend.create_snapshot("s", "v")
    fill(vol.device, 0, 8 * MiB, b"\x22")  # overwritten after the snapshot
    source = ContentSource(ContentSource.SNAPSHOT, snap.id)
    restored = backend.create_volume("r", SizeRange(required=16 * MiB), LINEAR, source)
    assert (restored.size, restored.content_source) == (16 * MiB, source)
    assert block_size(restored.device) == 16 * MiB
    assert read_at(restored.device, 0, 8 * MiB) == b"\x11" * 8 * MiB
    assert read_at(restored.device, 8 * MiB, 8 * MiB) == bytes(8 * MiB)
    assert read_at(vol.device, 0, 4) == b"\x22" * 4
    assert stat.S_IMODE(os.stat(backend.image_path("r")).st_mode) == 0o600  # a volume is writable
    assert backend.get_volume("r") == restored and backend.list_volumes()[0] == restored
    # Retries: the same request is the same volume, another source is another volume.
    assert backend.create_volume("r", SizeRange(required=16 * MiB), LINEAR, source) == restored
    with pytest.raises(VolumeExists, match="content source snapshot"):
        backend.create_volume("r", SizeRange(required=16 * MiB), LINEAR, ContentSource(ContentSource.VOLUME, "v"))
    with pytest.raises(VolumeExists, match="content source"):
        backend.create_volume("r", SizeRange(required=16 * MiB), LINEAR)
    backend.close()
    restarted = make(work_dir)
    assert restarted.get_volume("r").content_source == source
    held = os.stat(backend.snapshot_image_path(snap.id)).st_blocks * 512  # >= 8 MiB: its data
    assert restarted.capacity(LINEAR).available == 64 * MiB - 24 * MiB - held


def test_restore_to_a_smaller_volume_is_out_of_range_and_leaves_nothing(work_dir, tmp_path):
    backend = make(work_dir)
    backend.create_volume("v", SizeRange(required=8 * MiB), LINEAR)
    snap = backend.create_snapshot("s", "v")
    source = ContentSource(ContentSource.SNAPSHOT, snap.id)
    with pytest.raises(OutOfRange, match="ask for at least 8388608 bytes"):
        backend.create_volume("r", SizeRange(required=4 * MiB, limit=4 * MiB), LINEAR, source)
    with pytest.raises(OutOfRange, match="snapshot"):
        backend.create_volume("r", SizeRange(limit=7 * MiB), LINEAR, source)
    assert sorted(os.listdir(backend.volumes_dir)) == ["v.img", "v.json"] and len(ours(tmp_path)) == 1
    # No range: the source's size.
    assert backend.create_volume("r", SizeRange(), LINEAR, source).size == 8 * MiB


def test_a_clone_is_a_copy_of_the_volume_as_it_is(work_dir):
    backend = make(work_dir)
    vol = backend.create_volume("v", SizeRange(required=8 * MiB), LINEAR)
    write_at(vol.device, 0, b"ORIG")
    write_at(vol.device, 8 * MiB - 4, b"TAIL")
    source = ContentSource(ContentSource.VOLUME, "v")
    clone = backend.create_volume("c", SizeRange(), LINEAR, source)
    assert (clone.size, clone.content_source) == (8 * MiB, source)
    assert read_at(clone.device, 0, 4) == b"ORIG" and read_at(clone.device, 8 * MiB - 4, 4) == b"TAIL"
    write_at(clone.device, 0, b"CLON")
    assert read_at(vol.device, 0, 4) == b"ORIG", "the clone shares nothing with its source"
    with pytest.raises(OutOfRange):
        backend.create_volume("c2", SizeRange(required=MiB, limit=MiB), LINEAR, source)


def test_snapshots_survive_the_deletion_of_their_volume(work_dir, tmp_path):
    backend = make(work_dir)
    vol = backend.create_volume("v", SizeRange(), LINEAR)
    write_at(vol.device, 0, b"KEEP")
    snap = backend.create_snapshot("s", "v")
    backend.delete_volume("v")
    assert backend.list_volumes() == [] and backend.list_snapshots() == [snap]
    restored = backend.create_volume("v", SizeRange(), LINEAR, ContentSource(ContentSource.SNAPSHOT, snap.id))
    assert read_at(restored.device, 0, 4) == b"KEEP"
    backend.delete_snapshot(snap.id)
    backend.delete_snapshot(snap.id)  # again: success
    assert backend.list_snapshots() == [] and snapshot_files(backend) == []
    assert read_at(restored.device, 0, 4) == b"KEEP", "a restored volume does not need its snapshot"


def test_open_removes_snapshot_leftovers(work_dir):
    backend = make(work_dir)
    backend.create_volume("v", SizeRange(), LINEAR)
    snap = backend.create_snapshot("s", "v")
    backend.close()
    sdir = work_dir / "snapshots"
    (sdir / "snapshot-orphan.img").write_bytes(b"x" * 4096)  # killed before its metadata
    os.chmod(sdir / "snapshot-orphan.img", 0o444)
    (sdir / "snapshot-half.json.tmp").write_text("{")
    (sdir / "snapshot-gone.json").write_text(  # killed between a delete's two removals
        (sdir / f"{snap.id}.json").read_text().replace(snap.id, "snapshot-gone")
    )
    (sdir / "README").write_text("not ours")
    repaired = make(work_dir)
    assert snapshot_files(repaired) == ["README", f"{snap.id}.img", f"{snap.id}.json"]
    assert repaired.list_snapshots() == [snap]


def _die_during(work_dir: Path, what: str, where: str) -> None:
    """Child: snapshot or restore, SIGKILLed in the middle of the copy or before the metadata's rename."""
    kill = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
    if where == "mid-copy":
        original = images._copy_range

        def copy_then_die(src_fd, dst_fd, start, end):
            original(src_fd, dst_fd, start, min(end, start + MiB))
            kill()

        images._reflink = lambda *args: False
        images._copy_range = copy_then_die
    else:
        images.write_atomically = kill
    backend = make(work_dir)
    if what == "snapshot":
        backend.create_snapshot("s", "v")
    else:
        backend.create_volume("r", SizeRange(), LINEAR, ContentSource(ContentSource.SNAPSHOT, sandbox_state.snapshot_id_for("s")))
    os._exit(0)


@pytest.mark.parametrize("where", ["mid-copy", "before the metadata"])
def test_kill_9_during_a_snapshot_or_restore_leaves_leftovers_that_open_removes(work_dir, tmp_path, where):
    backend = make(work_dir)
    vol = backend.create_volume("v", SizeRange(required=8 * MiB), LINEAR)
    fill(vol.device, 0, 8 * MiB, b"\x33")
    for what in ("snapshot", "restore"):
        child = multiprocessing.get_context("fork").Process(target=_die_during, args=(work_dir, what, where))
        child.start()
        child.join(timeout=60)
        assert child.exitcode == -signal.SIGKILL
        if what == "snapshot":
            assert snapshot_files(backend) == ["snapshot-s.img"]  # the leftover: not a snapshot
            assert backend.list_snapshots() == []
        else:
            assert "r.img" in os.listdir(backend.volumes_dir) and [v.id for v in backend.list_volumes()] == ["v"]
        backend.close()
        backend = make(work_dir)  # open() removes the leftover
        if what == "snapshot":
            assert snapshot_files(backend) == []
            snap = backend.create_snapshot("s", "v")  # the retry converges
            assert read_at(str(backend.snapshot_image_path(snap.id)), 0, 8 * MiB) == b"\x33" * 8 * MiB
        else:
            assert sorted(os.listdir(backend.volumes_dir)) == ["v.img", "v.json"]
            assert len(ours(tmp_path)) == 1
            restored = backend.create_volume("r", SizeRange(), LINEAR, ContentSource(ContentSource.SNAPSHOT, snap.id))
            assert read_at(restored.device, 0, 8 * MiB) == b"\x33" * 8 * MiB


def test_the_retry_of_a_killed_snapshot_converges_without_a_restart(work_dir):
    backend = make(work_dir)
    vol = backend.create_volume("v", SizeRange(required=8 * MiB), LINEAR)
    fill(vol.device, 0, 8 * MiB, b"\x44")
    child = multiprocessing.get_context("fork").Process(target=_die_during, args=(work_dir, "snapshot", "mid-copy"))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL
    snap = backend.create_snapshot("s", "v")  # same process, no open(): the leftover is replaced under the lock
    assert read_at(str(backend.snapshot_image_path(snap.id)), 0, 8 * MiB) == b"\x44" * 8 * MiB
    assert snapshot_files(backend) == [f"{snap.id}.img", f"{snap.id}.json"]


def test_copy_image_reflinks_where_the_file_system_can(loop_device, root_tmp_path):
    """On xfs (reflink=1) a copy is a reflink; on the host's work dir it is a sparse copy; both hold the same bytes."""
    if shutil.which("mkfs.xfs") is None:
        pytest.skip("needs mkfs.xfs")
    runner = SubprocessRunner(default_timeout=120)
    device = loop_device(512 * MiB)
    runner.run(["mkfs.xfs", "-q", "-f", "-m", "reflink=1", device])
    mount_point = root_tmp_path / "xfs"
    mount_point.mkdir()
    runner.run(["mount", device, str(mount_point)])
    results = {}
    for where in (mount_point, root_tmp_path):
        src = where / "src.img"
        with open(src, "wb") as f:
            f.truncate(64 * MiB)
            f.seek(32 * MiB)
            f.write(b"DATA" * 1024)
        how = images.copy_image(src, where / "dst.img", 64 * MiB, 80 * MiB, read_only=True)
        dst = where / "dst.img"
        assert os.path.getsize(dst) == 80 * MiB and stat.S_IMODE(os.stat(dst).st_mode) == 0o444
        assert read_at(str(dst), 32 * MiB, 4096) == b"DATA" * 1024 and read_at(str(dst), 70 * MiB, 8) == bytes(8)
        assert os.stat(dst).st_blocks * 512 <= MiB
        results[where] = how
    assert results[mount_point] == "reflink"
    host_fs = runner.run(["stat", "-f", "-c", "%T", str(root_tmp_path)]).stdout.strip()
    if host_fs in ("ext2/ext3", "tmpfs"):  # no reflinks there: the data ranges were copied
        assert results[root_tmp_path] == "sparse copy"
    runner.run(["umount", str(mount_point)])


def test_snapshots_hold_linear_space(work_dir):
    """A snapshot copy is real data: the linear free space shrinks by what it holds, and a copy that does
    not fit is refused (RESOURCE_EXHAUSTED)."""
    backend = make(work_dir, capacity=32 * MiB)
    vol = backend.create_volume("v", SizeRange(required=16 * MiB), LINEAR)
    fill(vol.device, 0, 8 * MiB, b"\x55")
    snap = backend.create_snapshot("s", "v")
    held = os.stat(backend.snapshot_image_path(snap.id)).st_blocks * 512
    assert held >= 8 * MiB
    free = backend.capacity(LINEAR).available
    assert free == 16 * MiB - held
    fill(vol.device, 0, 16 * MiB, b"\x66")
    with pytest.raises(PoolExhausted, match="not enough space for snapshot 't'"):
        backend.create_snapshot("t", "v")
    assert backend.list_snapshots() == [snap] and snapshot_files(backend) == [f"{snap.id}.img", f"{snap.id}.json"]
    backend.delete_snapshot(snap.id)
    assert backend.capacity(LINEAR).available == 16 * MiB


# -- thin volumes -------------------------------------------------------------------------------


def test_thin_admits_exactly_ratio_times_the_pool(work_dir):
    backend = make(work_dir, capacity=64 * MiB, overprovision_ratio=2.0)
    assert backend.capacity(THIN) == Capacity(128 * MiB, 128 * MiB, MiB)
    backend.create_volume("thick", SizeRange(required=16 * MiB), LINEAR)  # the pool is what linear leaves: 48 MiB
    assert backend.capacity(THIN) == Capacity(96 * MiB, 96 * MiB, MiB)
    with pytest.raises(OutOfRange, match="admits 96MiB"):
        backend.create_volume("t", SizeRange(required=96 * MiB + MiB), THIN)
    thin = backend.create_volume("t", SizeRange(required=96 * MiB), THIN)
    assert (thin.size, block_size(thin.device)) == (96 * MiB, 96 * MiB)
    assert thin.profile == THIN and os.stat(backend.image_path("t")).st_blocks == 0
    assert backend.capacity(THIN) == Capacity(0, 0, MiB)
    with pytest.raises(OutOfRange):
        backend.create_volume("t2", SizeRange(required=MiB), THIN)
    # Every byte of the pool is promised (96 MiB at 2.0): nothing is left for linear volumes.
    assert backend.capacity(LINEAR) == Capacity(0, 0, MiB)
    with pytest.raises(OutOfRange, match="promised to thin volumes"):
        backend.create_volume("l", SizeRange(required=MiB), LINEAR)
    backend.delete_volume("t")
    assert backend.capacity(THIN) == Capacity(96 * MiB, 96 * MiB, MiB)
    assert backend.capacity(LINEAR).available == 48 * MiB


def test_thin_volumes_are_recorded_with_their_pool(work_dir):
    backend = make(work_dir)
    vol = backend.create_volume("t", SizeRange(), Profile(Layout.THIN, pool="mypool"))
    assert dict(sandbox_state.parse_metadata("t", backend.metadata_path("t").read_text()).parameters) == {
        "type": "thin", "pool": "mypool",
    }
    backend.close()
    assert make(work_dir).get_volume("t") == vol
    with pytest.raises(VolumeExists, match="parameters"):
        make(work_dir).create_volume("t", SizeRange(), THIN)  # another pool


def test_above_the_high_water_mark_thin_and_snapshots_are_refused(work_dir):
    backend = make(work_dir, capacity=64 * MiB, full_percent=50.0)
    thin = backend.create_volume("t", SizeRange(required=32 * MiB), THIN)
    fill(thin.device, 0, 28 * MiB, b"\x77")  # 28 of 64 MiB: below 50%
    assert backend.capacity(THIN) == Capacity(32 * MiB, 32 * MiB, MiB)
    backend.create_snapshot("below", "t")  # 28 more: above
    assert backend.capacity(THIN) == Capacity(0, 0, MiB)
    with pytest.raises(PoolExhausted, match=r"thin pool csilvm-thinpool .* at or above the high-water mark of 50%"):
        backend.create_volume("t2", SizeRange(required=MiB), THIN)
    with pytest.raises(PoolExhausted, match="high-water mark"):
        backend.create_snapshot("above", "t")
    with pytest.raises(OutOfRange, match="high-water mark"):
        backend.expand_volume("t", SizeRange(required=33 * MiB))
    assert [s.name for s in backend.list_snapshots()] == ["below"] and len(os.listdir(backend.snapshots_dir)) == 2
    assert sorted(os.listdir(backend.volumes_dir)) == ["t.img", "t.json"]
    backend.delete_snapshot(backend.list_snapshots()[0].id)  # frees 28 MiB of data: below the mark again
    cap = backend.capacity(THIN)
    assert cap == Capacity(32 * MiB, 32 * MiB, MiB)  # min(64 - 32 promised, 64 - 28 of data)
    assert backend.create_volume("t2", SizeRange(required=cap.maximum_volume_size), THIN).size == 32 * MiB


def test_thin_expansion_is_bounded_by_overprovisioning(work_dir):
    backend = make(work_dir, capacity=64 * MiB, overprovision_ratio=2.0)
    thin = backend.create_volume("t", SizeRange(required=64 * MiB), THIN)
    with pytest.raises(OutOfRange, match="at most 134217728 bytes"):
        backend.expand_volume("t", SizeRange(required=128 * MiB + MiB))
    assert backend.get_volume("t").size == 64 * MiB
    assert backend.expand_volume("t", SizeRange(required=128 * MiB)) == 128 * MiB
    assert block_size(thin.device) == 128 * MiB and backend.capacity(THIN).available == 0
    with pytest.raises(InvalidParameters, match="type=thin"):
        backend.modify_volume("t", {"type": "linear"})
    with pytest.raises(InvalidParameters):
        backend.modify_volume("t", {"type": "thin"})


def test_a_thin_restore_reads_the_snapshot_and_is_thin(work_dir):
    backend = make(work_dir, capacity=64 * MiB, overprovision_ratio=2.0)
    vol = backend.create_volume("v", SizeRange(required=8 * MiB), LINEAR)
    write_at(vol.device, 4 * MiB, b"THIN")
    snap = backend.create_snapshot("s", "v")
    restored = backend.create_volume("r", SizeRange(required=32 * MiB), THIN, ContentSource(ContentSource.SNAPSHOT, snap.id))
    assert restored.profile == THIN and read_at(restored.device, 4 * MiB, 4) == b"THIN"
    assert os.stat(backend.image_path("r")).st_blocks * 512 <= MiB
    # The pool is 56 MiB (after 8 MiB linear) and holds a few KiB of data: 2 * 56 - 32 = 80 MiB more are admitted.
    assert backend.capacity(THIN) == Capacity(80 * MiB, 80 * MiB, MiB)
