"""Real LVM end to end at the lvm2 level: linear, raid0 and raid1 volumes on loop-device PVs.

Runs only inside the test VM (``python -m tests.vm.runner -- tests/vm``) or on
another machine with device-mapper and ``CSILVM_IN_VM=1``.  It drives lvm2
through the project's ``SubprocessRunner`` (argv lists) and prints what it
measured: how long each lvcreate took and the raid1 rmeta size lvm2 chose.
"""

from __future__ import annotations

import json
import time

import pytest

VG = "csilvm_vm_smoke"
MIB = 1024 * 1024
LV_SIZE = 8 * MIB


@pytest.fixture
def say(capsys):
    """Print past pytest's capture, so that -q runs show the measurements too."""

    def _say(key: str, value) -> None:
        with capsys.disabled():
            print(f"\n[vm-smoke] {key}: {value}", flush=True)

    return _say


@pytest.fixture
def vg(lvm_runner, pv_devices):
    run = lvm_runner.run
    run(["pvcreate", "-y", *pv_devices])
    run(["vgcreate", "--physicalextentsize", "1m", VG, *pv_devices])
    try:
        yield VG
    finally:
        run(["vgchange", "-an", VG], ok_codes=(0, 5))
        run(["vgremove", "-ff", "-y", VG], ok_codes=(0, 5))
        run(["pvremove", "-ff", "-y", *pv_devices], ok_codes=(0, 5))


def lvs(runner, vg: str, fields: str, *extra: str) -> list[dict]:
    out = runner.run(
        ["lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", fields, *extra, vg]
    ).stdout
    return json.loads(out)["report"][0]["lv"]


def test_pvs_have_different_sizes(lvm_runner, vg, pv_devices, say):
    out = lvm_runner.run(
        ["pvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", "pv_name,pv_size,vg_name"]
    ).stdout
    pvs = {pv["pv_name"]: pv for pv in json.loads(out)["report"][0]["pv"] if pv["vg_name"] == VG}
    assert sorted(pvs) == sorted(pv_devices)
    sizes = [int(pvs[d]["pv_size"]) for d in pv_devices]
    say("pv_sizes_bytes", ",".join(str(s) for s in sizes))
    assert len(set(sizes)) == len(sizes), "the PVs should differ in size"


def test_linear_raid0_raid1(lvm_runner, vg, say):
    run = lvm_runner.run
    size = f"{LV_SIZE}b"
    creates = {
        "lin": ["lvcreate", "-y", "-n", "lin", "-L", size, vg],
        "r0": ["lvcreate", "-y", "-n", "r0", "--type", "raid0", "-i", "2", "-L", size, vg],
        "r1": ["lvcreate", "-y", "-n", "r1", "--type", "raid1", "-m", "1", "-L", size, vg],
    }
    for name, argv in creates.items():
        started = time.monotonic()
        run(argv)
        say(f"lvcreate_{name}_seconds", f"{time.monotonic() - started:.2f}")

    started = time.monotonic()
    rows = {r["lv_name"]: r for r in lvs(lvm_runner, vg, "lv_name,segtype,stripes,data_copies,lv_size")}
    say("lvs_seconds", f"{time.monotonic() - started:.2f}")
    assert set(rows) == {"lin", "r0", "r1"}

    assert rows["lin"]["segtype"] == "linear"
    assert int(rows["lin"]["stripes"]) == 1
    assert int(rows["lin"]["data_copies"]) == 1

    assert rows["r0"]["segtype"] == "raid0"
    assert int(rows["r0"]["stripes"]) == 2
    assert int(rows["r0"]["data_copies"]) == 1

    assert rows["r1"]["segtype"] == "raid1"
    assert int(rows["r1"]["data_copies"]) == 2
    assert int(rows["r1"]["stripes"]) == 2

    for name, row in rows.items():
        assert int(row["lv_size"]) == LV_SIZE, name

    # The volumes are active and usable: the device nodes exist and can be read.
    for name in rows:
        dev = f"/dev/{vg}/{name}"
        with open(dev, "rb") as f:
            assert len(f.read(4096)) == 4096, dev

    # The raid1's hidden sub-volumes: two images and two metadata volumes.
    hidden = lvs(lvm_runner, vg, "lv_name,lv_size,devices", "-a")
    rmeta = {r["lv_name"]: int(r["lv_size"]) for r in hidden if "r1_rmeta" in r["lv_name"]}
    rimage = {r["lv_name"]: int(r["lv_size"]) for r in hidden if "r1_rimage" in r["lv_name"]}
    assert len(rmeta) == 2 and len(rimage) == 2, hidden
    assert all(s == LV_SIZE for s in rimage.values()), rimage
    say("raid1_rmeta_bytes", ",".join(f"{k}={v}" for k, v in sorted(rmeta.items())))
    # The smallest rmeta there can be: one extent (1 MiB here).
    assert all(s == MIB for s in rmeta.values()), rmeta
    # raid0 has no rmeta sub-volumes (lvm2 creates raid0, not raid0_meta, by default).
    assert not [r for r in hidden if "r0_rmeta" in r["lv_name"]], hidden

    vg_free = json.loads(
        run(["vgs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", "vg_size,vg_free", vg]).stdout
    )["report"][0]["vg"][0]
    say("vg_size_free_bytes", f"{vg_free['vg_size']},{vg_free['vg_free']}")
    # linear 8 + raid0 8 + raid1 2x8 + 2x1 rmeta = 34 MiB used.
    assert int(vg_free["vg_size"]) - int(vg_free["vg_free"]) == 34 * MIB

    for name in creates:
        started = time.monotonic()
        run(["lvremove", "-y", f"{vg}/{name}"])
        say(f"lvremove_{name}_seconds", f"{time.monotonic() - started:.2f}")
