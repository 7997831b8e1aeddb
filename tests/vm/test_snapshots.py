"""Snapshots, restores, clones and thin pools on real lvm2, inside the VM, through the plugin's socket.

Each check writes known bytes through a published volume, snapshots or clones
it, overwrites the original, and reads the old bytes back from the new volume.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import grpc
import pytest

from tests.vm.test_lvm_plugin import Loops, LvmPlugins, code_of, lvs, vg_name

MiB = 1 << 20
PROFILES = {
    "linear": {"type": "linear"},
    "raid0": {"type": "raid0", "stripes": "2"},
    "raid1": {"type": "raid1", "mirrors": "1"},
    "thin": {"type": "thin"},
}


def pattern(seed: str, size: int) -> bytes:
    block = hashlib.sha256(seed.encode()).digest() * (MiB // 32)
    return (block * (size // len(block) + 1))[:size]


def read(path: Path | str, size: int, offset: int = 0) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        return f.read(size)


def write(path: Path | str, data: bytes) -> None:
    with open(path, "r+b", buffering=0) as f:
        f.write(data)
        os.fsync(f.fileno())


def copying(pid: int, device: str) -> bool:
    """Whether process ``pid`` has ``device`` open (compared by device number, whatever path it used)."""
    try:
        rdev = os.stat(device).st_rdev
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.stat(f"/proc/{pid}/fd/{fd}").st_rdev == rdev:
                return True
        except OSError:
            continue
    return False


@pytest.fixture(scope="module")
def snap(tmp_path_factory):
    """One plugin on three PVs of 400 MiB, with a 160 MiB thin pool created on first use."""
    directory = tmp_path_factory.mktemp("snapshots")
    devices, plugins = Loops(directory), LvmPlugins(directory)
    try:
        vg = vg_name()
        plugin = plugins(vg, devices(400, 400, 400), "--thin-pool-size", "160MiB")
        yield vg, plugin, directory
    finally:
        plugins.close()
        devices.close()


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_block_snapshot_restore_and_clone_give_back_the_bytes(snap, profile):
    vg, plugin, directory = snap
    csi = plugin.client
    size = 16 * MiB
    src = csi.create(f"src-{profile}", size, parameters=PROFILES[profile], block=True).volume_id
    target = directory / f"tg-{src}"
    csi.publish(src, "", str(target), block=True)
    old, new = pattern(f"old-{profile}", size), pattern(f"new-{profile}", size)
    write(target, old)

    snapshot = csi.snapshot(f"snap-{profile}", src)
    assert snapshot.ready_to_use and snapshot.size_bytes == size and snapshot.source_volume_id == src
    assert abs(snapshot.creation_time.seconds - time.time()) < 600
    assert csi.snapshot(f"snap-{profile}", src) == snapshot  # idempotent
    # Source, size, time and the source's profile live in the snapshot's tags: a restart loses nothing.
    tags = lvs(vg, "lv_tags")[snapshot.snapshot_id]["lv_tags"].split(",")
    assert f"csilvm.source.{src}" in tags and f"csilvm.size.{size}" in tags
    assert f"csilvm.profile.type.{profile}" in tags
    write(target, new)

    # A restore larger than its source: the old bytes, then zeros.
    restored = csi.create(f"restored-{profile}", size + 8 * MiB, parameters=PROFILES[profile], block=True, from_snapshot=snapshot.snapshot_id)
    assert restored.content_source.snapshot.snapshot_id == snapshot.snapshot_id
    assert restored.capacity_bytes == size + 8 * MiB
    device = f"/dev/{vg}/{restored.volume_id}"
    assert read(device, size) == old
    assert read(device, 8 * MiB, size) == bytes(8 * MiB)
    assert code_of(csi.create, f"small-{profile}", size - 4 * MiB, parameters=PROFILES[profile], block=True, from_snapshot=snapshot.snapshot_id) == grpc.StatusCode.OUT_OF_RANGE

    # Across kinds: a thin snapshot restored into a thick volume, a thick one into a thin volume (block copies).
    other = PROFILES["linear" if profile == "thin" else "thin"]
    across = csi.create(f"across-{profile}", size, parameters=other, block=True, from_snapshot=snapshot.snapshot_id)
    assert read(f"/dev/{vg}/{across.volume_id}", size) == old
    csi.delete(across.volume_id)

    clone = csi.create(f"clone-{profile}", size, parameters=PROFILES[profile], block=True, from_volume=src)
    assert clone.content_source.volume.volume_id == src
    assert read(f"/dev/{vg}/{clone.volume_id}", size) == new
    assert not [lv for lv in lvs(vg) if lv.endswith(".src")], "the clone's temporary snapshot is gone"

    csi.unpublish(src, str(target))
    for volume in (restored.volume_id, clone.volume_id):
        csi.delete(volume)
    if profile == "thin":
        csi.delete(src)  # thin snapshots outlive their origin
        again = csi.create(f"again-{profile}", size, parameters=PROFILES[profile], block=True, from_snapshot=snapshot.snapshot_id)
        assert read(f"/dev/{vg}/{again.volume_id}", size) == old
        csi.delete(again.volume_id)
    else:
        with pytest.raises(grpc.RpcError) as err:
            csi.delete(src)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert snapshot.snapshot_id in err.value.details()
    csi.delete_snapshot(snapshot.snapshot_id)
    csi.delete_snapshot(snapshot.snapshot_id)  # idempotent
    assert code_of(csi.get_snapshot, snapshot.snapshot_id) == grpc.StatusCode.NOT_FOUND
    csi.delete(src)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_mounted_file_system_snapshot_restores_consistent(snap, profile):
    vg, plugin, directory = snap
    csi = plugin.client
    src = csi.create(f"fs-{profile}", 32 * MiB, parameters=PROFILES[profile], fs_type="ext4").volume_id
    staging, target = directory / f"st-{src}", directory / f"tg-{src}"
    staging.mkdir()
    csi.stage(src, str(staging), fs_type="ext4")
    csi.publish(src, str(staging), str(target), fs_type="ext4")
    old = os.urandom(5 * MiB)
    (target / "data").write_bytes(old)  # not synced: the snapshot must see it anyway
    snapshot = csi.snapshot(f"fs-snap-{profile}", src)
    (target / "data").write_bytes(os.urandom(5 * MiB))

    restored = csi.create(f"fs-restored-{profile}", 48 * MiB, parameters=PROFILES[profile], fs_type="ext4", from_snapshot=snapshot.snapshot_id)
    rid = restored.volume_id
    r_staging, r_target = directory / f"st-{rid}", directory / f"tg-{rid}"
    r_staging.mkdir()
    csi.stage(rid, str(r_staging), fs_type="ext4")  # grows the file system to the larger volume
    csi.publish(rid, str(r_staging), str(r_target), fs_type="ext4")
    assert (r_target / "data").read_bytes() == old
    # Grown: a file system made on the 32 MiB source has less than 32 MiB of blocks.
    assert os.statvfs(r_target).f_blocks * os.statvfs(r_target).f_frsize > 36 * MiB
    for vid, st, tg in ((rid, r_staging, r_target), (src, staging, target)):
        csi.unpublish(vid, str(tg))
        csi.unstage(vid, str(st))
    csi.delete(rid)
    csi.delete_snapshot(snapshot.snapshot_id)
    csi.delete(src)


def test_list_snapshots_pages_and_filters(snap):
    vg, plugin, directory = snap
    csi = plugin.client
    a = csi.create("list-a", 8 * MiB, parameters=PROFILES["thin"], block=True).volume_id
    b = csi.create("list-b", 8 * MiB, parameters=PROFILES["thin"], block=True).volume_id
    ids = {csi.snapshot(name, src).snapshot_id for name, src in (("l1", a), ("l2", a), ("l3", b))}
    first = csi.list_snapshots(max_entries=2)
    assert len(first.entries) == 2 and first.next_token
    seen, page = [], first
    while True:
        assert len(page.entries) <= 2
        seen += [e.snapshot.snapshot_id for e in page.entries]
        if not page.next_token:
            break
        page = csi.list_snapshots(max_entries=2, starting_token=page.next_token)
    assert len(seen) == len(set(seen)) and ids <= set(seen)
    assert {e.snapshot.snapshot_id for e in csi.list_snapshots(source_volume_id=a).entries} == {
        s for s in ids if csi.get_snapshot(s).source_volume_id == a
    }
    one = next(iter(ids))
    assert [e.snapshot.snapshot_id for e in csi.list_snapshots(snapshot_id=one).entries] == [one]
    assert code_of(csi.list_snapshots, starting_token="bogus") == grpc.StatusCode.ABORTED
    # Volumes are not snapshots and snapshots are not volumes.
    assert not ids & {v.volume_id for v in csi.all_volumes()}
    csi.delete(one)  # DeleteVolume of a snapshot id removes nothing
    assert csi.get_snapshot(one).snapshot_id == one
    assert code_of(csi.snapshot, "l1", b) == grpc.StatusCode.ALREADY_EXISTS
    for s in ids:
        csi.delete_snapshot(s)
    csi.delete(a)
    csi.delete(b)


def test_thin_overprovisioning_and_high_water_mark(tmp_path):
    """Ratio 2.0 on a 64 MiB pool admits 128 MiB of thin volumes, one extent more is refused; a pool
    above the high-water mark refuses volumes and snapshots, GetCapacity says 0, its volumes are abnormal."""
    devices, plugins = Loops(tmp_path), LvmPlugins(tmp_path)
    try:
        vg = vg_name()
        plugin = plugins(
            vg, devices(200), "--thin-pool-size", "64MiB", "--thin-overprovision-ratio", "2.0",
            "--thin-pool-full-percent", "50",
        )
        csi = plugin.client
        thin = PROFILES["thin"]
        assert csi.capacity(thin).available_capacity == 128 * MiB
        assert code_of(csi.create, "too-big", 128 * MiB + MiB, parameters=thin, block=True) == grpc.StatusCode.OUT_OF_RANGE
        first = csi.create("first", 100 * MiB, parameters=thin, block=True).volume_id
        pool = lvs(vg, "lv_size", "segtype")["csilvm-thinpool"]
        assert pool["segtype"] == "thin-pool" and int(pool["lv_size"]) == 64 * MiB
        assert csi.capacity(thin).available_capacity == 28 * MiB
        assert code_of(csi.create, "second", 29 * MiB, parameters=thin, block=True) == grpc.StatusCode.OUT_OF_RANGE
        assert code_of(csi.expand, first, 129 * MiB, block=True) == grpc.StatusCode.OUT_OF_RANGE
        # Fill the pool past 50%: 40 of its 64 MiB.
        target = tmp_path / "first"
        csi.publish(first, "", str(target), block=True)
        write(target, os.urandom(40 * MiB))
        assert csi.capacity(thin).available_capacity == 0
        with pytest.raises(grpc.RpcError) as err:
            csi.create("second", 8 * MiB, parameters=thin, block=True)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "csilvm-thinpool" in err.value.details()
        assert code_of(csi.snapshot, "snap", first) == grpc.StatusCode.RESOURCE_EXHAUSTED
        condition = csi.get_volume(first).status.volume_condition
        assert condition.abnormal and "high-water" in condition.message
        # Linear volumes are unaffected by the thin pool's fill.
        assert csi.capacity({"type": "linear"}).available_capacity > 0
        csi.unpublish(first, str(target))
        csi.delete(first)
        assert csi.capacity(thin).available_capacity == 128 * MiB
    finally:
        plugins.close()
        devices.close()


def test_kill_9_during_a_thick_copy_then_the_retry_converges(tmp_path):
    devices, plugins = Loops(tmp_path), LvmPlugins(tmp_path)
    try:
        vg = vg_name()
        plugin = plugins(vg, devices(400, 400, 400))
        csi = plugin.client
        size = 192 * MiB
        src = csi.create("kill-src", size, parameters=PROFILES["linear"], block=True).volume_id
        target = tmp_path / "kill-src"
        csi.publish(src, "", str(target), block=True)
        data = pattern("kill", size)
        write(target, data)
        snapshot = csi.snapshot("kill-snap", src).snapshot_id

        errors: list[BaseException] = []

        def restore():
            try:
                csi.create("kill-restored", size, parameters=PROFILES["raid1"], block=True, from_snapshot=snapshot)
            except BaseException as exc:  # the kill cuts the call
                errors.append(exc)

        caller = threading.Thread(target=restore)
        caller.start()
        # Kill the plugin while it holds the new LV open: in the middle of the copy.
        device = f"/dev/{vg}/kill-restored"
        while caller.is_alive() and not copying(plugin.proc.pid, device):
            time.sleep(0.002)
        assert copying(plugin.proc.pid, device), f"the copy was never seen: {errors}\n{plugin.log()[-3000:]}"
        plugin.kill()
        caller.join(60)
        assert errors, "the CreateVolume call survived a kill -9 of the plugin"
        assert "csilvm.incomplete" in lvs(vg, "lv_tags")["kill-restored"]["lv_tags"]
        csi = plugin.start(timeout=180)
        assert "kill-restored" in {v.volume_id for v in csi.all_volumes()}
        condition = csi.get_volume("kill-restored").status.volume_condition
        assert condition.abnormal and "incomplete" in condition.message
        staging = tmp_path / "st-kill"
        staging.mkdir()
        assert code_of(csi.publish, "kill-restored", "", str(tmp_path / "tg-kill"), block=True) == grpc.StatusCode.FAILED_PRECONDITION
        restored = csi.create("kill-restored", size, parameters=PROFILES["raid1"], block=True, from_snapshot=snapshot)
        assert restored.volume_id == "kill-restored"
        assert "csilvm.incomplete" not in lvs(vg, "lv_tags")["kill-restored"]["lv_tags"]
        assert hashlib.sha256(read(device, size)).digest() == hashlib.sha256(data).digest()
        csi.unpublish(src, str(target))
    finally:
        plugins.close()
        devices.close()
