"""Fixtures for tests that need root, loop devices, mkfs and mount.

``loop_device`` is a factory: ``loop_device(size_bytes)`` makes a sparse file in
the test's tmp_path, attaches it with ``losetup -f --show`` and returns the
device path.  At teardown (also after a failure) every mount under tmp_path is
unmounted, deepest / topmost first, then every loop device is detached; only
mounts and devices this test created are touched, so it is xdist-safe.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Iterator

import pytest

from lvm.command import SubprocessRunner
from lvm.errors import CommandFailed
from mount.table import read_mount_table

MiB = 1024 * 1024
REQUIRED_TOOLS = ("losetup", "mount", "umount", "blkid")


def root_skip_reason() -> str | None:
    """Why root tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (loop devices, mkfs, mount)"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} on PATH"
    if not os.path.exists("/dev/loop-control"):
        return "needs loop device support (/dev/loop-control is missing)"
    return None


def require_tool(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"needs {tool} on PATH")


def _run(argv: list[str]) -> tuple[str, str | None]:
    """(stdout, None) on success, ("", error message) on failure."""
    try:
        return SubprocessRunner(default_timeout=60).run(argv).stdout, None
    except CommandFailed as exc:
        return "", str(exc)


def unmount_everything_under(path: Path) -> list[str]:
    """Unmount every mount at or below ``path``, innermost and topmost first; returns leftover errors."""
    errors: list[str] = []
    for _ in range(64):
        mounts = read_mount_table().under(str(path.resolve()))
        if not mounts:
            return errors
        deepest = max(mounts, key=lambda e: (e.mount_point.count("/"), e.mount_id))
        _, error = _run(["umount", deepest.mount_point])
        if error:
            errors.append(error)
            return errors
    errors.append(f"mounts left under {path} after 64 unmounts")
    return errors


@pytest.fixture
def root_tmp_path(tmp_path: Path) -> Iterator[Path]:
    """tmp_path for tests that mount: skips without root, unmounts everything below it at teardown."""
    reason = root_skip_reason()
    if reason:
        pytest.skip(reason)
    yield tmp_path
    errors = unmount_everything_under(tmp_path)
    assert not errors, f"cleanup failed: {errors}"


@pytest.fixture
def loop_device(root_tmp_path: Path) -> Iterator[Callable[..., str]]:
    attached: list[str] = []

    def make(size_bytes: int = 64 * MiB, name: str | None = None) -> str:
        backing = root_tmp_path / (name or f"disk{len(attached)}.img")
        with open(backing, "wb") as f:
            f.truncate(size_bytes)  # sparse: costs no space until written
        stdout, error = _run(["losetup", "-f", "--show", str(backing)])
        if error:
            pytest.skip(f"cannot attach a loop device: {error}")
        device = stdout.strip()
        attached.append(device)
        return device

    try:
        yield make
    finally:
        # Mounts first (a mounted loop device would only be lazily detached), then the devices.
        errors = unmount_everything_under(root_tmp_path)
        for device in reversed(attached):
            _, error = _run(["losetup", "-d", device])
            if error:
                errors.append(error)
        assert not errors, f"cleanup failed: {errors}"
