"""The plugin on real lvm2: `csilvm serve --backend lvm` driven over its socket, inside the VM.

Every claim of the lvm backend is checked against what lvm2 itself reports
(`lvs`, `vgs`): segment types, stripes, copies, exact capacity, pre-existing
LVs, publishing, deletion, restarts and concurrency.  The lvm2 commands the
plugin runs are counted through a PATH shim that logs each invocation.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import grpc
import pytest

from tests.plugin_process import Plugin, unmount_everything_below

MiB = 1 << 20
NO_UDEV = ["--config", "activation{udev_sync=0 udev_rules=0}"]


def lvm(*args: str) -> str:
    return subprocess.run(["lvm", *args], check=True, capture_output=True, text=True).stdout


def lvs(vg: str, *fields: str) -> dict[str, dict]:
    out = lvm("lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", ",".join(("lv_name",) + fields), vg)
    return {lv["lv_name"]: lv for lv in json.loads(out)["report"][0]["lv"]}


def code_of(call, *args, **kwargs) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call(*args, **kwargs)
    assert err.value.details()
    return err.value.code()


class Loops:
    """Loop devices on sparse files; detached and wiped by ``close``."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.made: list[str] = []

    def __call__(self, *sizes_mib: int) -> list[str]:
        devices = []
        for mib in sizes_mib:
            image = self.directory / f"pv-{len(self.made)}.img"
            with open(image, "wb") as f:
                f.truncate(mib * MiB)
            dev = subprocess.run(["losetup", "-f", "--show", str(image)], check=True, capture_output=True, text=True).stdout.strip()
            self.made.append(dev)
            devices.append(dev)
        return devices

    def close(self) -> None:
        for dev in self.made:
            subprocess.run(["wipefs", "-a", dev], capture_output=True)
            subprocess.run(["losetup", "-d", dev], capture_output=True)


class LvmPlugins:
    """Plugins on real lvm2, run with a PATH shim that logs every lvm2 subcommand to ``calls``."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.socket_dir = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))
        self.calls = directory / "lvm-calls.log"
        self.calls.touch()
        shim_dir = directory / "shim"
        shim_dir.mkdir()
        real = shutil.which("lvm")
        (shim_dir / "lvm").write_text(f'#!/bin/sh\necho "$1" >> "{self.calls}"\nexec "{real}" "$@"\n')
        (shim_dir / "lvm").chmod(0o755)
        self.env = {**os.environ, "PATH": f"{shim_dir}:{os.environ['PATH']}"}
        self.made: list[tuple[Plugin, str]] = []

    def __call__(self, vg: str, devices: list[str], *extra: str, start: bool = True) -> Plugin:
        p = Plugin(
            self.directory / "state",
            self.socket_dir / f"{vg}.sock",
            ["--backend", "lvm", "--volume-group", vg, "--devices", ",".join(devices), "--default-size", "8MiB", *extra],
            env=self.env,
            client_timeout=600,  # lvm2 under emulation: seconds per command, and creates queue up
        )
        self.made.append((p, vg))
        if start:
            p.start(timeout=180)
        return p

    def close(self) -> None:
        for p, _ in self.made:
            p.stop()
        unmount_everything_below(self.directory)
        for vg in {vg for _, vg in self.made}:
            subprocess.run(["lvm", "vgremove", "-ff", "-y", vg, *NO_UDEV], capture_output=True)
        shutil.rmtree(self.socket_dir, ignore_errors=True)


@pytest.fixture
def loops(tmp_path):
    made = Loops(tmp_path)
    yield made
    made.close()


@pytest.fixture
def lvm_plugin(tmp_path, loops):
    plugins = LvmPlugins(tmp_path)
    yield plugins
    plugins.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One plugin on one VG of three unequal PVs, for the tests that can share it (each uses its own names)."""
    directory = tmp_path_factory.mktemp("shared")
    devices, plugins = Loops(directory), LvmPlugins(directory)
    try:
        vg = vg_name()
        plugin = plugins(vg, devices(400, 80, 96))  # the big one takes an xfs volume (>= 300 MB)
        yield vg, plugin, plugins.calls
    finally:
        plugins.close()
        devices.close()


def vg_name() -> str:
    return "vg" + uuid.uuid4().hex[:8]


# ------------------------------------------------------------------ the VG
def test_volume_group_is_created_once_and_mismatches_are_refused(lvm_plugin, loops):
    devices = loops(64, 96)
    vg = vg_name()
    first = lvm_plugin(vg, devices)
    report = json.loads(lvm("vgs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", "vg_extent_size,vg_tags,pv_count", vg))
    [row] = report["report"][0]["vg"]
    assert int(row["vg_extent_size"]) == MiB and row["vg_tags"] == "csilvm" and int(row["pv_count"]) == 2
    first.kill(signal.SIGTERM)
    again = lvm_plugin(vg, devices)  # finds it and leaves it as it is
    assert again.client.probe().ready.value
    again.kill(signal.SIGTERM)
    other = loops(32)
    wrong = lvm_plugin(vg, devices[:1] + other, start=False)
    result = subprocess.run(wrong.command(), capture_output=True, text=True, timeout=120, env=wrong.env)
    assert result.returncode != 0 and vg in result.stderr


