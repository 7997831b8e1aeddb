"""Mount flag validation, and how flags and probes turn into commands (fake runner, no root)."""

from __future__ import annotations

from typing import Sequence

import pytest

from lvm.command import CommandResult
from lvm.errors import CommandFailed, InvalidParameters, StorageError
from mount.errors import FilesystemMismatch, InvalidMountFlags, UnsupportedFilesystem
from mount.fs import detect_fs, ensure_fs, parse_blkid_export, probe_device
from mount.ops import validate_mount_flags

# ---------------------------------------------------------------------------
# validate_mount_flags


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], ()),
        (["noatime"], ("noatime",)),
        (["noatime,nodiscard", "nosuid"], ("noatime", "nodiscard", "nosuid")),
        (["data=ordered", "commit=30"], ("data=ordered", "commit=30")),
        (["uid=1000", "context=system_u:object_r:container_file_t:s0"],
         ("uid=1000", "context=system_u:object_r:container_file_t:s0")),
        (["logbsize=256k", "sunit=512,swidth=1024"], ("logbsize=256k", "sunit=512", "swidth=1024")),
        (["ro", "noexec", "ro"], ("ro", "noexec")),  # duplicates dropped, order kept
        (["subvol=/a/b+c"], ("subvol=/a/b+c",)),
    ],
)  # fmt: skip
def test_plain_options_are_accepted_and_split(flags, expected):
    assert validate_mount_flags(flags) == expected


@pytest.mark.parametrize(
    "flag",
    [
        "bind", "rbind", "move", "remount", "BIND", "noatime,bind",
        "loop", "loop=/dev/loop9", "offset=4096", "sizelimit=1M",
        "X-mount.mkdir", "x-mount.subdir=a", "X-mount.idmap=u:0:1000:1", "x-systemd.automount",
        "helper=fuse", "uhelper=udisks2",
        "shared", "rprivate", "make-shared",
    ],
)  # fmt: skip
def test_options_that_change_what_is_mounted_are_rejected(flag):
    with pytest.raises(InvalidMountFlags, match="not allowed"):
        validate_mount_flags(["noatime", flag])


@pytest.mark.parametrize(
    "flag",
    [
        "", "-o", "--bind", "noatime,", ",noatime", "a,,b", "-", "no atime", "a;b", "a$(id)", "a`id`",
        "a\nb", "a|b", "a&b", "=x", "_x", "x>y", "a'b", 'a"b', "é", "opt\0",
    ],
)  # fmt: skip
def test_malformed_flags_are_rejected(flag):
    with pytest.raises(InvalidMountFlags, match="not a plain mount option"):
        validate_mount_flags([flag])


def test_errors_are_invalid_parameters_and_storage_errors():
    with pytest.raises(InvalidParameters):
        validate_mount_flags(["bind"])
    assert issubclass(InvalidMountFlags, StorageError)
    assert issubclass(FilesystemMismatch, StorageError)


# ---------------------------------------------------------------------------
# probing and ensure_fs against a scripted runner


class ScriptedRunner:
    """Answers blkid with a fixed stdout / exit code and records every argv."""

    def __init__(self, blkid_stdout: str = "", blkid_code: int = 0):
        self.blkid_stdout = blkid_stdout
        self.blkid_code = blkid_code
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, timeout=None, env=None, input=None, ok_codes=(0,)) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        if argv[0] == "blkid" and self.blkid_code not in ok_codes:
            raise CommandFailed("blkid failed", argv=argv, returncode=self.blkid_code, stderr="")
        return CommandResult(argv, self.blkid_stdout if argv[0] == "blkid" else "", "")


EXT4_PROBE = "DEVNAME=/dev/vg/lv\nUUID=1f0c\nVERSION=1.0\nBLOCK_SIZE=4096\nTYPE=ext4\nUSAGE=filesystem\n"
GPT_PROBE = "DEVNAME=/dev/vg/lv\nPTUUID=8a7c\nPTTYPE=gpt\n"


def test_parse_blkid_export():
    assert parse_blkid_export(EXT4_PROBE)["TYPE"] == "ext4"
    assert parse_blkid_export("LABEL=a=b\n\nnoise\n") == {"LABEL": "a=b"}


def test_probe_uses_low_level_export_mode():
    runner = ScriptedRunner(EXT4_PROBE)
    assert detect_fs("/dev/vg/lv", runner) == "ext4"
    assert runner.calls == [("blkid", "-p", "-o", "export", "/dev/vg/lv")]


def test_exit_code_2_means_blank():
    assert detect_fs("/dev/x", ScriptedRunner(blkid_code=2)) is None
    assert probe_device("/dev/x", ScriptedRunner(blkid_code=2)).blank


def test_partition_table_is_reported():
    assert detect_fs("/dev/x", ScriptedRunner(GPT_PROBE)) == "gpt"


def test_other_blkid_failures_propagate():
    with pytest.raises(CommandFailed):
        detect_fs("/dev/x", ScriptedRunner(blkid_code=4))


@pytest.mark.parametrize(
    "fs_type, mkfs",
    [
        ("ext4", ("mkfs.ext4", "-F", "-q")),
        ("ext3", ("mkfs.ext3", "-F", "-q")),
        ("xfs", ("mkfs.xfs", "-q")),
        ("btrfs", ("mkfs.btrfs", "-q")),
    ],
)
def test_blank_device_is_formatted_non_interactively(fs_type, mkfs):
    runner = ScriptedRunner(blkid_code=2)
    assert ensure_fs("/dev/x", fs_type, runner) is True
    assert runner.calls[-1] == (*mkfs, "/dev/x")


def test_same_type_is_left_alone():
    runner = ScriptedRunner(EXT4_PROBE)
    assert ensure_fs("/dev/x", "ext4", runner) is False
    assert [c[0] for c in runner.calls] == ["blkid"]


@pytest.mark.parametrize(
    "runner, wanted, message",
    [
        (ScriptedRunner(EXT4_PROBE), "xfs", "holds an existing ext4 file system.*Request fs_type 'ext4'.*wipefs -a /dev/x"),
        (ScriptedRunner(GPT_PROBE), "ext4", "holds an existing gpt partition table.*wipefs -a /dev/x"),
        (ScriptedRunner("TYPE=swap\n"), "ext4", "holds an existing swap file system.*If its data"),
        (ScriptedRunner(blkid_code=8), "ext4", "several contradicting signatures"),
    ],
)
def test_anything_else_is_never_formatted(runner, wanted, message):
    with pytest.raises(FilesystemMismatch, match=message):
        ensure_fs("/dev/x", wanted, runner)
    assert not any(c[0].startswith("mkfs") for c in runner.calls)


def test_unsupported_type_is_rejected_before_probing():
    runner = ScriptedRunner(blkid_code=2)
    with pytest.raises(UnsupportedFilesystem, match="ext4, ext3, xfs, btrfs"):
        ensure_fs("/dev/x", "vfat", runner)
    assert runner.calls == []
