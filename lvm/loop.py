"""Loop devices: attached and detached with the kernel's loop ioctls, read from sysfs and procfs.

Attaching is what ``losetup --find --show`` does, done in-process:
``LOOP_CTL_GET_FREE`` on ``/dev/loop-control``, then ``LOOP_CONFIGURE`` (or,
before Linux 5.8, ``LOOP_SET_FD`` + ``LOOP_SET_STATUS64``) on the free device,
retrying when another process took it first.  Detaching is ``LOOP_CLR_FD``.
No process is forked: a fork holds the interpreter lock for milliseconds in a
server this size, which stalled every other RPC while a volume was created.

Reading ``/sys/block/loop*/loop/backing_file`` answers "which device backs this
file".  When a backing file is removed while attached, the kernel appends
`` (deleted)`` to the path it reports; such a device never matches the (new)
file now at that path.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lvm.errors import StorageError, VolumeBusy
from lvm.units import MiB

SYS_BLOCK = Path("/sys/block")
LOOP_CONTROL = Path("/dev/loop-control")
MOUNTINFO = Path("/proc/self/mountinfo")
DEV = Path("/dev")
DELETED_SUFFIX = " (deleted)"

# <linux/loop.h>
LOOP_SET_FD = 0x4C00
LOOP_CLR_FD = 0x4C01
LOOP_SET_STATUS64 = 0x4C04
LOOP_SET_CAPACITY = 0x4C07
LOOP_CONFIGURE = 0x4C0A  # Linux 5.8+
LOOP_CTL_GET_FREE = 0x4C82
LO_NAME_SIZE = 64
# struct loop_info64: device, inode, rdevice, offset, sizelimit (u64); number,
# encrypt_type, encrypt_key_size, flags (u32); file_name, crypt_name (64 bytes),
# encrypt_key (32 bytes); init[2] (u64).
LOOP_INFO64 = struct.Struct("=5Q4I64s64s32s2Q")
# struct loop_config: fd, block_size (u32); struct loop_info64; __reserved[8] (u64).
LOOP_CONFIG_HEAD = struct.Struct("=II")
LOOP_CONFIG_RESERVED = 8 * 8
ATTACH_ATTEMPTS = 16  # another process may take the free device between GET_FREE and CONFIGURE


class LoopDeviceFailed(StorageError):
    """The kernel refused to attach or detach a loop device."""


@dataclass(frozen=True)
class LoopDevice:
    """An attached loop device and the file behind it, as the kernel reports it."""

    device: str  # /dev/loopN
    backing_file: str  # without the " (deleted)" suffix
    deleted: bool = False  # the backing file was removed while attached


def parse_backing_file(text: str) -> tuple[str, bool]:
    """Split sysfs' ``backing_file`` into (path, deleted)."""
    path = text.rstrip("\n")
    if path.endswith(DELETED_SUFFIX):
        return path[: -len(DELETED_SUFFIX)], True
    return path, False


def _read_backing_file(sys_block_dir: str, name: str) -> tuple[str, bool] | None:
    """(path, deleted) from ``<sys_block>/<name>/loop/backing_file``; None when not bound.

    Plain strings and os calls rather than pathlib: this runs on every create
    and delete.
    """
    try:
        with open(f"{sys_block_dir}/{name}/loop/backing_file", encoding="utf-8", errors="surrogateescape") as f:
            return parse_backing_file(f.read())
    except OSError:  # not bound, or detached meanwhile
        return None


def list_attached(sys_block: Path = SYS_BLOCK) -> list[LoopDevice]:
    """Every attached loop device, sorted by device name (over every loop device of the host).

    Devices that detach while we read are skipped.
    """
    root = os.fspath(sys_block)
    try:
        names = sorted(name for name in os.listdir(root) if name.startswith("loop"))
    except OSError:
        return []
    found = []
    for name in names:
        backing = _read_backing_file(root, name)
        if backing is not None:
            found.append(LoopDevice(f"/dev/{name}", *backing))
    return found


def backing_file_of(device: str, sys_block: Path = SYS_BLOCK) -> str | None:
    """The file behind ``device`` (one sysfs read); None when detached or its file was removed."""
    backing = _read_backing_file(os.fspath(sys_block), os.path.basename(device))
    return backing[0] if backing is not None and not backing[1] else None


def devices_backed_by(file: str | os.PathLike, attached: list[LoopDevice]) -> list[str]:
    """The devices in ``attached`` whose backing file is ``file`` (by real path, deleted ones excluded)."""
    path = os.path.realpath(file)
    return [d.device for d in attached if d.backing_file == path and not d.deleted]


def find_attached(file: str | os.PathLike, sys_block: Path = SYS_BLOCK) -> str | None:
    """The loop device backed by ``file``, or None when it is not attached."""
    devices = devices_backed_by(file, list_attached(sys_block))
    return devices[0] if devices else None