# ---------------------------------------------------------------- layouts
LAYOUTS = [
    ({"type": "linear"}, "linear", 1, 1),
    ({"type": "raid0", "stripes": "2"}, "raid0", 2, 1),
    ({"type": "raid0", "stripes": "3"}, "raid0", 3, 1),
    ({"type": "raid1"}, "raid1", 2, 2),
    ({"type": "raid1", "mirrors": "2"}, "raid1", 3, 3),
]


def test_layouts_are_what_lvm2_reports(shared):
    vg, plugin, _ = shared
    csi = plugin.client
    for i, (params, segtype, stripes, copies) in enumerate(LAYOUTS):
        vol = csi.create(f"layout-{i}", 6 * MiB, parameters=params)
        lv = lvs(vg, "segtype", "stripes", "data_copies", "lv_size")[vol.volume_id]
        assert lv["segtype"] == segtype, params
        assert int(lv["stripes"]) == stripes and int(lv["data_copies"]) == copies, (params, lv)
        assert int(lv["lv_size"]) == vol.capacity_bytes
    before = set(lvs(vg))
    assert code_of(csi.create, "no-room-1", MiB, parameters={"type": "raid1", "mirrors": "3"}) == grpc.StatusCode.OUT_OF_RANGE
    assert code_of(csi.create, "no-room-0", 4 * MiB, parameters={"type": "raid0", "stripes": "4"}) == grpc.StatusCode.OUT_OF_RANGE
    assert set(lvs(vg)) == before, "a refused create leaves nothing behind"


# ---------------------------------------------------------------- capacity
CAPACITY_PROFILES = [{"type": "linear"}, {"type": "raid0", "stripes": "2"}, {"type": "raid0", "stripes": "3"},
                     {"type": "raid1"}, {"type": "raid1", "mirrors": "2"}]


@pytest.mark.parametrize("sizes", [(48, 48, 48), (40, 56, 72)], ids=["equal", "unequal"])
def test_maximum_volume_size_is_exact(lvm_plugin, loops, sizes):
    vg = vg_name()
    csi = lvm_plugin(vg, loops(*sizes)).client
    csi.create("partly-used", 5 * MiB)  # capacity must account for what is already there
    for i, params in enumerate(CAPACITY_PROFILES):
        cap = csi.capacity(params)
        maximum, step = cap.maximum_volume_size.value, cap.minimum_volume_size.value
        assert maximum > 0 and cap.available_capacity >= maximum, params
        free_before = cap.available_capacity
        assert code_of(csi.create, f"over-{i}", maximum + step, parameters=params) == grpc.StatusCode.OUT_OF_RANGE
        vol = csi.create(f"max-{i}", maximum, parameters=params)  # sizes vs lvs: test_layouts
        assert vol.capacity_bytes == maximum
        assert csi.capacity(params).available_capacity < free_before
        csi.delete(vol.volume_id)
        assert csi.capacity(params).available_capacity == free_before, "deletion gives the space back"


# ------------------------------------------------------------ pre-existing
def test_pre_existing_lvs_are_listed_published_and_keep_data(lvm_plugin, loops, tmp_path):
    vg = vg_name()
    devices = loops(64, 64)
    lvm("pvcreate", "-y", *devices, *NO_UDEV)
    lvm("vgcreate", "--physicalextentsize", "1m", "--addtag", "csilvm", vg, *devices, *NO_UDEV)
    lvm("lvcreate", "-y", "-n", "handmade", "-L", "12m", vg, *NO_UDEV)
    lvm("lvcreate", "-y", "-n", "tagged", "-L", "7m", "--addtag", "owner.ops", vg, *NO_UDEV)
    subprocess.run(["mkfs.ext4", "-q", f"/dev/{vg}/handmade"], check=True)
    mnt = tmp_path / "seed"
    mnt.mkdir()
    subprocess.run(["mount", f"/dev/{vg}/handmade", str(mnt)], check=True)
    (mnt / "old.txt").write_text("made before the plugin")
    subprocess.run(["umount", str(mnt)], check=True)

    csi = lvm_plugin(vg, devices).client
    volumes = {v.volume_id: v for v in csi.all_volumes()}
    assert volumes["handmade"].capacity_bytes == 12 * MiB
    assert volumes["tagged"].capacity_bytes == 7 * MiB
    assert "owner.ops" in volumes["tagged"].volume_context["lvm.csi.csilvm.io/tags"]
    staging, target = tmp_path / "staging", tmp_path / "target"
    staging.mkdir()
    csi.stage("handmade", str(staging), fs_type="ext4")
    csi.publish("handmade", str(staging), str(target), fs_type="ext4")
    assert (target / "old.txt").read_text() == "made before the plugin"
    csi.unpublish("handmade", str(target))
    csi.unstage("handmade", str(staging))


