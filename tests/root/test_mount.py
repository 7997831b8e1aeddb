"""The Node-side host operations against real loop devices, file systems and mounts."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import psutil
import pytest

from lvm.command import SubprocessRunner
from mount.errors import FilesystemMismatch, NotABlockDevice, TargetBusy
from mount.fs import detect_fs, make_fs
from mount.ops import publish_bind, publish_block, stage_filesystem, unpublish, unstage
from mount.stats import block_device_size, device_of_mount, filesystem_usage
from mount.table import read_mount_table
from tests.root.conftest import MiB, require_tool

pytestmark = pytest.mark.root

XFS_MIN = 320 * MiB  # mkfs.xfs refuses file systems under 300 MB


@pytest.fixture
def runner() -> SubprocessRunner:
    return SubprocessRunner()


def mkfs_count(runner: SubprocessRunner) -> int:
    return sum(n for name, n in runner.invocations.items() if name.startswith("mkfs"))


def mounted(path: Path):
    return read_mount_table().at(str(path.resolve()))


def write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------
# staging


@pytest.mark.parametrize("fs_type, size", [("ext4", 64 * MiB), ("ext3", 64 * MiB), ("xfs", XFS_MIN)])
def test_stage_formats_a_blank_device_and_is_idempotent(loop_device, root_tmp_path, runner, fs_type, size):
    require_tool(f"mkfs.{fs_type}")
    device = loop_device(size)
    staging = root_tmp_path / "staging" / "pv"  # parents are created too
    assert detect_fs(device, runner) is None

    assert stage_filesystem(device, str(staging), fs_type, ["noatime"], runner) is True
    entry = mounted(staging)
    assert entry is not None
    assert entry.fs_type == fs_type
    assert entry.device_number == os.stat(device).st_rdev
    assert "noatime" in entry.options
    assert detect_fs(device, runner) == fs_type
    write_file(staging / "data", b"hello")

    mkfs_runs = mkfs_count(runner)
    assert stage_filesystem(device, str(staging), fs_type, ["noatime"], runner) is False
    assert mkfs_count(runner) == mkfs_runs == 1
    assert len(read_mount_table().all_at(str(staging.resolve()))) == 1

    # Unstage and stage again: the data survives, nothing is reformatted.
    assert unstage(str(staging), runner) is True
    assert mounted(staging) is None
    assert stage_filesystem(device, str(staging), fs_type, [], runner) is True
    assert (staging / "data").read_bytes() == b"hello"
    assert mkfs_count(runner) == 1


def test_stage_btrfs_is_recognized_although_its_mount_shows_an_anonymous_device(loop_device, root_tmp_path, runner):
    require_tool("mkfs.btrfs")
    device = loop_device(256 * MiB)
    staging = root_tmp_path / "staging"
    assert stage_filesystem(device, str(staging), "btrfs", [], runner) is True
    assert mounted(staging).major == 0  # the reason the source is compared too
    assert stage_filesystem(device, str(staging), "btrfs", [], runner) is False
    assert unstage(str(staging), runner) is True


def test_refuses_to_format_a_device_holding_another_fs(loop_device, root_tmp_path, runner):
    device = loop_device()
    staging = root_tmp_path / "staging"
    stage_filesystem(device, str(staging), "ext4", [], runner)
    write_file(staging / "precious", b"keep me")
    unstage(str(staging), runner)

    with pytest.raises(FilesystemMismatch, match=rf"{device} already holds an existing ext4 file system.*wipefs"):
        stage_filesystem(device, str(staging), "xfs", [], runner)
    assert mounted(staging) is None
    assert detect_fs(device, runner) == "ext4"
    assert not any(name == "mkfs.xfs" for name in runner.invocations)

    stage_filesystem(device, str(staging), "ext4", [], runner)
    assert (staging / "precious").read_bytes() == b"keep me"


def test_refuses_to_format_a_device_with_a_partition_table(loop_device, root_tmp_path, runner):
    device = loop_device()
    # A minimal MBR: one Linux partition from sector 2048, 4096 sectors long.
    entry = struct.pack("<B3sB3sII", 0x00, b"\0\0\0", 0x83, b"\0\0\0", 2048, 4096)
    with open(device, "r+b") as f:
        f.seek(446)
        f.write(entry)
        f.seek(510)
        f.write(b"\x55\xaa")
        f.flush()
        os.fsync(f.fileno())
    assert detect_fs(device, runner) == "dos"
    with pytest.raises(FilesystemMismatch, match="dos partition table"):
        stage_filesystem(device, str(root_tmp_path / "staging"), "ext4", [], runner)
    assert detect_fs(device, runner) == "dos"
    assert mkfs_count(runner) == 0


def test_staged_with_another_type_is_a_mismatch(loop_device, root_tmp_path, runner):
    device = loop_device()
    staging = root_tmp_path / "staging"
    stage_filesystem(device, str(staging), "ext4", [], runner)
    with pytest.raises(FilesystemMismatch, match="already staged"):
        stage_filesystem(device, str(staging), "ext3", [], runner)


def test_stage_onto_another_mount_is_busy(loop_device, root_tmp_path, runner):
    first, second = loop_device(name="a.img"), loop_device(name="b.img")
    staging = root_tmp_path / "staging"
    stage_filesystem(first, str(staging), "ext4", [], runner)
    with pytest.raises(TargetBusy, match="another mount"):
        stage_filesystem(second, str(staging), "ext4", [], runner)
    assert mounted(staging).device_number == os.stat(first).st_rdev
    assert detect_fs(second, runner) is None  # the busy check comes before any formatting


def test_stage_onto_a_non_empty_directory_or_a_file_is_busy(loop_device, root_tmp_path, runner):
    device = loop_device()
    staging = root_tmp_path / "staging"
    staging.mkdir()
    (staging / "left-over").write_text("x")
    with pytest.raises(TargetBusy, match="non-empty directory"):
        stage_filesystem(device, str(staging), "ext4", [], runner)
    a_file = root_tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(TargetBusy, match="not a directory"):
        stage_filesystem(device, str(a_file), "ext4", [], runner)
    assert detect_fs(device, runner) is None


def test_stage_of_a_non_block_device_is_refused(root_tmp_path, runner):
    with pytest.raises(NotABlockDevice):
        stage_filesystem(str(root_tmp_path / "nope"), str(root_tmp_path / "s"), "ext4", [], runner)


def test_unstage_is_idempotent_and_removes_stacked_mounts(loop_device, root_tmp_path, runner):
    device = loop_device()
    staging = root_tmp_path / "staging"
    assert unstage(str(staging), runner) is False  # missing path
    staging.mkdir()
    assert unstage(str(staging), runner) is False  # not mounted
    stage_filesystem(device, str(staging), "ext4", [], runner)
    runner.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(staging)])
    assert len(read_mount_table().all_at(str(staging))) == 2
    assert unstage(str(staging), runner) is True
    assert mounted(staging) is None
    assert staging.is_dir()  # the directory is the CO's
    assert unstage(str(staging), runner) is False


# ---------------------------------------------------------------------------
# publishing a file system


@pytest.fixture
def staged(loop_device, root_tmp_path, runner) -> tuple[str, Path]:
    device = loop_device()
    staging = root_tmp_path / "staging"
    stage_filesystem(device, str(staging), "ext4", [], runner)
    return device, staging


def test_publish_bind_is_idempotent_and_shares_data(staged, root_tmp_path, runner):
    device, staging = staged
    target = root_tmp_path / "pods" / "a" / "mount"
    assert publish_bind(str(staging), str(target), False, [], runner) is True
    entry = mounted(target)
    assert entry.device_number == os.stat(device).st_rdev
    assert entry.root == "/"
    write_file(target / "from-pod", b"pod data")
    assert (staging / "from-pod").read_bytes() == b"pod data"

    assert publish_bind(str(staging), str(target), False, [], runner) is False
    assert len(read_mount_table().all_at(str(target.resolve()))) == 1


def test_publish_bind_readonly_refuses_writes(staged, root_tmp_path, runner):
    _, staging = staged
    write_file(staging / "existing", b"read me")
    target = root_tmp_path / "ro"
    assert publish_bind(str(staging), str(target), True, ["noexec,nosuid"], runner) is True
    entry = mounted(target)
    assert entry.read_only
    assert {"noexec", "nosuid"} <= set(entry.options)
    assert (target / "existing").read_bytes() == b"read me"
    with pytest.raises(OSError) as excinfo:
        write_file(target / "new", b"x")
    assert excinfo.value.errno == errno.EROFS
    assert not mounted(staging).read_only  # the staging mount stays writable

    assert publish_bind(str(staging), str(target), True, ["noexec"], runner) is False
    with pytest.raises(TargetBusy, match="read-only"):
        publish_bind(str(staging), str(target), False, [], runner)


def test_publish_bind_readwrite_then_readonly_conflicts(staged, root_tmp_path, runner):
    _, staging = staged
    target = root_tmp_path / "rw"
    publish_bind(str(staging), str(target), False, [], runner)
    with pytest.raises(TargetBusy, match="read-write"):
        publish_bind(str(staging), str(target), True, [], runner)


def test_publish_bind_of_a_subdirectory_checks_the_subtree(staged, root_tmp_path, runner):
    _, staging = staged
    (staging / "sub").mkdir()
    target = root_tmp_path / "sub-target"
    assert publish_bind(str(staging / "sub"), str(target), False, [], runner) is True
    assert mounted(target).root == "/sub"
    assert publish_bind(str(staging / "sub"), str(target), False, [], runner) is False
    with pytest.raises(TargetBusy, match="not a bind of"):
        publish_bind(str(staging), str(target), False, [], runner)


def test_publish_bind_onto_another_mount_or_data_is_busy(staged, loop_device, root_tmp_path, runner):
    _, staging = staged
    other = root_tmp_path / "other-staging"
    stage_filesystem(loop_device(name="other.img"), str(other), "ext4", [], runner)
    target = root_tmp_path / "target"
    publish_bind(str(other), str(target), False, [], runner)
    with pytest.raises(TargetBusy, match="another mount"):
        publish_bind(str(staging), str(target), False, [], runner)

    full = root_tmp_path / "full"
    full.mkdir()
    (full / "data").write_text("mine")
    with pytest.raises(TargetBusy, match="non-empty"):
        publish_bind(str(staging), str(full), False, [], runner)
    assert mounted(full) is None


# ---------------------------------------------------------------------------
# publishing a raw block device


def test_publish_block_writes_reach_the_device(loop_device, root_tmp_path, runner):
    device = loop_device(16 * MiB)
    target = root_tmp_path / "pods" / "c" / "pv-block"
    assert publish_block(device, str(target), False, runner) is True
    assert mounted(target) is not None
    assert os.stat(target).st_rdev == os.stat(device).st_rdev
    assert block_device_size(str(target)) == 16 * MiB

    payload = os.urandom(4096)
    with open(target, "r+b") as f:
        f.seek(MiB)
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    with open(device, "rb") as f:
        f.seek(MiB)
        assert f.read(4096) == payload

    assert publish_block(device, str(target), False, runner) is False
    assert len(read_mount_table().all_at(str(target.resolve()))) == 1


def test_publish_block_readonly_marks_the_mount_read_only(loop_device, root_tmp_path, runner):
    device = loop_device()
    target = root_tmp_path / "ro-block"
    assert publish_block(device, str(target), True, runner) is True
    assert mounted(target).read_only
    assert publish_block(device, str(target), True, runner) is False
    with pytest.raises(TargetBusy, match="read-only"):
        publish_block(device, str(target), False, runner)


def test_publish_block_onto_a_directory_or_another_device_is_busy(loop_device, root_tmp_path, runner):
    first, second = loop_device(name="a.img"), loop_device(name="b.img")
    directory = root_tmp_path / "dir"
    directory.mkdir()
    with pytest.raises(TargetBusy, match="not a regular file"):
        publish_block(first, str(directory), False, runner)

    target = root_tmp_path / "block"
    publish_block(first, str(target), False, runner)
    with pytest.raises(TargetBusy, match="another mount"):
        publish_block(second, str(target), False, runner)

    data_file = root_tmp_path / "data-file"
    data_file.write_bytes(b"not a placeholder")
    with pytest.raises(TargetBusy, match="non-empty file"):
        publish_block(first, str(data_file), False, runner)
    assert data_file.read_bytes() == b"not a placeholder"


# ---------------------------------------------------------------------------
# unpublishing


def test_unpublish_removes_mount_and_target_and_is_idempotent(staged, loop_device, root_tmp_path, runner):
    _, staging = staged
    dir_target = root_tmp_path / "dir-target"
    publish_bind(str(staging), str(dir_target), False, [], runner)
    write_file(dir_target / "kept", b"on the volume")
    block_target = root_tmp_path / "block-target"
    publish_block(loop_device(name="blk.img"), str(block_target), False, runner)

    for target in (dir_target, block_target):
        assert unpublish(str(target), runner) is True
        assert mounted(target) is None
        assert not target.exists()
        assert unpublish(str(target), runner) is False
    assert (staging / "kept").read_bytes() == b"on the volume"  # unpublish never touches the volume


def test_unpublish_of_an_empty_unmounted_target_removes_it(root_tmp_path, runner):
    empty_dir, empty_file = root_tmp_path / "d", root_tmp_path / "f"
    empty_dir.mkdir()
    empty_file.write_bytes(b"")
    assert unpublish(str(empty_dir), runner) is True
    assert unpublish(str(empty_file), runner) is True
    assert not empty_dir.exists() and not empty_file.exists()


def test_unpublish_refuses_to_delete_data(root_tmp_path, runner):
    target = root_tmp_path / "not-mounted"
    target.mkdir()
    (target / "data").write_text("someone's")
    with pytest.raises(TargetBusy, match="not empty"):
        unpublish(str(target), runner)
    assert (target / "data").read_text() == "someone's"

    data_file = root_tmp_path / "file"
    data_file.write_text("someone's")
    with pytest.raises(TargetBusy, match="non-empty file"):
        unpublish(str(data_file), runner)
    assert data_file.read_text() == "someone's"

    link = root_tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(TargetBusy, match="symbolic link"):
        unpublish(str(link), runner)
    assert link.is_symlink()


# ---------------------------------------------------------------------------
# stats


def test_filesystem_usage_matches_statvfs_df_and_psutil(staged, runner):
    device, staging = staged
    before = filesystem_usage(str(staging))
    write_file(staging / "blob", os.urandom(8 * MiB))
    usage = filesystem_usage(str(staging))

    st = os.statvfs(staging)
    assert usage.bytes_total == st.f_blocks * st.f_frsize
    assert usage.bytes_available == st.f_bavail * st.f_frsize
    assert usage.inodes_total == st.f_files > 0
    assert usage.inodes_used == st.f_files - st.f_ffree
    assert usage.inodes_available == st.f_favail
    assert usage.bytes_used - before.bytes_used >= 8 * MiB
    assert usage.inodes_used == before.inodes_used + 1

    df = runner.run(["df", "-B1", "--output=size,used,avail", str(staging)]).stdout.splitlines()[1].split()
    assert [int(x) for x in df] == [usage.bytes_total, usage.bytes_used, usage.bytes_available]
    ps = psutil.disk_usage(str(staging))
    assert (ps.total, ps.used, ps.free) == (usage.bytes_total, usage.bytes_used, usage.bytes_available)


def test_device_of_mount_names_the_loop_device(staged, root_tmp_path):
    device, staging = staged
    found = device_of_mount(str(staging))
    assert found.device_node == os.path.realpath(device)
    assert found.size_bytes == 64 * MiB
    assert found.fs_type == "ext4"
    assert found.source == device
    assert device_of_mount(str(root_tmp_path / "not-a-mount")) is None


def test_device_of_mount_for_a_published_block_target(loop_device, root_tmp_path, runner):
    device = loop_device(8 * MiB)
    target = root_tmp_path / "blk"
    publish_block(device, str(target), False, runner)
    found = device_of_mount(str(target))
    assert found.device_node == os.path.realpath(device)
    assert found.size_bytes == 8 * MiB


def test_block_device_size_of_a_regular_file_is_refused(root_tmp_path):
    plain = root_tmp_path / "plain"
    plain.write_bytes(b"x")
    with pytest.raises(NotABlockDevice):
        block_device_size(str(plain))