def loop_info(path: str | os.PathLike) -> bytes:
    """A ``struct loop_info64`` naming ``path`` (truncated as the kernel does), all else zero."""
    name = os.fsencode(path)[: LO_NAME_SIZE - 1]
    return LOOP_INFO64.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, name, b"", b"", 0, 0)


def loop_config(backing_fd: int, path: str | os.PathLike) -> bytearray:
    """A ``struct loop_config`` for ``LOOP_CONFIGURE``: read-write, default block size."""
    return bytearray(LOOP_CONFIG_HEAD.pack(backing_fd, 0) + loop_info(path) + bytes(LOOP_CONFIG_RESERVED))


def _open_device(number: int, dev: Path, sys_block: Path) -> int:
    """Open /dev/loopN read-write; create the node when /dev is not a devtmpfs (some containers)."""
    path = dev / f"loop{number}"
    try:
        return os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        major, minor = (int(n) for n in (sys_block / f"loop{number}" / "dev").read_text().split(":"))
        with contextlib.suppress(FileExistsError):
            os.mknod(path, 0o660 | stat.S_IFBLK, os.makedev(major, minor))
        return os.open(path, os.O_RDWR | os.O_CLOEXEC)


def _configure(device_fd: int, backing_fd: int, path: str) -> None:
    try:
        fcntl.ioctl(device_fd, LOOP_CONFIGURE, loop_config(backing_fd, path), True)
        return
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTTY):
            raise
    # A kernel without LOOP_CONFIGURE: bind the file, then name it.
    fcntl.ioctl(device_fd, LOOP_SET_FD, backing_fd)
    try:
        fcntl.ioctl(device_fd, LOOP_SET_STATUS64, bytearray(loop_info(path)), True)
    except OSError:
        with contextlib.suppress(OSError):
            fcntl.ioctl(device_fd, LOOP_CLR_FD, 0)
        raise


def attach(
    file: str | os.PathLike,
    loop_control: Path = LOOP_CONTROL,
    dev: Path = DEV,
    sys_block: Path = SYS_BLOCK,
) -> str:
    """Attach ``file`` (read-write) to a free loop device and return the device path.

    ``file`` must not be a symbolic link.  sysfs reports the file's real path
    whatever name it was attached by; the name given here is only recorded in
    the device's status (what ``losetup`` shows as BACK-FILE on old kernels).
    """
    path = os.path.abspath(file)
    backing_fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        for _ in range(ATTACH_ATTEMPTS):
            try:
                control_fd = os.open(loop_control, os.O_RDWR | os.O_CLOEXEC)
                try:
                    number = fcntl.ioctl(control_fd, LOOP_CTL_GET_FREE)
                finally:
                    os.close(control_fd)
                device_fd = _open_device(number, dev, sys_block)
            except OSError as exc:
                raise LoopDeviceFailed(f"no free loop device for {path}: {exc.strerror}") from None
            try:
                _configure(device_fd, backing_fd, path)
                return str(dev / f"loop{number}")
            except OSError as exc:
                if exc.errno != errno.EBUSY:  # EBUSY: another process configured it first
                    raise LoopDeviceFailed(f"cannot attach {path} to {dev}/loop{number}: {exc.strerror}") from None
            finally:
                os.close(device_fd)
        raise LoopDeviceFailed(f"cannot attach {path}: every free loop device was taken by others meanwhile")
    finally:
        os.close(backing_fd)


def detach(device: str, sys_block: Path = SYS_BLOCK) -> None:
    """Detach ``device``; a device that is already detached is success.

    Like ``losetup --detach``, on a device still open elsewhere the kernel
    detaches it when the last user closes it.
    """
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LoopDeviceFailed(f"cannot open {device} to detach it: {exc.strerror}") from None
    try:
        fcntl.ioctl(fd, LOOP_CLR_FD, 0)
    except OSError as exc:
        if exc.errno != errno.ENXIO or is_attached(device, sys_block):  # ENXIO: not attached
            raise LoopDeviceFailed(f"cannot detach {device}: {exc.strerror}") from None
    finally:
        os.close(fd)


