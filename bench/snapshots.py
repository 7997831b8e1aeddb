"""Benchmark: snapshot and restore of a 1 GiB volume holding 512 MiB of data, on the loop sandbox.

The floor is the same work done by the standard tool with no plugin around it:
``cp --reflink=auto --sparse=always`` of the volume's image, measured in the same run on the same file
system.  A ratio near 1 says the plugin adds nothing to the copy itself.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from plugin.client import CsiClient

MiB = 1 << 20
GiB = 1 << 30
DATA = 512 * MiB


def fill(device: str) -> None:
    """512 MiB of incompressible data in the first half of the volume, the rest left as holes."""
    block = os.urandom(4 * MiB)
    with open(device, "r+b", buffering=0) as f:
        for _ in range(DATA // len(block)):
            f.write(block)
        os.fsync(f.fileno())


def against_floor(snapshot_s: float, restore_s: float, floor_s: float) -> dict:
    """The figures of one profile: seconds, and their ratios to the floor's."""
    return {
        "snapshot_s": round(snapshot_s, 3),
        "restore_s": round(restore_s, 3),
        "cp_floor_s": round(floor_s, 3),
        "snapshot_ratio": round(snapshot_s / floor_s, 3),
        "restore_ratio": round(restore_s / floor_s, 3),
    }


def _floor(image: Path, scratch: Path) -> float:
    os.sync()
    started = time.perf_counter()
    subprocess.run(["cp", "--reflink=auto", "--sparse=always", str(image), str(scratch)], check=True)
    with open(scratch, "rb+") as f:
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - started
    scratch.unlink()
    return elapsed


def bench_snapshots(client: CsiClient, root: Path, work_dir: Path) -> dict:
    """Seconds to snapshot and to restore, for linear and thin sandbox volumes, and the cp floor."""
    figures: dict = {}
    targets = root / "snap-targets"
    targets.mkdir(exist_ok=True)
    for profile in ("linear", "thin"):
        name = f"snapbench-{profile}"
        volume = client.create(name, GiB, parameters={"type": profile}, block=True)
        target = targets / name
        client.publish(volume.volume_id, "", str(target), block=True)
        fill(str(target))
        client.unpublish(volume.volume_id, str(target))
        os.sync()
        started = time.perf_counter()
        snapshot = client.snapshot(f"{name}-snap", volume.volume_id)
        snap_s = time.perf_counter() - started
        started = time.perf_counter()
        restored = client.create(f"{name}-restored", GiB, parameters={"type": profile}, block=True, from_snapshot=snapshot.snapshot_id)
        restore_s = time.perf_counter() - started
        image = work_dir / "volumes" / f"{volume.volume_id}.img"
        floor_s = _floor(image, root / "floor.img")
        figures[profile] = against_floor(snap_s, restore_s, floor_s)
        client.delete(restored.volume_id)
        client.delete_snapshot(snapshot.snapshot_id)
        client.delete(volume.volume_id)
    return figures
