"""Growing a file system to fill its grown block device: never shrinking, never reformatting.

ext2/3/4 grow mounted or not (``resize2fs``; unmounted after a forced
``e2fsck``, which resize2fs demands).  xfs and btrfs grow only while mounted
(``xfs_growfs``, ``btrfs filesystem resize <devid>:max``): an unmounted one is
grown by the next stage, which mounts it first.  Whether and where the device
is mounted is taken from the kernel's mount table, never assumed.  Growing a
file system that already fills its device does nothing, so every call here is
idempotent.

:func:`filesystem_size` reads the size a file system believes it has from its
superblock, so a stage can tell without starting a process whether there is
anything to grow.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Callable

from lvm.command import Runner
from lvm.errors import CommandFailed, CommandTimeout, OutOfRange
from mount.errors import ResizeFailed, UnsupportedFilesystem
from mount.fs import probe_device
from mount.stats import block_device_size
from mount.table import MountEntry, MountTable, read_mount_table, shows_device

RESIZE_TIMEOUT = 600.0  # growing a large, busy file system can take minutes
EXT_FAMILY = ("ext2", "ext3", "ext4")
BTRFS_RESIZE_MINIMUM = 256 << 20  # the kernel refuses (EINVAL) to resize a btrfs to less than 256 MiB
E2FSCK_FIXED = 1  # e2fsck: errors were corrected (anything above needs a person)
GROWABLE = (*EXT_FAMILY, "xfs", "btrfs")

# Superblock fields (offsets in bytes from the start of the device).
_EXT_SUPER = 1024
_EXT_MAGIC = 0xEF53
_EXT_INCOMPAT_64BIT = 0x80
_XFS_MAGIC = b"XFSB"
_BTRFS_SUPER = 64 * 1024
_BTRFS_MAGIC = b"_BHRfS_M"
_BTRFS_DEV_ITEM = 0xC9  # this device's item: devid (le64), then the bytes of this device the fs uses (le64)


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
    """The bytes of ``device`` its file system occupies, from its superblock; None when unknown."""
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
            found = _btrfs_dev_item(device)
            return found[1] if found else None
    except OSError:
        return None
    return None


def _btrfs_dev_item(device: str) -> tuple[int, int] | None:
    """(devid, bytes used on this device) of the btrfs on ``device``; a btrfs may span several devices."""
    sb = _read_direct(device, _BTRFS_SUPER, _BTRFS_DEV_ITEM + 16)
    if len(sb) < _BTRFS_DEV_ITEM + 16 or sb[0x40:0x48] != _BTRFS_MAGIC:
        return None
    return struct.unpack_from("<QQ", sb, _BTRFS_DEV_ITEM)


def needs_growing(device: str, fs_type: str, device_size: int, threshold: int) -> bool:
    """True when the file system on ``device`` is at least ``threshold`` bytes smaller than the device."""
    fs_size = filesystem_size(device, fs_type)
    return fs_size is not None and device_size - fs_size >= threshold


def grow_filesystem(
    device: str,
    fs_type: str | None,
    runner: Runner,
    *,
    mount_point: str | None = None,
    read_table: Callable[[], MountTable] = read_mount_table,
) -> bool:
    """Grow the file system on ``device`` to the device's size; True when a tool ran.

    ``fs_type`` None: ``blkid -p`` tells.  ``mount_point`` None: the mount table
    tells whether (and where) ``device`` is mounted; given, it must be a mount of
    ``device``.  Mounted, everything grows online.  Not mounted, ext2/3/4 is
    checked (``e2fsck -f -p``) and grown offline, while xfs and btrfs, which grow
    only mounted, are left alone (False): the next stage grows them once mounted.

    Raises UnsupportedFilesystem (another type), ResizeFailed (no file system,
    ``mount_point`` not a mount of ``device``, or a tool failed: its words are in
    the message), OutOfRange (btrfs under 256 MiB), CommandTimeout (a tool ran
    past its deadline; the file system is still consistent, retry).
    """
    if fs_type is None:
        fs_type = probe_device(device, runner).fs_type
        if fs_type is None:
            raise ResizeFailed(f"{device} holds no file system (blkid found none): there is nothing to grow")
    if fs_type not in GROWABLE:
        raise UnsupportedFilesystem(f"cannot grow a {fs_type!r} file system: csilvm grows {', '.join(GROWABLE)}")
    mount = _mount_of(device, mount_point, read_table())
    if fs_type in EXT_FAMILY:
        if mount is None:
            _run(["e2fsck", "-f", "-p", device], runner, ok_codes=(0, E2FSCK_FIXED))
        _run(["resize2fs", device], runner)  # online when mounted: resize2fs finds out itself
        return True
    if mount is None:
        return False
    if fs_type == "xfs":
        _run(["xfs_growfs", mount.mount_point], runner)
        return True
    size = block_device_size(device)
    if size < BTRFS_RESIZE_MINIMUM:
        raise OutOfRange(
            f"btrfs cannot grow to {size} bytes: the kernel resizes btrfs file systems only to "
            f"{BTRFS_RESIZE_MINIMUM} bytes (256 MiB) or more; expand the volume to at least that"
        )
    # Name the device: a bare "max" means devid 1, another device or none at all once the file system
    # has spanned several (after "btrfs device add" and "remove" the one device left is devid 2).
    dev_item = _btrfs_dev_item(device)
    target = f"{dev_item[0]}:max" if dev_item else "max"
    _run(["btrfs", "filesystem", "resize", target, mount.mount_point], runner)
    return True


def _mount_of(device: str, mount_point: str | None, table: MountTable) -> MountEntry | None:
    """The mount of ``device`` to grow through: the one at ``mount_point``, else any (a whole-fs one first).

    A btrfs spanning several devices shows one of them in the mount table; only that one is found here
    (csilvm volumes are single devices).
    """
    rdev = os.stat(device).st_rdev
    mounts = sorted((e for e in table.entries if shows_device(e, rdev)), key=lambda e: e.root != "/")
    if mount_point is None:
        return mounts[0] if mounts else None
    entry = table.at(os.path.realpath(mount_point))
    if entry is not None and shows_device(entry, rdev):
        return entry
    where = f"it is mounted at {', '.join(e.mount_point for e in mounts)}" if mounts else "it is not mounted"
    raise ResizeFailed(
        f"cannot grow the file system on {device} through {mount_point}: that is not a mount of {device} "
        f"({where}); pass the path where {device} is mounted, or none to let csilvm find it"
    )


def _run(argv: list[str], runner: Runner, ok_codes: tuple[int, ...] = (0,)) -> None:
    try:
        runner.run(argv, timeout=RESIZE_TIMEOUT, ok_codes=ok_codes)
    except CommandTimeout:
        raise  # DEADLINE_EXCEEDED: the CO retries; resize2fs, xfs_growfs and btrfs leave a consistent fs
    except CommandFailed as exc:
        words = exc.stderr.strip() or str(exc)
        if argv[0] == "e2fsck":
            raise ResizeFailed(
                f"e2fsck -f -p {argv[-1]} (run before growing it offline) found problems it will not fix "
                f"unattended (exit code {exc.returncode}): {words}; repair it by hand (e2fsck -f {argv[-1]}) "
                f"while it is not mounted, then stage it again"
            ) from None
        raise ResizeFailed(
            f"{argv[0]} could not grow the file system on {argv[-1]} (exit code {exc.returncode}): "
            f"{words}; the volume itself has grown, so retrying NodeExpandVolume "
            f"(or a new stage) will try again once the cause is fixed"
        ) from None
