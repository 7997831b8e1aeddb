"""Day two on real lvm2, inside the VM: volumes grow while published, change layout while in use,
report their health when a PV fails, and are wiped on delete — all through the plugin's socket."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import uuid
from pathlib import Path

import grpc
import pytest

from tests.vm.test_lvm_plugin import NO_UDEV, Loops, LvmPlugins, code_of, loops, lvm, lvm_plugin, lvs, vg_name  # noqa: F401

MiB = 1 << 20
GROW = 16 * MiB
PROFILES = {
    "linear": {"type": "linear"},
    "raid0": {"type": "raid0", "stripes": "2"},
    "raid1": {"type": "raid1", "mirrors": "1"},
}
# mkfs.xfs (Debian 12) refuses file systems under 300 MB; the kernel resizes btrfs only to 256 MiB or more.
FS_SIZES = {"ext4": 16 * MiB, "xfs": 304 * MiB, "btrfs": 256 * MiB}


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def device_size(path: str) -> int:
    return int(subprocess.run(["blockdev", "--getsize64", path], check=True, capture_output=True, text=True).stdout)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """One plugin on a VG of three 1200 MiB PVs (sparse), for the expansion matrix."""
    directory = tmp_path_factory.mktemp("day2")
    devices, plugins = Loops(directory), LvmPlugins(directory)
    try:
        vg = vg_name()
        yield vg, plugins(vg, devices(1200, 1200, 1200)), directory
    finally:
        plugins.close()
        devices.close()


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_published_volumes_grow_online_with_their_data(big, profile):
    """ext4, xfs and btrfs grow while published; a block volume's device grows; the data stays."""
    vg, plugin, directory = big
    csi = plugin.client
    for fs in (*FS_SIZES, "block"):
        block = fs == "block"
        size = 8 * MiB if block else FS_SIZES[fs]
        vol = csi.create(f"grow-{profile}-{fs}", size, parameters=PROFILES[profile], block=block)
        vid = vol.volume_id
        staging, target = directory / f"st-{vid}", directory / f"tg-{vid}"
        staging.mkdir()
        if block:
            csi.publish(vid, "", str(target), block=True)
            payload = os.urandom(MiB)
            with open(target, "r+b") as f:
                f.seek(size - MiB)
                f.write(payload)
        else:
            csi.stage(vid, str(staging), fs_type=fs)
            csi.publish(vid, str(staging), str(target), fs_type=fs)
            (target / "data").write_bytes(os.urandom(3 * MiB))
            before = sha256(target / "data")
            total_before = os.statvfs(target).f_blocks * os.statvfs(target).f_frsize

        grown = csi.expand(vid, vol.capacity_bytes + GROW, block=block)
        assert grown.capacity_bytes == vol.capacity_bytes + GROW
        assert grown.node_expansion_required is not block
        assert int(lvs(vg, "lv_size")[vid]["lv_size"]) == grown.capacity_bytes
        node = csi.node_expand(vid, str(target), "" if block else str(staging), required=grown.capacity_bytes)
        assert node.capacity_bytes == grown.capacity_bytes
        again = csi.node_expand(vid, str(target), "" if block else str(staging))  # idempotent
        assert again.capacity_bytes == grown.capacity_bytes

        if block:
            assert device_size(str(target)) == grown.capacity_bytes
            with open(target, "rb") as f:
                f.seek(size - MiB)
                assert f.read(MiB) == payload
            csi.unpublish(vid, str(target))
        else:
            total_after = os.statvfs(target).f_blocks * os.statvfs(target).f_frsize
            assert total_after >= total_before + GROW * 9 // 10, (fs, profile, total_before, total_after)
            drop_caches()
            assert sha256(target / "data") == before
            usage = {u.unit: u for u in csi.stats(vid, str(target)).usage}
            assert usage[1].total == total_after
            csi.unpublish(vid, str(target))
            csi.unstage(vid, str(staging))
        csi.delete(vid)


