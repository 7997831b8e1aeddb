"""kill -9 at every system call of a snapshot, a restore and a snapshot delete: after a restart there is
the whole thing or nothing, never a half (fake loop devices; the copies are real files)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from lvm import images
from lvm.backend import ContentSource, SizeRange
from lvm.profiles import LINEAR
from lvm.sandbox_state import snapshot_id_for
from lvm.units import MiB
from tests.unit.test_sandbox_state import FakeLoops, make_backend

# Every system call a copy, a metadata write or a removal makes: where a kill -9 may land.
_STEPS = ("open", "ftruncate", "fsync", "write", "replace", "unlink", "pwrite", "copy_file_range", "fchmod", "lseek")
SNAP = snapshot_id_for("s")
PAYLOAD = {0: b"HEAD" * 1024, 3 * MiB: b"MID!" * 1024, 4 * MiB - 4: b"TAIL"}


def _prepare(work: Path, action: str) -> None:
    backend = make_backend(work)
    backend.create_volume("v", SizeRange(), LINEAR)  # 4 MiB
    fd = os.open(backend.image_path("v"), os.O_WRONLY)
    for offset, data in PAYLOAD.items():
        os.pwrite(fd, data, offset)
    os.close(fd)
    if action in ("restore", "delete"):
        backend.create_snapshot("s", "v")


def _run_and_kill_at(work: Path, step: int, action: str) -> None:
    count = [0]

    def killing(original):
        def wrapper(*args, **kwargs):
            count[0] += 1
            if count[0] == step:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(*args, **kwargs)
        return wrapper

    backend = make_backend(work, FakeLoops())
    images._reflink = lambda src_fd, dst_fd: False  # the data-range copy: the longer path
    for name in _STEPS:
        setattr(os, name, killing(getattr(os, name)))
    if action == "snapshot":
        backend.create_snapshot("s", "v")
    elif action == "restore":
        backend.create_volume("r", SizeRange(required=8 * MiB), LINEAR, ContentSource(ContentSource.SNAPSHOT, SNAP))
    else:
        backend.delete_snapshot(SNAP)
    os._exit(0)


def _holds_the_payload(path: Path, size: int) -> bool:
    data = path.read_bytes()
    return len(data) == size and all(data[o : o + len(d)] == d for o, d in PAYLOAD.items()) and data[4 * MiB :] == bytes(size - 4 * MiB)


@pytest.mark.parametrize("action", ["snapshot", "restore", "delete"])
def test_a_kill_at_any_point_leaves_the_whole_thing_or_nothing(tmp_path, action):
    context = multiprocessing.get_context("fork")
    outcomes = set()
    for step in range(1, 80):
        work = tmp_path / f"step{step}"
        _prepare(work, action)
        child = context.Process(target=_run_and_kill_at, args=(work, step, action))
        child.start()
        child.join(timeout=60)
        assert child.exitcode in (0, -signal.SIGKILL), child.exitcode
        backend = make_backend(work)  # the restart
        snapshots, volumes = backend.list_snapshots(), [v.id for v in backend.list_volumes()]
        if action in ("snapshot", "delete"):
            made = bool(snapshots)
            expected = [f"{SNAP}.img", f"{SNAP}.json"] if made else []
            assert sorted(os.listdir(backend.snapshots_dir)) == expected, f"step {step}"
            if made:
                assert [s.id for s in snapshots] == [SNAP] and _holds_the_payload(backend.snapshot_image_path(SNAP), 4 * MiB)
            assert volumes == ["v"]
        else:
            made = "r" in volumes
            expected = ["r.img", "r.json", "v.img", "v.json"] if made else ["v.img", "v.json"]
            assert sorted(os.listdir(backend.volumes_dir)) == expected, f"step {step}"
            if made:
                assert _holds_the_payload(backend.image_path("r"), 8 * MiB), f"step {step}"
                assert backend.get_volume("r").content_source == ContentSource(ContentSource.SNAPSHOT, SNAP)
            assert [s.id for s in snapshots] == [SNAP]
        # The retry converges from wherever the kill left it.
        if action == "snapshot":
            assert backend.create_snapshot("s", "v").id == SNAP and _holds_the_payload(backend.snapshot_image_path(SNAP), 4 * MiB)
        elif action == "restore":
            backend.create_volume("r", SizeRange(required=8 * MiB), LINEAR, ContentSource(ContentSource.SNAPSHOT, SNAP))
            assert _holds_the_payload(backend.image_path("r"), 8 * MiB)
        else:
            backend.delete_snapshot(SNAP)
            assert os.listdir(backend.snapshots_dir) == [] and backend.list_snapshots() == []
        outcomes.add((child.exitcode, made))
        if child.exitcode == 0:
            break
    else:
        pytest.fail("the action never completed: raise the step bound")
    assert outcomes >= {(-signal.SIGKILL, True), (-signal.SIGKILL, False)}, outcomes
