"""Loop devices: attach and detach with losetup, everything else read from sysfs and procfs.

Reading ``/sys/block/loop*/loop/backing_file`` answers "which device backs this
file" without starting a process.  When a backing file is removed while
attached, the kernel appends `` (deleted)`` to the path it reports; such a
device never matches the (new) file now at that path.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lvm.command import Runner
from lvm.errors import CommandFailed, VolumeBusy
from lvm.units import MiB

SYS_BLOCK = Path("/sys/block")
LOOP_CONTROL = Path("/dev/loop-control")
MOUNTINFO = Path("/proc/self/mountinfo")
DELETED_SUFFIX = " (deleted)"
LOSETUP_TIMEOUT = 30.0


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


def list_attached(sys_block: Path = SYS_BLOCK) -> list[LoopDevice]:
    """Every attached loop device, sorted by device name.

    Devices that detach while we read are skipped.
    """
    found = []
    try:
        entries = sorted(p for p in sys_block.iterdir() if p.name.startswith("loop"))
    except OSError:
        return []
    for entry in entries:
        try:
            text = (entry / "loop" / "backing_file").read_text()
        except OSError:  # not bound, or detached meanwhile
            continue
        path, deleted = parse_backing_file(text)
        found.append(LoopDevice(f"/dev/{entry.name}", path, deleted))
    return found


def devices_backed_by(file: str | os.PathLike, attached: list[LoopDevice]) -> list[str]:
    """The devices in ``attached`` whose backing file is ``file`` (by real path, deleted ones excluded)."""
    path = os.path.realpath(file)
    return [d.device for d in attached if d.backing_file == path and not d.deleted]


def find_attached(file: str | os.PathLike, sys_block: Path = SYS_BLOCK) -> str | None:
    """The loop device backed by ``file``, or None when it is not attached."""
    devices = devices_backed_by(file, list_attached(sys_block))
    return devices[0] if devices else None


def attach(file: str | os.PathLike, runner: Runner) -> str:
    """Attach ``file`` to a free loop device and return the device path."""
    result = runner.run(["losetup", "--find", "--show", os.fspath(file)], timeout=LOSETUP_TIMEOUT)
    device = result.stdout.strip()
    if not device.startswith("/dev/"):
        raise CommandFailed(f"losetup printed no device for {file}: {result.stdout!r}", argv=result.argv)
    return device


def detach(device: str, runner: Runner, sys_block: Path = SYS_BLOCK) -> None:
    """Detach ``device``; a device that is already detached is success."""
    try:
        runner.run(["losetup", "--detach", device], timeout=LOSETUP_TIMEOUT)
    except CommandFailed:
        if is_attached(device, sys_block):
            raise


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
    if not os.access(loop_control, os.R_OK | os.W_OK):
        return f"no read/write access to {loop_control}: run as root"
    if not sys_block.is_dir():
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

    def attach(self, image: str) -> str: ...

    def detach(self, device: str) -> None: ...

    def busy_reason(self, device: str) -> str | None: ...

    def unavailable_reason(self) -> str | None: ...


class SystemLoopDevices:
    """Real loop devices: losetup through ``runner`` for changes, sysfs for reading."""

    def __init__(self, runner: Runner, sys_block: Path = SYS_BLOCK, loop_control: Path = LOOP_CONTROL):
        self.runner = runner
        self.sys_block = sys_block
        self.loop_control = loop_control
        self._losetup_runs = False

    def attached(self) -> list[LoopDevice]:
        return list_attached(self.sys_block)

    def attach(self, image: str) -> str:
        return attach(image, self.runner)

    def detach(self, device: str) -> None:
        detach(device, self.runner, self.sys_block)

    def busy_reason(self, device: str) -> str | None:
        return busy_reason(device, self.sys_block)

    def unavailable_reason(self) -> str | None:
        reason = loop_supported(self.loop_control, self.sys_block)
        if reason:
            return reason
        if not self._losetup_runs:
            # Once is enough: Probe is called often (liveness checks) and must stay cheap.
            try:
                self.runner.run(["losetup", "--version"], timeout=LOSETUP_TIMEOUT)
            except CommandFailed as exc:
                return f"losetup does not run: {exc}"
            self._losetup_runs = True
        return None