def test_expansion_takes_exactly_what_get_capacity_says(lvm_plugin, loops):
    vg = vg_name()
    csi = lvm_plugin(vg, loops(48, 48)).client
    for params in (PROFILES["linear"], PROFILES["raid0"]):
        vol = csi.create(f"exact-{params['type']}", 8 * MiB, parameters=params)
        free = csi.capacity(params).available_capacity
        step = csi.capacity(params).minimum_volume_size.value
        too_much = vol.capacity_bytes + free + step
        assert code_of(csi.expand, vol.volume_id, too_much) == grpc.StatusCode.OUT_OF_RANGE
        assert int(lvs(vg, "lv_size")[vol.volume_id]["lv_size"]) == vol.capacity_bytes, "nothing changed"
        assert csi.expand(vol.volume_id, vol.capacity_bytes + free).capacity_bytes == vol.capacity_bytes + free
        assert csi.capacity(params).available_capacity == 0
        assert csi.expand(vol.volume_id, 4 * MiB).capacity_bytes == vol.capacity_bytes + free  # never shrinks
        csi.delete(vol.volume_id)


def test_published_linear_volume_becomes_raid1_and_back_with_its_data(lvm_plugin, loops, tmp_path):
    vg = vg_name()
    csi = lvm_plugin(vg, loops(64, 64)).client
    vol = csi.create("modified", 24 * MiB)
    staging, target = tmp_path / "st", tmp_path / "tg"
    staging.mkdir()
    csi.stage(vol.volume_id, str(staging), fs_type="ext4")
    csi.publish(vol.volume_id, str(staging), str(target), fs_type="ext4")
    (target / "data").write_bytes(os.urandom(8 * MiB))
    before = sha256(target / "data")

    csi.modify(vol.volume_id, {"type": "raid1", "mirrors": "1"})
    lv = lvs(vg, "segtype", "data_copies", "lv_tags")[vol.volume_id]
    assert lv["segtype"] == "raid1" and lv["data_copies"] == "2", lv
    assert "csilvm.profile.type.raid1" in lv["lv_tags"]
    listed = {v.volume_id: v for v in csi.all_volumes()}[vol.volume_id]
    assert listed.volume_context["lvm.csi.csilvm.io/type"] == "raid1"
    drop_caches()
    assert sha256(target / "data") == before
    assert code_of(csi.modify, vol.volume_id, {"type": "raid1", "mirrors": "2"}) == grpc.StatusCode.OUT_OF_RANGE
    assert code_of(csi.modify, vol.volume_id, {"type": "raid0"}) == grpc.StatusCode.INVALID_ARGUMENT

    csi.modify(vol.volume_id, {"type": "linear"})
    lv = lvs(vg, "segtype", "lv_tags")[vol.volume_id]
    assert lv["segtype"] == "linear" and "csilvm.profile.type.linear" in lv["lv_tags"]
    drop_caches()
    assert sha256(target / "data") == before
    (target / "more").write_text("still writable")
    csi.unpublish(vol.volume_id, str(target))
    csi.unstage(vol.volume_id, str(staging))


def test_delete_wipes_what_the_volume_held_and_refuses_an_open_volume(lvm_plugin, loops, tmp_path):
    """Reports that cannot see activation (lvm2 --readonly) made every delete skip its wipe."""
    vg = vg_name()
    [pv] = loops(64)
    csi = lvm_plugin(vg, [pv]).client
    vol = csi.create("wiped", 16 * MiB)
    staging = tmp_path / "st"
    staging.mkdir()
    csi.stage(vol.volume_id, str(staging), fs_type="ext4")
    (staging / "secret").write_bytes(b"tenant data " * 1000)
    csi.unstage(vol.volume_id, str(staging))
    [seg] = json.loads(lvm("lvs", "--reportformat", "json", "-o", "seg_pe_ranges", f"{vg}/{vol.volume_id}"))["report"][0]["lv"]
    first, last = (int(n) for n in seg["seg_pe_ranges"].rsplit(":", 1)[1].split("-"))
    pe_start = int(json.loads(lvm("pvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", "pe_start", pv))["report"][0]["pv"][0]["pe_start"])

    def ends() -> tuple[bytes, bytes]:
        with open(pv, "rb") as f:
            f.seek(pe_start + first * MiB)
            head = f.read(MiB)
            f.seek(pe_start + last * MiB)
            return head, f.read(MiB)

    assert any(ends()[0]), "the ext4 superblock is on the PV"
    holder = os.open(f"/dev/{vg}/{vol.volume_id}", os.O_RDONLY)
    try:
        assert code_of(csi.delete, vol.volume_id) == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        os.close(holder)
    csi.delete(vol.volume_id)
    # The wipe went through the LV's device-mapper device, under the loop device's page cache, which
    # still holds what the first look read: read the PV afresh.
    drop_caches()
    head, tail = ends()
    assert not any(head) and not any(tail), "the volume's first and last MiB are zeroed on the PV"


