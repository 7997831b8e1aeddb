"""A real ``csilvm serve`` process on the loop sandbox, driven by a real gRPC client over its socket."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from plugin.client import CsiClient
from tests.plugin_process import REPO, Plugin, detach_loops_of, unmount_everything_below, wait_until_ready  # noqa: F401


def _why_not_root() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the loop sandbox attaches loop devices and mounts file systems"
    if not os.path.exists("/dev/loop-control"):
        return "needs loop devices (/dev/loop-control is missing)"
    return None


def pytest_collection_modifyitems(config, items):
    """Every test here drives a real plugin on loop devices: skip them all, with the reason, without root."""
    reason = _why_not_root()
    if reason:
        for item in items:
            if "tests/e2e/" in str(item.fspath):
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def plugin_factory(tmp_path):
    """Make plugin processes in a private directory; everything is torn down after the test."""
    made: list[Plugin] = []
    socket_dir = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))  # Unix socket paths must stay short

    def make(*args: str, capacity: str = "2GiB") -> Plugin:
        work = tmp_path / "work"
        p = Plugin(work, socket_dir / "csi.sock", ["--backend", "loop", "--work-dir", str(work), "--capacity", capacity, *args])
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()
    shutil.rmtree(socket_dir, ignore_errors=True)
    unmount_everything_below(tmp_path)
    for p in made:
        detach_loops_of(p.work_dir)


@pytest.fixture
def plugin(plugin_factory) -> Plugin:
    p = plugin_factory()
    p.start()
    return p


@pytest.fixture
def csi(plugin) -> CsiClient:
    return plugin.client
