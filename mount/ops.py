"""What the CSI Node service does to the host: stage, unstage, publish, unpublish.

Every operation is idempotent and decides "already done" from the kernel's
mount table (:mod:`mount.table`), comparing device numbers, never from files
left in a directory.  Nothing here deletes data: a path that holds anything
we did not put there raises :class:`TargetBusy` instead.

Callers must serialize operations on the same volume / path (the checks and
the mount are not atomic against a concurrent caller).
"""

from __future__ import annotations

import os
import re
import stat
from typing import Callable, Iterable

from lvm.command import Runner
from lvm.errors import CommandFailed
from mount.errors import FilesystemMismatch, InvalidMountFlags, MountFailed, NotABlockDevice, TargetBusy, UnmountBusy
from mount.fs import check_supported, ensure_fs
from mount.resize import EXT_FAMILY, grow_filesystem, needs_growing
from mount.stats import block_device_size
from mount.table import MountEntry, MountTable, read_mount_table, shows_device

TableReader = Callable[[], MountTable]

MOUNT_TIMEOUT = 120.0
GROW_THRESHOLD = 1 << 20  # a file system this much smaller than its device is grown at stage
MAX_STACKED_MOUNTS = 32  # bound on "unmount until nothing is left", against a table that never empties

_OPTION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=:/+-]*$")

# Options that would change *what* gets mounted, or take the mount out of
# csilvm's hands (mount helpers, loop setup, propagation changes).
FORBIDDEN_OPTIONS = frozenset(
    {
        "bind", "rbind", "move", "rmove", "remount",
        "loop", "offset", "sizelimit", "encryption",
        "helper", "uhelper",
        "shared", "rshared", "slave", "rslave", "private", "rprivate", "unbindable", "runbindable",
    }
)  # fmt: skip
FORBIDDEN_PREFIXES = ("x-", "make-")  # x-* / X-mount.* userspace helpers, --make-* propagation


def validate_mount_flags(flags: Iterable[str]) -> tuple[str, ...]:
    """Split comma-separated flags into single options and check each; duplicates are dropped.

    Raises :class:`InvalidMountFlags` naming the first offending option.
    """
    options: list[str] = []
    for flag in flags:
        for option in flag.split(","):
            if not _OPTION.match(option):
                raise InvalidMountFlags(
                    f"mount flag {option!r} (in {flag!r}) is not a plain mount option: expected letters, digits "
                    f"and _.=:/+- , not starting with '-'"
                )
            name = option.split("=", 1)[0].lower()
            if name in FORBIDDEN_OPTIONS or name.startswith(FORBIDDEN_PREFIXES):
                raise InvalidMountFlags(
                    f"mount flag {option!r} is not allowed: it would change what is mounted or bypass csilvm's checks"
                )
            if option not in options:
                options.append(option)
    return tuple(options)


# ---------------------------------------------------------------------------
# helpers


def _block_device_number(device: str) -> int:
    try:
        st = os.stat(device)
    except FileNotFoundError:
        raise NotABlockDevice(f"device {device} does not exist") from None
    if not stat.S_ISBLK(st.st_mode):
        raise NotABlockDevice(f"{device} is not a block device")
    return st.st_rdev


def _describe(entry: MountEntry) -> str:
    subtree = "" if entry.root == "/" else f" (subtree {entry.root})"
    return f"{entry.source}{subtree}, {entry.fs_type}, {'ro' if entry.read_only else 'rw'}"


def _mount(argv: list[str], runner: Runner) -> None:
    try:
        runner.run(argv, timeout=MOUNT_TIMEOUT)
    except CommandFailed as exc:
        raise MountFailed(f"{' '.join(argv)} failed: {exc.stderr or exc}") from exc