# --------------------------------------------------------------- publishing
def test_ext4_xfs_block_and_readonly_publishing(shared, tmp_path):
    vg, plugin, _ = shared
    csi = plugin.client
    for fs, size in (("ext4", 16 * MiB), ("xfs", 320 * MiB)):
        vol = csi.create(f"fs-{fs}", size)
        staging, target = tmp_path / f"st-{fs}", tmp_path / f"tg-{fs}"
        staging.mkdir()
        csi.stage(vol.volume_id, str(staging), fs_type=fs)
        csi.publish(vol.volume_id, str(staging), str(target), fs_type=fs)
        (target / "data").write_text(fs)
        df = os.statvfs(target)
        usage = {u.unit: u for u in csi.stats(vol.volume_id, str(target)).usage}
        assert usage[1].total == df.f_blocks * df.f_frsize
        csi.unpublish(vol.volume_id, str(target))
        csi.unstage(vol.volume_id, str(staging))
        csi.stage(vol.volume_id, str(staging), fs_type=fs)
        csi.publish(vol.volume_id, str(staging), str(target), fs_type=fs, readonly=True)
        assert (target / "data").read_text() == fs
        with pytest.raises(OSError):
            (target / "more").write_text("refused")
        csi.unpublish(vol.volume_id, str(target))
        csi.unstage(vol.volume_id, str(staging))

    raw = csi.create("raw", 4 * MiB, block=True)
    target = tmp_path / "raw-target"
    csi.publish(raw.volume_id, "", str(target), block=True)
    payload = os.urandom(4096)
    with open(target, "r+b") as f:
        f.seek(MiB)
        f.write(payload)
        os.fsync(f.fileno())
    with open(f"/dev/{vg}/raw", "rb") as dev:
        dev.seek(MiB)
        assert dev.read(4096) == payload
    csi.unpublish(raw.volume_id, str(target))


def test_deleted_volume_leaves_no_file_system_behind(shared, tmp_path):
    vg, plugin, _ = shared
    csi = plugin.client
    vol = csi.create("recycle", 16 * MiB)
    staging = tmp_path / "st"
    staging.mkdir()
    csi.stage(vol.volume_id, str(staging))
    csi.unstage(vol.volume_id, str(staging))
    csi.delete(vol.volume_id)
    assert "recycle" not in lvs(vg)
    again = csi.create("recycle", 16 * MiB)
    probe = subprocess.run(["blkid", "-p", f"/dev/{vg}/{again.volume_id}"], capture_output=True, text=True)
    assert probe.returncode == 2, f"an old signature survived: {probe.stdout}"
    csi.delete(again.volume_id)


def with_prefix(vg: str, prefix: str) -> list[str]:
    return sorted(name for name in lvs(vg) if name.startswith(prefix))


# ------------------------------------------------------- restart, concurrency
def test_kill_9_during_creates_then_replay(shared):
    vg, plugin, _ = shared
    names = [f"replay-{i}" for i in range(6)]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(lambda: [plugin.client.create(n, 2 * MiB) for n in names])
        while len(with_prefix(vg, "replay-")) < 2:  # some creates are done, the rest in flight
            pass
        plugin.kill(signal.SIGKILL)
        with pytest.raises(grpc.RpcError):
            future.result()
    csi = plugin.start(timeout=180)
    for n in names:
        assert csi.create(n, 2 * MiB).volume_id == n
    assert with_prefix(vg, "replay-") == sorted(names), "every volume exactly once, nothing leaked"


def test_parallel_creates_make_one_lv_per_name(shared):
    vg, plugin, _ = shared
    csi = plugin.client
    names = [f"par-{i % 8}" for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        ids = set(pool.map(lambda n: csi.create(n, MiB).volume_id, names))
    assert ids == set(names)
    assert with_prefix(vg, "par-") == sorted(set(names))


def test_lvm2_commands_per_rpc_on_real_lvm2(shared):
    _, plugin, log = shared
    csi = plugin.client

    def cost(call) -> list[str]:
        before = len(log.read_text().splitlines())
        call()
        return sorted(log.read_text().splitlines()[before:])

    assert cost(lambda: csi.create("counted", 4 * MiB)) == ["fullreport", "lvcreate"]
    assert cost(lambda: csi.create("counted", 4 * MiB)) == ["fullreport"]
    assert cost(lambda: csi.capacity({"type": "raid1"})) == ["fullreport"]
    assert cost(lambda: csi.all_volumes(page_size=1000)) == ["fullreport"]
    assert cost(csi.probe) == ["fullreport"]
    assert cost(lambda: csi.delete("counted")) == ["fullreport", "lvremove"]
    assert cost(lambda: csi.delete("counted")) == ["fullreport"]