def set_capacity(device: str) -> None:
    """Tell ``device`` that its backing file changed size (what ``losetup --set-capacity`` does)."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise LoopDeviceFailed(f"cannot open {device} to resize it: {exc.strerror}") from None
    try:
        fcntl.ioctl(fd, LOOP_SET_CAPACITY, 0)
    except OSError as exc:
        raise LoopDeviceFailed(f"cannot resize {device}: {exc.strerror}") from None
    finally:
        os.close(fd)


def device_size(device: str, sys_block: Path = SYS_BLOCK) -> int | None:
    """The size in bytes the kernel gives ``device`` (one sysfs read); None when unknown."""
    try:
        with open(f"{os.fspath(sys_block)}/{os.path.basename(device)}/size", encoding="ascii") as f:
            return int(f.read()) * 512
    except (OSError, ValueError):
        return None


def is_attached(device: str, sys_block: Path = SYS_BLOCK) -> bool:
    return (sys_block / os.path.basename(device) / "loop" / "backing_file").exists()


def loop_supported(loop_control: Path = LOOP_CONTROL, sys_block: Path = SYS_BLOCK) -> str | None:
    """Why loop devices cannot be used here, or None when they can."""
    try:
        mode = loop_control.stat().st_mode
    except OSError as exc:
        return f"{loop_control} is missing ({exc.strerror}): load the loop module or run with access to it"
    if not stat.S_ISCHR(mode):
        return f"{loop_control} is not a character device"
    # Root passes every read/write access() check: skip the system call (Probe runs this).
    if os.geteuid() != 0 and not os.access(loop_control, os.R_OK | os.W_OK):
        return f"no read/write access to {loop_control}: run as root"
    if not os.path.isdir(sys_block):
        return f"{sys_block} is not readable: sysfs is not mounted"
    return None


def device_number(device: str) -> tuple[int, int]:
    """(major, minor) of a block device node."""
    rdev = os.stat(device).st_rdev
    return os.major(rdev), os.minor(rdev)


def mount_points_of(major: int, minor: int, mountinfo_text: str) -> list[str]:
    """Mount points in a /proc/*/mountinfo text whose source is device ``major:minor``."""
    wanted = f"{major}:{minor}"
    points = []
    for line in mountinfo_text.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[2] == wanted:
            points.append(_unescape_octal(fields[4]))
    return points


def _unescape_octal(text: str) -> str:
    """Undo mountinfo's escaping of space, tab, newline and backslash (``\\040`` ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def busy_reason(device: str, sys_block: Path = SYS_BLOCK, mountinfo: Path = MOUNTINFO) -> str | None:
    """Why ``device`` is in use (held by device-mapper/md, mounted, opened exclusively), or None.

    A plain, non-exclusive ``open()`` by another process is not detected.
    """
    try:
        holders = sorted(p.name for p in (sys_block / os.path.basename(device) / "holders").iterdir())
    except OSError:
        holders = []
    if holders:
        return f"{device} is held by {', '.join(holders)}"
    try:
        points = mount_points_of(*device_number(device), mountinfo.read_text())
    except OSError:
        points = []
    if points:
        return f"{device} is mounted at {', '.join(points)}"
    try:
        fd = os.open(device, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return f"{device} is open exclusively (mounted in another namespace, or in use by a filesystem tool)"
        return None
    os.close(fd)
    return None


def wipe_ends(path: str | os.PathLike, size: int, span: int = MiB) -> None:
    """Overwrite the first and last ``span`` bytes of a device or image of ``size`` bytes with zeros.

    That erases filesystem, partition and LVM signatures (at the start) and
    backup superblocks / GPT copies (at the end).  The device is opened with
    ``O_EXCL``, so a mounted device raises VolumeBusy instead of being damaged.
    """
    flags = os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    if stat.S_ISBLK(os.stat(path).st_mode):
        flags |= os.O_EXCL
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            raise VolumeBusy(f"{os.fspath(path)} is in use (mounted or open exclusively)") from None
        raise
    try:
        for offset in sorted({0, max(0, size - span)}):
            length = min(span, size - offset)
            zeros = bytes(length)
            written = 0
            while written < length:
                written += os.pwrite(fd, zeros[written:], offset + written)
        os.fsync(fd)
    finally:
        os.close(fd)


class LoopDevices(Protocol):
    """The loop-device operations LoopBackend needs; the seam unit tests replace."""

    def attached(self) -> list[LoopDevice]: ...

    def backing_file(self, device: str) -> str | None:
        """The file behind ``device``; None when it is not attached or its file was removed."""
        ...

    def attach(self, image: str) -> str: ...

    def detach(self, device: str) -> None: ...

    def set_capacity(self, device: str) -> None:
        """Make ``device`` take the new size of its backing file."""
        ...

    def size(self, device: str) -> int | None:
        """The device's size in bytes as the kernel has it; None when unknown."""
        ...

    def busy_reason(self, device: str) -> str | None: ...

    def unavailable_reason(self) -> str | None: ...


class SystemLoopDevices:
    """Real loop devices: ioctls for changes, sysfs for reading."""

    def __init__(self, sys_block: Path = SYS_BLOCK, loop_control: Path = LOOP_CONTROL, dev: Path = DEV):
        self.sys_block = sys_block
        self.loop_control = loop_control
        self.dev = dev

    def attached(self) -> list[LoopDevice]:
        return list_attached(self.sys_block)

    def backing_file(self, device: str) -> str | None:
        return backing_file_of(device, self.sys_block)

    def attach(self, image: str) -> str:
        return attach(image, self.loop_control, self.dev, self.sys_block)

    def detach(self, device: str) -> None:
        detach(device, self.sys_block)

    def set_capacity(self, device: str) -> None:
        set_capacity(device)

    def size(self, device: str) -> int | None:
        return device_size(device, self.sys_block)

    def busy_reason(self, device: str) -> str | None:
        return busy_reason(device, self.sys_block)

    def unavailable_reason(self) -> str | None:
        return loop_supported(self.loop_control, self.sys_block)
