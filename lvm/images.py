"""File-level I/O on the loop sandbox's files: atomic metadata writes, sparse images, hole-keeping copies.

Kept apart from the backend (:mod:`lvm.sandbox`) and from the pure state
model (:mod:`lvm.sandbox_state`): these are the system calls whose order and
syncs make a kill at any point leave a whole file or a leftover, and the
copy (``FICLONE`` reflink, else ``SEEK_DATA``/``SEEK_HOLE`` ranges) that keeps an
image's holes.  None of it needs root or a loop device.  The backend calls
these through the module (``images.write_atomically(...)``), so a test that
replaces one here, to inject a failure or a kill, reaches every caller.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import Iterator

from lvm.sandbox_state import TMP_SUFFIX
from lvm.units import MiB

FICLONE = 0x40049409  # <linux/fs.h>: _IOW(0x94, 9, int), a reflink of a whole file
COPY_CHUNK = 8 * MiB


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` so that a crash leaves the old file, the new one, or a ``.tmp``."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def create_sparse_file(path: Path, size: int) -> None:
    """Create ``path`` (it must not exist) as a sparse file of ``size`` bytes.

    The file is synced, not its directory entry: the caller syncs the
    directory once it has written everything it puts there.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def set_file_size(path: Path, size: int) -> int:
    """Make ``path`` exactly ``size`` bytes (growing it sparse) and sync it; returns the size it had."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        before = os.fstat(fd).st_size
        if before != size:
            os.ftruncate(fd, size)
            os.fsync(fd)
        return before
    finally:
        os.close(fd)


def allocated_bytes(path: Path) -> int:
    """The bytes of disk ``path`` really holds (``st_blocks``); 0 when it is gone."""
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


# errnos of a file system (or kernel) that cannot do a reflink, or not between these files
_NO_REFLINK = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EBADF, errno.EPERM}
)
# errnos of a copy_file_range the kernel or file system does not do: copy by hand instead
_NO_COPY_RANGE = frozenset({errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.EPERM})
_ZEROS = bytes(MiB)


def _reflink(src_fd: int, dst_fd: int) -> bool:
    """Clone the whole source into the (empty) destination; False where the file system cannot."""
    try:
        fcntl.ioctl(dst_fd, FICLONE, src_fd)
        return True
    except OSError as exc:
        if exc.errno in _NO_REFLINK:
            return False
        raise


def data_ranges(fd: int, length: int) -> Iterator[tuple[int, int]]:
    """The [start, end) ranges of ``fd``'s first ``length`` bytes that may hold data (holes skipped)."""
    offset = 0
    while offset < length:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but a hole from offset to the end of the file
                return
            if exc.errno == errno.EINVAL:  # SEEK_DATA unsupported: every byte may be data
                yield offset, length
                return
            raise
        if start >= length:
            return
        end = min(os.lseek(fd, start, os.SEEK_HOLE), length)
        yield start, end
        offset = end


def _copy_by_hand(src_fd: int, dst_fd: int, offset: int, count: int) -> int:
    """pread/pwrite up to ``count`` bytes at ``offset``, leaving all-zero MiBs as holes; 0 at end of file."""
    data = os.pread(src_fd, min(count, MiB), offset)
    if data and data != _ZEROS[: len(data)]:
        view, done = memoryview(data), 0
        while done < len(data):
            done += os.pwrite(dst_fd, view[done:], offset + done)
    return len(data)


def _copy_range(src_fd: int, dst_fd: int, start: int, end: int) -> None:
    """Copy bytes [start, end) to the same offsets: copy_file_range (in the kernel), else by hand."""
    offset, in_kernel = start, True
    while offset < end:
        count = min(COPY_CHUNK, end - offset)
        copied = 0
        if in_kernel:
            try:
                copied = os.copy_file_range(src_fd, dst_fd, count, offset, offset)
            except OSError as exc:
                if exc.errno not in _NO_COPY_RANGE:
                    raise
                in_kernel = False
        if copied <= 0:
            copied = _copy_by_hand(src_fd, dst_fd, offset, count)
            if copied == 0:
                return  # the source ends here: what is left reads as zeros
        offset += copied


def copy_image(src: Path, dst: Path, length: int, size: int, *, read_only: bool = False) -> str:
    """Create ``dst`` (it must not exist) with the first ``length`` bytes of ``src``, ``size`` bytes long.

    Holes stay holes: a reflink (``FICLONE``) where the file system has
    them, else a copy of the data ranges only.  Bytes past ``length`` read as
    zeros.  The file is synced (not its directory entry, which the caller
    syncs with the metadata).  Returns how it was copied: "reflink" or "sparse copy".
    """
    src_fd = os.open(src, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        dst_fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            how = "reflink"
            if not _reflink(src_fd, dst_fd):
                how = "sparse copy"
                for start, end in data_ranges(src_fd, length):
                    _copy_range(src_fd, dst_fd, start, end)
            # A reflinked source longer than ``length`` (an interrupted expansion's leftover) is cut
            # to it first, so whatever lies past it reads as zeros.
            if os.fstat(dst_fd).st_size != length:
                os.ftruncate(dst_fd, length)
            if size != length:
                os.ftruncate(dst_fd, size)
            if read_only:
                os.fchmod(dst_fd, 0o444)
            os.fsync(dst_fd)
            return how
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)
