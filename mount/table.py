"""The mount table as a typed, immutable snapshot of ``/proc/self/mountinfo``.

Every "is it already done?" decision of the Node service is taken from this
table (the kernel's view), never from files left in the target directory.

Line format (proc(5))::

    36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
    (1)(2) (3)  (4)   (5)      (6)      (7)   (8) (9)   (10)         (11)

(7) is zero or more optional fields ended by the single ``-`` separator (8).
The kernel escapes space, tab, newline and backslash in paths as ``\\ooo``.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

MOUNTINFO_PATH = "/proc/self/mountinfo"

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


class MountinfoParseError(ValueError):
    """A mountinfo line does not have the documented shape."""


def unescape_mountinfo(field: str) -> str:
    """Undo the kernel's ``\\ooo`` escapes (``\\040`` is a space, ``\\134`` a backslash)."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class MountEntry:
    mount_id: int
    parent_id: int
    major: int
    minor: int
    root: str  # the directory of the file system that is mounted here ("/" unless a bind of a subtree)
    mount_point: str
    options: tuple[str, ...]  # per-mount options (ro/rw, nosuid, ...)
    fs_type: str
    source: str
    super_options: tuple[str, ...]  # per-superblock options
    optional_fields: tuple[str, ...] = ()  # shared:N, master:N, propagate_from:N, unbindable

    @property
    def device_number(self) -> int:
        """``st_dev`` of files on this mount (for block-backed fs, ``st_rdev`` of the device)."""
        return os.makedev(self.major, self.minor)

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


def parse_mountinfo_line(line: str) -> MountEntry:
    fields = line.split(" ")
    try:
        separator = fields.index("-", 6)
    except ValueError:
        raise MountinfoParseError(f"no '-' separator in mountinfo line: {line!r}") from None
    if len(fields) < separator + 4:
        raise MountinfoParseError(f"too few fields in mountinfo line: {line!r}")
    major, sep, minor = fields[2].partition(":")
    if not sep:
        raise MountinfoParseError(f"bad major:minor {fields[2]!r} in mountinfo line: {line!r}")
    try:
        return MountEntry(
            mount_id=int(fields[0]),
            parent_id=int(fields[1]),
            major=int(major),
            minor=int(minor),
            root=unescape_mountinfo(fields[3]),
            mount_point=unescape_mountinfo(fields[4]),
            options=tuple(fields[5].split(",")),
            fs_type=unescape_mountinfo(fields[separator + 1]),
            source=unescape_mountinfo(fields[separator + 2]),
            super_options=tuple(unescape_mountinfo(fields[separator + 3]).split(",")),
            optional_fields=tuple(fields[6:separator]),
        )
    except ValueError:
        raise MountinfoParseError(f"non-numeric id in mountinfo line: {line!r}") from None


def parse_mountinfo(text: str) -> tuple[MountEntry, ...]:
    """Parse the whole file; blank lines are skipped, malformed ones raise :class:`MountinfoParseError`."""
    return tuple(parse_mountinfo_line(line) for line in text.splitlines() if line.strip())


def _normalize(path: str) -> str:
    return os.path.normpath(path) if path else path


@dataclass(frozen=True)
class MountTable:
    """An immutable snapshot; lookups compare normalized absolute paths, no file system access."""

    entries: tuple[MountEntry, ...]

    def all_at(self, mount_point: str) -> tuple[MountEntry, ...]:
        """Every mount stacked on this path, bottom first (in mountinfo order)."""
        wanted = _normalize(mount_point)
        return tuple(e for e in self.entries if e.mount_point == wanted)

    def at(self, mount_point: str) -> MountEntry | None:
        """The topmost mount on this path (the one visible there), or None."""
        stacked = self.all_at(mount_point)
        if not stacked:
            return None
        # The visible mount is the one no other mount on the same path sits on;
        # mountinfo order alone is not guaranteed after moves and propagation.
        covered = {e.parent_id for e in stacked}
        visible = [e for e in stacked if e.mount_id not in covered]
        return (visible or list(stacked))[-1]

    def is_mount_point(self, path: str) -> bool:
        return bool(self.all_at(path))

    def containing(self, path: str) -> MountEntry | None:
        """The visible mount whose file system holds ``path`` (the deepest mount point above it)."""
        current = _normalize(path)
        while True:
            entry = self.at(current)
            if entry is not None:
                return entry
            parent = os.path.dirname(current)
            if parent == current:
                return None
            current = parent

    def of_device(self, device: str) -> tuple[MountEntry, ...]:
        """Mounts that expose ``device``: its file system, or its node bind-mounted from devtmpfs."""
        st = os.stat(device)
        node = "/" + os.path.relpath(os.path.realpath(device), "/dev")
        return tuple(
            e for e in self.entries
            if shows_device(e, st.st_rdev) or (e.fs_type == "devtmpfs" and e.root == node)
        )

    def under(self, path: str) -> tuple[MountEntry, ...]:
        """Mounts at ``path`` or below it, in mountinfo order."""
        base = _normalize(path)
        prefix = base.rstrip("/") + "/"
        return tuple(e for e in self.entries if e.mount_point == base or e.mount_point.startswith(prefix))


def read_mount_table(path: str = MOUNTINFO_PATH) -> MountTable:
    # surrogateescape keeps non-UTF-8 path bytes round-trippable to os functions.
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return MountTable(parse_mountinfo(f.read()))


def shows_device(entry: MountEntry, rdev: int) -> bool:
    """Whether a mount is of the file system on block device ``rdev``.

    Most file systems report the device's own major:minor; btrfs reports an
    anonymous 0:N, so for it we look at the mount source instead.
    """
    if entry.device_number == rdev:
        return True
    try:
        source = os.stat(entry.source)
    except OSError:
        return False
    return stat.S_ISBLK(source.st_mode) and source.st_rdev == rdev
