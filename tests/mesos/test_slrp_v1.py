"""The SLRP's life cycle of disks over CSI v1, against ``test-csi-plugin`` on the loop sandbox (and a VG in the VM)."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from tests.mesos.conftest import needs_root
from tests.mesos.harness import MiB, BackendSpec, CsiV1, load_profiles, plugin_command, size_for
from tests.plugin_process import REPO

pytestmark = needs_root

HANDSHAKE_V1 = ["GetPluginInfo", "GetPluginCapabilities", "Probe", "ControllerGetCapabilities", "NodeGetCapabilities", "NodeGetInfo"]


def test_slrp_life_cycle_on_the_loop_sandbox(slrp):
    replay = slrp("v1", BackendSpec("loop", available="1GB", volumes={"pre-a": "3MB", "pre-b": "5MB"}))
    report = replay.run()

    assert report.calls[: len(HANDSHAKE_V1)] == HANDSHAKE_V1
    n = len(load_profiles())
    assert report.calls[len(HANDSHAKE_V1): len(HANDSHAKE_V1) + n] == ["GetCapacity"] * n
    assert report.calls[len(HANDSHAKE_V1) + n] == "ListVolumes"
    assert report.handshake["node_id"] == "localhost"
    # Pre-provisioned volumes are pre-existing disks, not counted in the available capacity.
    assert {d.id: d.capacity for d in report.pre_existing} == {"pre-a": 3 * MiB, "pre-b": 5 * MiB}
    assert report.initial_capacity == {"raid0": 0, "raid1": 0, "fast": 1 << 30, "block": 1 << 30}
    # The sandbox is linear only: raid profiles are offered nothing, and CreateVolume refuses them.
    assert set(report.skipped) == {"raid0", "raid1"}
    assert report.exercised == ["fast", "block"]
    assert report.killed_during == "fast"
    assert report.calls.count("NodePublishVolume") == 2


def test_volumes_and_ids_survive_restarts(slrp):
    replay = slrp("v1", BackendSpec("loop", available="64MB", volumes={"pre": "2MB"}))
    block = next(p for p in load_profiles() if p.block)
    replay.container.launch()
    api = replay.connect()
    name, size = str(uuid.uuid4()), size_for(block)
    disk = api.create(name, size, block)
    assert replay.container.stop() == 0
    replay.container.launch()
    api = replay.connect()
    assert {d.id: d.capacity for d in api.list_volumes()} == {"pre": 2 * MiB, disk.id: size}
    assert api.create(name, size, block).id == disk.id
    assert api.capacity(block) == 64 * MiB - size
    api.delete(disk.id)
    assert api.capacity(block) == 64 * MiB


def test_a_second_plugin_on_a_live_socket_is_refused(containers):
    first = containers({"CSI_AVAILABLE_CAPACITY": "8MB"})
    first.launch()
    env = {"PATH": os.environ["PATH"], "CSI_ENDPOINT": first.endpoint, "CSI_WORK_DIR": str(first.work_dir.parent / "other")}
    second = subprocess.run(plugin_command(), cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode != 0
    assert "another process is serving" in second.stderr
    api = CsiV1(first.endpoint)
    try:
        assert api.handshake()["ready"]  # the first one still serves
    finally:
        api.close()


@pytest.mark.skipif(os.environ.get("CSILVM_IN_VM") != "1", reason="needs device-mapper: python -m tests.vm.runner -- tests/mesos/test_slrp_v1.py")
def test_slrp_life_cycle_on_a_volume_group(slrp, tmp_path):
    """The same replay on a VG of three 256 MiB PVs (1 MiB extents): raid0 and raid1 are offered and used."""
    from lvm.command import SubprocessRunner

    run = SubprocessRunner(default_timeout=180).run
    vg = f"mesos{uuid.uuid4().hex[:8]}"
    devices = []
    replay = slrp("v1", BackendSpec("lvm", volume_group=vg))
    try:
        for i in range(3):
            image = tmp_path / f"pv{i}.img"
            with open(image, "wb") as f:
                f.truncate(256 * MiB)
            devices.append(run(["losetup", "-f", "--show", str(image)]).stdout.strip())
        run(["vgcreate", "--physicalextentsize", "1m", vg, *devices])
        report = replay.run()
        assert report.skipped == {}
        assert report.exercised == ["raid0", "raid1", "fast", "block"]
    finally:
        replay.cleanup()  # unmount first, or the VG cannot be removed
        if devices:
            run(["vgremove", "-f", vg], ok_codes=(0, 5))
        for dev in devices:
            run(["wipefs", "-a", dev], ok_codes=(0, 1))
            run(["losetup", "-d", dev], ok_codes=(0, 1))