def _unmount_all(path: str, runner: Runner, read_table: TableReader) -> bool:
    """Unmount every mount stacked on ``path`` (topmost first); True if there was any."""
    unmounted = False
    for _ in range(MAX_STACKED_MOUNTS):
        if not read_table().is_mount_point(path):
            return unmounted
        try:
            runner.run(["umount", path], timeout=MOUNT_TIMEOUT)
        except CommandFailed as exc:
            if not read_table().is_mount_point(path):  # someone else unmounted it meanwhile
                return True
            if "busy" in exc.stderr.lower():
                raise UnmountBusy(
                    f"cannot unmount {path}: it is in use (open files or mounts below it): {exc.stderr}"
                ) from exc
            raise MountFailed(f"umount {path} failed: {exc.stderr or exc}") from exc
        unmounted = True
    raise MountFailed(f"{path} is still mounted after {MAX_STACKED_MOUNTS} unmounts")


def _prepare_directory(path: str) -> None:
    """Create ``path`` (and parents) or check that it is an empty directory we may mount over."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise TargetBusy(f"{path} exists and is not a directory") from None
    if os.path.islink(path) or not os.path.isdir(path):
        raise TargetBusy(f"{path} exists and is not a directory")
    if os.listdir(path):
        raise TargetBusy(f"{path} is a non-empty directory; refusing to mount over (and hide) its contents")


def _prepare_file(path: str) -> None:
    """Create ``path`` as an empty regular file (parents too) or check that it is one."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise TargetBusy(f"cannot create {path}: a parent path exists and is not a directory") from None
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600))
        return
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise TargetBusy(f"{path} exists and is not a regular file (a block volume is published onto a file)")
    if st.st_size:
        raise TargetBusy(f"{path} is a non-empty file; refusing to mount over (and hide) it")


def _remount_bind(target: str, options: Iterable[str], runner: Runner, read_table: TableReader) -> None:
    """Apply per-mount options to a fresh bind; on failure undo the bind so no rw mount is left behind."""
    try:
        _mount(["mount", "-o", ",".join(("remount", "bind", *options)), target], runner)
    except MountFailed:
        _unmount_all(target, runner, read_table)
        raise


def _check_read_only(entry: MountEntry, target: str, readonly: bool, source_read_only: bool) -> None:
    if readonly and not entry.read_only:
        raise TargetBusy(f"{target} is already published read-write; unpublish it before publishing read-only")
    if not readonly and entry.read_only and not source_read_only:
        raise TargetBusy(f"{target} is already published read-only; unpublish it before publishing read-write")


# ---------------------------------------------------------------------------
# operations


def stage_filesystem(
    device: str,
    staging_path: str,
    fs_type: str,
    flags: Iterable[str],
    runner: Runner,
    *,
    read_table: TableReader = read_mount_table,
) -> bool:
    """Format ``device`` if blank and mount it at ``staging_path``; True if mounted now, False if already staged.

    Raises FilesystemMismatch (device holds another fs, or is staged here with
    another type), TargetBusy (something else at the path), InvalidMountFlags.
    """
    check_supported(fs_type)
    options = validate_mount_flags(flags)
    rdev = _block_device_number(device)
    path = os.path.realpath(staging_path)
    current = read_table().at(path)
    if current is not None:
        if not shows_device(current, rdev):
            raise TargetBusy(f"{path} already has another mount ({_describe(current)}), not {device}")
        if current.fs_type != fs_type:
            raise FilesystemMismatch(f"{device} is already staged at {path} as {current.fs_type}, not {fs_type}")
        return False
    _prepare_directory(path)
    # A file system that does not fill its device (the volume grew while unstaged) is grown:
    # ext* before mounting (offline), xfs and btrfs once mounted (they grow only so).  The
    # superblock tells, so a file system that fills its device costs no process.
    grow = not ensure_fs(device, fs_type, runner) and "ro" not in options and needs_growing(
        device, fs_type, block_device_size(device), GROW_THRESHOLD
    )
    if grow and fs_type in EXT_FAMILY:
        grow_filesystem(device, fs_type, runner)
    argv = ["mount", "-t", fs_type]
    if options:
        argv += ["-o", ",".join(options)]
    _mount([*argv, device, path], runner)
    if grow and fs_type not in EXT_FAMILY:
        grow_filesystem(device, fs_type, runner, mount_point=path)
    return True


