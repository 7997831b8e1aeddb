"""Growing a file system to fill its grown block device: never shrinking, never reformatting.

ext2/3/4 grow mounted or not (``resize2fs``; unmounted after a forced
``e2fsck``, which resize2fs demands).  xfs and btrfs grow only while mounted
(``xfs_growfs``, ``btrfs filesystem resize max``): an unmounted one is grown
by the next stage, which mounts it first.  Growing a file system that already
fills its device does nothing, so every call here is idempotent.

:func:`filesystem_size` reads the size a file system believes it has from its
superblock, so a stage can tell without starting a process whether there is
anything to grow.
"""

from __future__ import annotations

import mmap
import os
import struct

from lvm.command import Runner
from lvm.errors import CommandFailed, OutOfRange
from mount.errors import ResizeFailed, UnsupportedFilesystem
from mount.stats import block_device_size

RESIZE_TIMEOUT = 600.0  # growing a large, busy file system can take minutes
EXT_FAMILY = ("ext2", "ext3", "ext4")
BTRFS_RESIZE_MINIMUM = 256 << 20  # the kernel refuses (EINVAL) to resize a btrfs to less than 256 MiB
E2FSCK_FIXED = 1  # e2fsck: errors were corrected (anything above needs a person)

# Superblock fields (offsets in bytes from the start of the device).
_EXT_SUPER = 1024
_EXT_MAGIC = 0xEF53
_EXT_INCOMPAT_64BIT = 0x80
_XFS_MAGIC = b"XFSB"
_BTRFS_SUPER = 64 * 1024
_BTRFS_MAGIC = b"_BHRfS_M"


def _read_direct(device: str, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of ``device``, past the page cache: a mounted file system writes its
    superblock around the block device's cache, so a cached read may show the size before a resize."""
    align = mmap.PAGESIZE
    start = offset - offset % align
    span = -(-(offset + length - start) // align) * align
    buffer = mmap.mmap(-1, span)  # page-aligned, as O_DIRECT wants
    fd = os.open(device, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    try:
        got = os.preadv(fd, [buffer], start)
        return bytes(buffer[offset - start : min(got, offset - start + length)])
    finally:
        os.close(fd)
        buffer.close()


def filesystem_size(device: str, fs_type: str) -> int | None:
    """The size in bytes the file system on ``device`` occupies, from its superblock; None when unknown."""
    try:
        if fs_type in EXT_FAMILY:
            sb = _read_direct(device, _EXT_SUPER, 0x160)
            if len(sb) < 0x160 or struct.unpack_from("<H", sb, 0x38)[0] != _EXT_MAGIC:
                return None
            blocks = struct.unpack_from("<I", sb, 0x04)[0]
            if struct.unpack_from("<I", sb, 0x60)[0] & _EXT_INCOMPAT_64BIT:
                blocks |= struct.unpack_from("<I", sb, 0x150)[0] << 32
            return blocks * (1024 << struct.unpack_from("<I", sb, 0x18)[0])
        if fs_type == "xfs":
            sb = _read_direct(device, 0, 16)
            if sb[:4] != _XFS_MAGIC:
                return None
            block_size, data_blocks = struct.unpack_from(">IQ", sb, 4)
            return block_size * data_blocks
        if fs_type == "btrfs":
            sb = _read_direct(device, _BTRFS_SUPER, 0x78)
            if len(sb) < 0x78 or sb[0x40:0x48] != _BTRFS_MAGIC:
                return None
            return struct.unpack_from("<Q", sb, 0x70)[0]
    except OSError:
        return None
    return None


def needs_growing(device: str, fs_type: str, device_size: int, threshold: int) -> bool:
    """True when the file system on ``device`` is at least ``threshold`` bytes smaller than the device."""
    fs_size = filesystem_size(device, fs_type)
    return fs_size is not None and device_size - fs_size >= threshold


def grow_filesystem(device: str, fs_type: str, runner: Runner, *, mount_point: str | None = None) -> bool:
    """Grow the ``fs_type`` file system on ``device`` to the device's size; True when a tool ran.

    ``mount_point`` is where it is mounted (None: not mounted).  Raises
    UnsupportedFilesystem for other types and ResizeFailed with the tool's words.
    """
    if fs_type in EXT_FAMILY:
        if mount_point is None:
            _run(["e2fsck", "-f", "-p", device], runner, ok_codes=(0, E2FSCK_FIXED))
        _run(["resize2fs", device], runner)
        return True
    if fs_type == "xfs":
        if mount_point is None:
            return False
        _run(["xfs_growfs", mount_point], runner)
        return True
    if fs_type == "btrfs":
        if mount_point is None:
            return False
        size = block_device_size(device)
        if size < BTRFS_RESIZE_MINIMUM:
            raise OutOfRange(
                f"btrfs cannot grow to {size} bytes: the kernel resizes btrfs file systems only to "
                f"{BTRFS_RESIZE_MINIMUM} bytes (256 MiB) or more; expand the volume to at least that"
            )
        _run(["btrfs", "filesystem", "resize", "max", mount_point], runner)
        return True
    raise UnsupportedFilesystem(f"cannot grow a {fs_type!r} file system: csilvm grows ext2/3/4, xfs and btrfs")


def _run(argv: list[str], runner: Runner, ok_codes: tuple[int, ...] = (0,)) -> None:
    try:
        runner.run(argv, timeout=RESIZE_TIMEOUT, ok_codes=ok_codes)
    except CommandFailed as exc:
        raise ResizeFailed(
            f"{argv[0]} could not grow the file system on {argv[-1]} (exit code {exc.returncode}): "
            f"{exc.stderr.strip() or '(no message)'}; the volume itself has grown, so retrying NodeExpandVolume "
            f"(or a new stage) will try again once the cause is fixed"
        ) from None
