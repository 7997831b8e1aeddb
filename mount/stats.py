"""Usage of published volumes (NodeGetVolumeStats) and the devices behind mounts."""

from __future__ import annotations

import fcntl
import os
import stat
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mount.errors import NotABlockDevice
from mount.table import MountTable, read_mount_table

if TYPE_CHECKING:  # pyudev is imported when first needed: it costs start-up time and memory
    import pyudev

BLKGETSIZE64 = 0x80081272  # _IOR(0x12, 114, size_t) on every Linux architecture we run on
SECTOR_SIZE = 512  # sysfs "size" is always in 512-byte sectors


@dataclass(frozen=True)
class Usage:
    bytes_total: int
    bytes_used: int
    bytes_available: int  # to unprivileged users: excludes blocks reserved for root
    inodes_total: int  # 0 on file systems without a fixed inode count (btrfs)
    inodes_used: int
    inodes_available: int


def usage_from_statvfs(st: os.statvfs_result) -> Usage:
    """Same arithmetic as df: used = total - free (free includes root's reserve), available = f_bavail."""
    return Usage(
        bytes_total=st.f_blocks * st.f_frsize,
        bytes_used=(st.f_blocks - st.f_bfree) * st.f_frsize,
        bytes_available=st.f_bavail * st.f_frsize,
        inodes_total=st.f_files,
        inodes_used=st.f_files - st.f_ffree,
        inodes_available=st.f_favail,
    )


def filesystem_usage(path: str) -> Usage:
    return usage_from_statvfs(os.statvfs(path))


def block_device_size(path: str) -> int:
    """Size in bytes of the block device at ``path``: a device node or a file a device node is bound onto."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if not stat.S_ISBLK(os.fstat(fd).st_mode):
            raise NotABlockDevice(f"{path} is not a block device (nor bound to one)")
        return struct.unpack("Q", fcntl.ioctl(fd, BLKGETSIZE64, b"\0" * 8))[0]
    finally:
        os.close(fd)


@dataclass(frozen=True)
class MountedDevice:
    """The block device behind a mount, as udev/sysfs name it."""

    mount_point: str
    fs_type: str
    source: str  # as the mount table says, e.g. /dev/mapper/vg-lv
    device_node: str | None  # kernel name, e.g. /dev/dm-3; None if not a block device (tmpfs, ...)
    size_bytes: int | None  # from sysfs
    dm_name: str | None = None  # device-mapper name (vg-lv) when it is a DM device


def _udev_block_device(context: pyudev.Context, path: str, major: int, minor: int, source: str) -> pyudev.Device | None:
    import pyudev

    candidates = [os.makedev(major, minor)]
    try:
        st = os.stat(path)
        if stat.S_ISBLK(st.st_mode):  # a device node bound onto a file: the mount shows devtmpfs
            candidates.insert(0, st.st_rdev)
    except OSError:
        pass
    for number in candidates:
        try:
            return pyudev.Devices.from_device_number(context, "block", number)
        except pyudev.DeviceNotFoundError:
            pass
    # btrfs shows an anonymous 0:N in the mount table; its source names the device.
    try:
        return pyudev.Devices.from_device_file(context, source)
    except (pyudev.DeviceNotFoundError, ValueError, OSError):
        return None


def device_of_mount(path: str, table: MountTable | None = None) -> MountedDevice | None:
    """The device mounted at ``path`` (the topmost mount there), or None if ``path`` is not a mount point."""
    entry = (table or read_mount_table()).at(os.path.realpath(path))
    if entry is None:
        return None
    import pyudev

    device = _udev_block_device(pyudev.Context(), entry.mount_point, entry.major, entry.minor, entry.source)
    if device is None:
        return MountedDevice(entry.mount_point, entry.fs_type, entry.source, None, None)
    sectors = device.attributes.get("size")
    dm_name = device.attributes.get("dm/name")
    return MountedDevice(
        mount_point=entry.mount_point,
        fs_type=entry.fs_type,
        source=entry.source,
        device_node=device.device_node,
        size_bytes=int(sectors) * SECTOR_SIZE if sectors is not None else None,
        dm_name=dm_name.decode().strip() if dm_name is not None else None,
    )