def test_a_failed_pv_makes_its_volumes_abnormal_and_the_rest_keep_working(lvm_plugin, loops, tmp_path):
    big_pv, small_pv, under = loops(96, 64, 64)
    name = f"csilvm-fail-{uuid.uuid4().hex[:8]}"
    sectors = 64 * MiB // 512
    failing = f"/dev/mapper/{name}"
    subprocess.run(["dmsetup", "--noudevsync", "create", name, "--table", f"0 {sectors} linear {under} 0"], check=True)
    # lvm2 must see that PV through the device-mapper device only, not also through the loop under it
    # (which it also knows by other names, /dev/disk/by-diskseq/N): accept exactly the three PVs.
    accepted = ",".join(f'"a|^{dev}$|"' for dev in (big_pv, small_pv, failing))
    config = f'devices{{global_filter=[{accepted},"r|.*|"]}} activation{{udev_sync=0 udev_rules=0}}'
    vg = vg_name()
    try:
        plugin = lvm_plugin(vg, [big_pv, small_pv, failing], "--lvm-config", config)
        csi = plugin.client
        healthy = csi.create("healthy", 8 * MiB)  # linear: on the PV with the most room, big_pv
        mirror = csi.create("mirror", 8 * MiB, parameters={"type": "raid1", "mirrors": "2"})  # a leg on each PV
        targets = {}
        for vol in (healthy, mirror):
            staging, target = tmp_path / f"st-{vol.volume_id}", tmp_path / f"tg-{vol.volume_id}"
            staging.mkdir()
            csi.stage(vol.volume_id, str(staging), fs_type="ext4")
            csi.publish(vol.volume_id, str(staging), str(target), fs_type="ext4")
            targets[vol.volume_id] = target
            assert not csi.get_volume(vol.volume_id).status.volume_condition.abnormal
            assert not csi.stats(vol.volume_id, str(target)).volume_condition.abnormal

        subprocess.run(["dmsetup", "load", name, "--table", f"0 {sectors} error"], check=True)
        subprocess.run(["dmsetup", "resume", name], check=True)
        with open(targets[mirror.volume_id] / "poke", "wb") as f:  # the kernel meets the failed leg
            f.write(os.urandom(MiB))
            os.fsync(f.fileno())

        assert csi.probe().ready.value
        condition = csi.get_volume(mirror.volume_id).status.volume_condition
        assert condition.abnormal and condition.message, condition
        assert csi.stats(mirror.volume_id, str(targets[mirror.volume_id])).volume_condition.abnormal
        assert not csi.get_volume(healthy.volume_id).status.volume_condition.abnormal
        with open(targets[healthy.volume_id] / "still", "wb") as f:
            f.write(b"writes go on")
            os.fsync(f.fileno())
        with pytest.raises(grpc.RpcError) as err:
            csi.create("refused", 4 * MiB)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "missing physical volume" in err.value.details() and "vgreduce --removemissing" in err.value.details()
        assert "exit code" not in err.value.details()
        for params in PROFILES.values():
            assert csi.capacity(params).available_capacity == 0, params

        subprocess.run(["dmsetup", "load", name, "--table", f"0 {sectors} linear {under} 0"], check=True)
        subprocess.run(["dmsetup", "resume", name], check=True)
        for vol in (healthy, mirror):
            csi.unpublish(vol.volume_id, str(targets[vol.volume_id]))
            csi.unstage(vol.volume_id, str(tmp_path / f"st-{vol.volume_id}"))
    finally:
        subprocess.run(["dmsetup", "load", name, "--table", f"0 {sectors} linear {under} 0"], capture_output=True)
        subprocess.run(["dmsetup", "resume", name], capture_output=True)
        subprocess.run(["lvm", "vgremove", "-ff", "-y", vg, "--config", config], capture_output=True)
        subprocess.run(["lvm", "pvremove", "-ff", "-y", failing, "--config", config], capture_output=True)
        subprocess.run(["dmsetup", "remove", "--force", name], capture_output=True)
