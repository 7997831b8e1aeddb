"""Probing and creating file systems on a block device, never destroying one.

The probe is ``blkid -p`` (low-level, straight from the device, no cache), so a
signature written a second ago is seen.  Anything the probe finds that is not
the requested type, a partition table included, stops us: formatting is only
ever done on a blank device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from lvm.command import Runner
from lvm.errors import CommandFailed
from mount.errors import FilesystemMismatch, UnsupportedFilesystem

SUPPORTED_FS_TYPES: tuple[str, ...] = ("ext4", "ext3", "xfs", "btrfs")

# Non-interactive flags: -F stops mke2fs asking "Proceed anyway?" (it is *not*
# needed to overwrite: we only run mkfs on a device blkid found blank).  xfs
# and btrfs never prompt; we deliberately do not pass their -f, so they keep
# their own refusal to overwrite a signature as a second safety net.
MKFS_ARGV: Mapping[str, tuple[str, ...]] = {
    "ext4": ("mkfs.ext4", "-F", "-q"),
    "ext3": ("mkfs.ext3", "-F", "-q"),
    "xfs": ("mkfs.xfs", "-q"),
    "btrfs": ("mkfs.btrfs", "-q"),
}

MKFS_TIMEOUT = 600.0  # discarding a large device can take minutes
PROBE_TIMEOUT = 60.0

BLKID_NOTHING_FOUND = 2
BLKID_AMBIVALENT = 8  # several signatures that contradict each other


@dataclass(frozen=True)
class Probe:
    """What ``blkid -p`` found on a device."""

    fs_type: str | None = None  # TYPE: a file system (or swap, crypto_LUKS, LVM2_member, ...)
    partition_table: str | None = None  # PTTYPE: dos, gpt, ...
    ambivalent: bool = False  # several contradicting signatures

    @property
    def blank(self) -> bool:
        return self.fs_type is None and self.partition_table is None and not self.ambivalent

    def describe(self) -> str:
        if self.fs_type:
            return f"an existing {self.fs_type} file system"
        if self.partition_table:
            return f"an existing {self.partition_table} partition table"
        if self.ambivalent:
            return "several contradicting signatures"
        return "nothing"


def parse_blkid_export(text: str) -> dict[str, str]:
    """``KEY=value`` lines of ``blkid -o export``; values are already shell-unescaped enough for our keys."""
    pairs = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            pairs[key.strip()] = value.strip()
    return pairs


def probe_device(device: str, runner: Runner) -> Probe:
    result_or_code = _run_blkid(device, runner)
    if result_or_code == BLKID_NOTHING_FOUND:
        return Probe()
    if result_or_code == BLKID_AMBIVALENT:
        return Probe(ambivalent=True)
    found = parse_blkid_export(result_or_code)
    return Probe(fs_type=found.get("TYPE") or None, partition_table=found.get("PTTYPE") or None)


def _run_blkid(device: str, runner: Runner) -> str | int:
    """Stdout of the probe, or blkid's exit code when it found nothing / too much."""
    try:
        return runner.run(["blkid", "-p", "-o", "export", device], timeout=PROBE_TIMEOUT).stdout
    except CommandFailed as exc:
        if exc.returncode in (BLKID_NOTHING_FOUND, BLKID_AMBIVALENT):
            return exc.returncode
        raise


def detect_fs(device: str, runner: Runner) -> str | None:
    """The file system type on ``device``, else its partition table type, else None (blank)."""
    probe = probe_device(device, runner)
    return probe.fs_type or probe.partition_table


def check_supported(fs_type: str) -> str:
    if fs_type not in SUPPORTED_FS_TYPES:
        raise UnsupportedFilesystem(
            f"file system type {fs_type!r} is not supported; choose one of {', '.join(SUPPORTED_FS_TYPES)}"
        )
    return fs_type


def make_fs(device: str, fs_type: str, runner: Runner) -> None:
    """Create ``fs_type`` on ``device`` unconditionally.

    Call :func:`ensure_fs` instead unless the device is known to be blank.
    """
    argv = MKFS_ARGV[check_supported(fs_type)]
    runner.run([*argv, device], timeout=MKFS_TIMEOUT)


def ensure_fs(device: str, fs_type: str, runner: Runner) -> bool:
    """Make sure ``device`` holds ``fs_type``: format it if blank; True when it was formatted now.

    Raises :class:`FilesystemMismatch` when the device holds anything else,
    leaving it untouched.
    """
    check_supported(fs_type)
    probe = probe_device(device, runner)
    if probe.fs_type == fs_type and probe.partition_table is None:
        return False
    if probe.blank:
        make_fs(device, fs_type, runner)
        return True
    reusable = probe.fs_type in SUPPORTED_FS_TYPES
    advice = f"Request fs_type {probe.fs_type!r} to use it as it is, or, if" if reusable else "If"
    raise FilesystemMismatch(
        f"{device} already holds {probe.describe()}, not the requested {fs_type}; csilvm never reformats a "
        f"device. {advice} its data is not needed, erase the signatures (wipefs -a {device}) and retry"
    )
