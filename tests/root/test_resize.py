"""Growing file systems on real loop devices: online (mounted) for ext4, xfs and btrfs, offline for ext4,
and at stage for a file system that no longer fills its device."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from lvm.command import SubprocessRunner
from lvm.errors import OutOfRange
from mount import ops
from mount.errors import ResizeFailed, UnsupportedFilesystem
from mount.resize import filesystem_size, grow_filesystem
from mount.stats import block_device_size
from tests.root.conftest import require_tool

pytestmark = pytest.mark.root

MiB = 1 << 20
MKFS = {"ext4": ["mkfs.ext4", "-F", "-q"], "xfs": ["mkfs.xfs", "-q"], "btrfs": ["mkfs.btrfs", "-q"]}
# mkfs.xfs (Debian 12) refuses file systems under 300 MB.
# btrfs resizes only to 256 MiB or more.
SIZES = {"ext4": (32 * MiB, 48 * MiB), "xfs": (320 * MiB, 400 * MiB), "btrfs": (256 * MiB, 320 * MiB)}


CAP_SYS_RESOURCE = 24


def can_resize_online(fs: str) -> str | None:
    """Why this host cannot grow ``fs`` while mounted, or None (the VM suite covers what is skipped here)."""
    if fs == "ext4":
        cap_eff = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("CapEff"))
        if not int(cap_eff.split()[1], 16) >> CAP_SYS_RESOURCE & 1:
            return "this host withholds CAP_SYS_RESOURCE, which the kernel demands to grow a mounted ext4"
    return None


def grow_backing_file(device: str, size: int) -> None:
    backing = Path(f"/sys/block/{os.path.basename(device)}/loop/backing_file").read_text().strip()
    os.truncate(backing, size)
    subprocess.run(["losetup", "-c", device], check=True)
    assert block_device_size(device) == size


def total(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("fs", sorted(MKFS))
def test_a_mounted_file_system_grows_with_its_device_and_keeps_its_data(fs, loop_device, root_tmp_path):
    require_tool(MKFS[fs][0])
    small, big = SIZES[fs]
    device = loop_device(small)
    subprocess.run([*MKFS[fs], device], check=True)
    assert filesystem_size(device, fs) is not None and small - filesystem_size(device, fs) < MiB
    mnt = root_tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", fs, device, str(mnt)], check=True)
    (mnt / "data").write_bytes(os.urandom(4 * MiB))
    before, checksum = total(mnt), sha256(mnt / "data")

    grow_backing_file(device, big)
    reason = can_resize_online(fs)
    if reason:
        pytest.skip(reason)
    assert grow_filesystem(device, fs, SubprocessRunner(), mount_point=str(mnt))
    assert total(mnt) >= before + (big - small) * 9 // 10
    grow_filesystem(device, fs, SubprocessRunner(), mount_point=str(mnt))  # already full: nothing to do, no error
    assert sha256(mnt / "data") == checksum


def test_an_unmounted_ext4_grows_offline_keeps_its_data_and_a_second_call_is_harmless(loop_device, root_tmp_path):
    device = loop_device(32 * MiB)
    subprocess.run([*MKFS["ext4"], device], check=True)
    mnt = root_tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", device, str(mnt)], check=True)
    (mnt / "data").write_bytes(os.urandom(4 * MiB))
    checksum = sha256(mnt / "data")
    subprocess.run(["umount", str(mnt)], check=True)
    grow_backing_file(device, 64 * MiB)

    runner = SubprocessRunner()
    assert grow_filesystem(device, None, runner)  # the type from blkid; not mounted: e2fsck, then resize2fs
    assert runner.invocations.get("e2fsck") == 1 and runner.invocations.get("resize2fs") == 1
    assert filesystem_size(device, "ext4") == 64 * MiB
    assert grow_filesystem(device, "ext4", runner)  # already full size: still a success
    assert filesystem_size(device, "ext4") == 64 * MiB
    subprocess.run(["e2fsck", "-f", "-n", device], check=True, capture_output=True)
    subprocess.run(["mount", device, str(mnt)], check=True)
    assert total(mnt) > 48 * MiB
    assert sha256(mnt / "data") == checksum


def test_a_mounted_xfs_is_grown_where_the_mount_table_finds_it(loop_device, root_tmp_path):
    require_tool("mkfs.xfs")
    small, big = SIZES["xfs"]
    device = loop_device(small)
    subprocess.run([*MKFS["xfs"], device], check=True)
    mnt = root_tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", device, str(mnt)], check=True)
    before = total(mnt)
    grow_backing_file(device, big)
    assert grow_filesystem(device, None, SubprocessRunner())  # neither type nor mount point given
    assert total(mnt) >= before + (big - small) * 9 // 10


def test_btrfs_grows_the_device_it_is_given_even_when_that_is_not_devid_1(loop_device, root_tmp_path):
    """After ``btrfs device add`` + ``remove`` the one device left is devid 2, and a bare ``resize max``
    (devid 1) fails with 'cannot find devid: 1'."""
    require_tool("mkfs.btrfs")
    first, second = loop_device(256 * MiB), loop_device(256 * MiB)
    subprocess.run([*MKFS["btrfs"], first], check=True)
    mnt = root_tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", first, str(mnt)], check=True)
    subprocess.run(["btrfs", "device", "add", second, str(mnt)], check=True, capture_output=True)
    subprocess.run(["btrfs", "device", "remove", first, str(mnt)], check=True)
    grow_backing_file(second, 320 * MiB)
    assert grow_filesystem(second, "btrfs", SubprocessRunner(), mount_point=str(mnt))
    assert filesystem_size(second, "btrfs") == 320 * MiB


def test_unmounted_xfs_and_btrfs_wait_for_their_next_mount(loop_device):
    require_tool("mkfs.btrfs")
    device = loop_device(128 * MiB)
    subprocess.run([*MKFS["btrfs"], device], check=True)
    grow_backing_file(device, 160 * MiB)
    assert not grow_filesystem(device, "btrfs", SubprocessRunner())
    assert filesystem_size(device, "btrfs") == 128 * MiB


def test_btrfs_below_256_mib_is_refused_with_the_reason(loop_device, root_tmp_path):
    require_tool("mkfs.btrfs")
    device = loop_device(128 * MiB)
    subprocess.run([*MKFS["btrfs"], device], check=True)
    mnt = root_tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "btrfs", device, str(mnt)], check=True)
    grow_backing_file(device, 192 * MiB)
    with pytest.raises(OutOfRange, match="256 MiB"):
        grow_filesystem(device, "btrfs", SubprocessRunner(), mount_point=str(mnt))


@pytest.mark.parametrize("fs", sorted(MKFS))
def test_stage_grows_an_existing_file_system_that_no_longer_fills_its_device(fs, loop_device, root_tmp_path):
    require_tool(MKFS[fs][0])
    small, big = SIZES[fs]
    device = loop_device(small)
    subprocess.run([*MKFS[fs], device], check=True)
    staging = root_tmp_path / "staging"
    runner = SubprocessRunner()
    assert ops.stage_filesystem(device, str(staging), fs, (), runner)
    (staging / "data").write_bytes(os.urandom(MiB))
    before, checksum = total(staging), sha256(staging / "data")
    subprocess.run(["umount", str(staging)], check=True)
    grow_backing_file(device, big)

    assert ops.stage_filesystem(device, str(staging), fs, (), runner)
    assert total(staging) >= before + (big - small) * 9 // 10
    assert sha256(staging / "data") == checksum
    assert not ops.stage_filesystem(device, str(staging), fs, (), runner)  # already staged: nothing more
    assert not any(name.startswith("mkfs") for name in runner.invocations)
    subprocess.run(["umount", str(staging)], check=True)
    assert big - filesystem_size(device, fs) < MiB  # unmounted: the superblock on disk is current
    tools = sum(runner.invocations.get(t, 0) for t in ("e2fsck", "resize2fs", "xfs_growfs", "btrfs"))
    assert ops.stage_filesystem(device, str(staging), fs, (), runner)  # fills its device: no tool runs
    assert sum(runner.invocations.get(t, 0) for t in ("e2fsck", "resize2fs", "xfs_growfs", "btrfs")) == tools


def test_a_mount_point_of_another_file_system_is_refused(loop_device, root_tmp_path):
    """``btrfs filesystem resize`` grows whatever btrfs holds the path it is given: never the wrong one."""
    require_tool("mkfs.btrfs")
    ours, theirs = loop_device(256 * MiB), loop_device(256 * MiB)
    for device, name in ((ours, "ours"), (theirs, "theirs")):
        subprocess.run([*MKFS["btrfs"], device], check=True)
        (root_tmp_path / name).mkdir()
        subprocess.run(["mount", device, str(root_tmp_path / name)], check=True)
        grow_backing_file(device, 320 * MiB)
    with pytest.raises(ResizeFailed, match=f"not a mount of {ours} \\(it is mounted at {root_tmp_path / 'ours'}\\)"):
        grow_filesystem(ours, "btrfs", SubprocessRunner(), mount_point=str(root_tmp_path / "theirs"))
    assert filesystem_size(theirs, "btrfs") == filesystem_size(ours, "btrfs") == 256 * MiB


def test_no_file_system_a_failing_tool_and_an_unknown_type_are_reported(loop_device):
    device = loop_device(32 * MiB)  # blank
    with pytest.raises(ResizeFailed, match="holds no file system"):
        grow_filesystem(device, None, SubprocessRunner())
    with pytest.raises(ResizeFailed) as err:  # e2fsck finds no ext superblock: its words, and what to do
        grow_filesystem(device, "ext4", SubprocessRunner())
    assert "e2fsck -f -p" in str(err.value) and "Bad magic number" in str(err.value)
    assert f"repair it by hand (e2fsck -f {device})" in str(err.value)
    with pytest.raises(UnsupportedFilesystem, match="vfat"):
        grow_filesystem(device, "vfat", SubprocessRunner())
    assert filesystem_size(device, "ext4") is None
