"""Fixtures for the Mesos tests: SLRP replays and plugin containers, torn down even when a test fails."""

from __future__ import annotations

import os

import pytest

from tests.mesos.harness import BackendSpec, PluginContainer, SlrpReplay
from tests.plugin_process import detach_loops_of, unmount_everything_below


def why_not_root() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the loop sandbox attaches loop devices and mounts file systems"
    if not os.path.exists("/dev/loop-control"):
        return "needs loop devices (/dev/loop-control is missing)"
    return None


needs_root = pytest.mark.skipif(why_not_root() is not None, reason=why_not_root() or "")


@pytest.fixture
def slrp(tmp_path):
    """``slrp(api_version, backend=..., ...)`` -> a :class:`SlrpReplay` in a private directory."""
    made: list[SlrpReplay] = []

    def make(api_version: str = "v1", backend: BackendSpec = BackendSpec(), **kwargs) -> SlrpReplay:
        replay = SlrpReplay(tmp_path / f"slrp{len(made)}", api_version, backend, **kwargs)
        made.append(replay)
        return replay

    yield make
    for replay in made:
        replay.cleanup()


@pytest.fixture
def containers(tmp_path):
    """``containers(env, *args)`` -> a :class:`PluginContainer` with its own work dir (not launched)."""
    made: list[PluginContainer] = []

    def make(env=None, *args: str) -> PluginContainer:
        c = PluginContainer(tmp_path / f"c{len(made)}" / "work", dict(env or {}), tuple(args))
        c.work_dir.parent.mkdir(parents=True, exist_ok=True)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
    unmount_everything_below(tmp_path)
    for c in made:
        detach_loops_of(c.work_dir)