def unstage(staging_path: str, runner: Runner, *, read_table: TableReader = read_mount_table) -> bool:
    """Unmount everything mounted on ``staging_path``; True if something was unmounted.

    Idempotent: a path that is not mounted, or missing, is fine.  The
    directory itself belongs to the CO and is left in place.
    """
    return _unmount_all(os.path.realpath(staging_path), runner, read_table)


def publish_bind(
    source_dir: str,
    target_dir: str,
    readonly: bool,
    flags: Iterable[str],
    runner: Runner,
    *,
    read_table: TableReader = read_mount_table,
) -> bool:
    """Bind-mount ``source_dir`` (normally the staging mount) on ``target_dir``; True if mounted now.

    Already published means: a mount at the target with the source mount's
    device number and the same subtree root.
    """
    options = validate_mount_flags(flags)
    source = os.path.realpath(source_dir)
    target = os.path.realpath(target_dir)
    table = read_table()
    source_mount = table.containing(source)
    if source_mount is None or not os.path.isdir(source):
        raise MountFailed(f"cannot publish {source}: it is not a directory on a mounted file system")
    relative = os.path.relpath(source, source_mount.mount_point)
    expected_root = os.path.normpath(os.path.join(source_mount.root, relative))
    current = table.at(target)
    if current is not None:
        if current.device_number != source_mount.device_number or current.root != expected_root:
            raise TargetBusy(f"{target} already has another mount ({_describe(current)}), not a bind of {source}")
        _check_read_only(current, target, readonly, source_mount.read_only)
        return False
    _prepare_directory(target)
    _mount(["mount", "--bind", source, target], runner)
    if readonly or options:
        _remount_bind(target, (*(("ro",) if readonly else ()), *options), runner, read_table)
    return True


def publish_block(
    device: str,
    target_file: str,
    readonly: bool,
    runner: Runner,
    *,
    read_table: TableReader = read_mount_table,
) -> bool:
    """Bind-mount the device node ``device`` onto the file ``target_file``; True if mounted now.

    ``readonly`` marks the bind mount read-only.  Caveat: the kernel does not
    apply a mount's read-only flag to writes *through a device node*, so this
    is advisory; real enforcement is the CO's (the container's device cgroup).
    """
    rdev = _block_device_number(device)
    target = os.path.realpath(target_file)
    current = read_table().at(target)
    if current is not None:
        try:
            st = os.stat(target)
        except OSError as exc:
            raise TargetBusy(f"{target} has a mount ({_describe(current)}) that cannot be inspected: {exc}") from exc
        if not (stat.S_ISBLK(st.st_mode) and st.st_rdev == rdev):
            raise TargetBusy(f"{target} already has another mount ({_describe(current)}), not {device}")
        _check_read_only(current, target, readonly, source_read_only=False)
        return False
    _prepare_file(target)
    _mount(["mount", "--bind", device, target], runner)
    if readonly:
        _remount_bind(target, ("ro",), runner, read_table)
    return True


def unpublish(
    target: str, runner: Runner, *, remove_target: bool = True, read_table: TableReader = read_mount_table
) -> bool:
    """Unmount ``target`` and remove it (empty directory or empty file); True if anything changed.

    With ``remove_target=False`` (CSI v0, where the CO owns the target) it is
    only unmounted.  Idempotent when the target is absent.  A target that, once unmounted,
    still holds data (non-empty directory or file, or another kind of file)
    raises :class:`TargetBusy` and is left as it is.
    """
    path = os.path.abspath(target)
    if os.path.islink(path):
        raise TargetBusy(f"{path} is a symbolic link, not a publish target; leaving it alone")
    changed = _unmount_all(os.path.realpath(path), runner, read_table)
    if not remove_target:
        return changed
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return changed
    if stat.S_ISDIR(st.st_mode):
        if os.listdir(path):
            raise TargetBusy(f"{path} is not mounted and not empty; refusing to delete its contents")
        os.rmdir(path)
    elif stat.S_ISREG(st.st_mode):
        if st.st_size:
            raise TargetBusy(f"{path} is not mounted and is a non-empty file; refusing to delete it")
        os.unlink(path)
    else:
        raise TargetBusy(f"{path} is not mounted and is neither a directory nor a regular file; leaving it alone")
    return True
