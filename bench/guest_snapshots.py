"""Run inside the VM by ``python -m bench.vm`` (as a pytest module): snapshot and restore of a 1 GiB volume
holding 512 MiB of data on real lvm2, thick (linear) and thin, against a floor measured in the same run.

The floor is ``cp`` of the volume's whole device onto a fresh LV of the same size: the raw copy a thick
restore cannot beat.  Figures go to the JUnit file as the property ``figures`` (JSON).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from bench.snapshots import GiB, against_floor, fill


def test_snapshot_and_restore_of_1GiB_holding_512MiB(tmp_path, record_property):
    if os.environ.get("CSILVM_IN_VM") != "1":
        pytest.skip("runs inside the VM: python -m bench.vm")
    from tests.vm.test_lvm_plugin import Loops, LvmPlugins, vg_name

    devices, plugins = Loops(tmp_path), LvmPlugins(tmp_path)
    try:
        vg = vg_name()
        # Ratio 4: the volume, its snapshot and the restore each promise 1 GiB of the pool.
        plugin = plugins(vg, devices(2600, 2600), "--thin-pool-size", "1200MiB", "--thin-overprovision-ratio", "4")
        csi = plugin.client
        figures = {}
        for profile in ("linear", "thin"):
            volume = csi.create(f"bench-{profile}", GiB, parameters={"type": profile}, block=True).volume_id
            device = f"/dev/{vg}/{volume}"
            fill(device)
            started = time.perf_counter()
            snapshot = csi.snapshot(f"bench-{profile}-snap", volume).snapshot_id
            snapshot_s = time.perf_counter() - started
            started = time.perf_counter()
            restored = csi.create(
                f"bench-{profile}-restored", GiB, parameters={"type": profile}, block=True, from_snapshot=snapshot
            ).volume_id
            restore_s = time.perf_counter() - started
            floor = csi.create(f"bench-{profile}-floor", GiB, parameters={"type": "linear"}, block=True).volume_id
            started = time.perf_counter()
            subprocess.run(["cp", device, f"/dev/{vg}/{floor}"], check=True)
            subprocess.run(["sync", f"/dev/{vg}/{floor}"], check=True)
            floor_s = time.perf_counter() - started
            figures[profile] = against_floor(snapshot_s, restore_s, floor_s)
            for v in (restored, floor):
                csi.delete(v)
            csi.delete_snapshot(snapshot)
            csi.delete(volume)
        record_property("figures", json.dumps(figures))
        print(json.dumps(figures, indent=2))
    finally:
        plugins.close()
        devices.close()
