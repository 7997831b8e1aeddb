"""Copying a volume's bytes to another block device in-process (no ``dd``, no shell).

Restores and clones onto thick LVs copy the source's bytes; the rest of the
target (when it is larger) is zeroed, because a new thick LV holds whatever
its extents held before.  Chunks of zeros are not written as data: on a
target that reads zeros already (a thin LV) they are skipped, elsewhere they
are zeroed with ``BLKZEROOUT`` (the kernel's write-zeroes, cheap on most
devices), falling back to writing zeros.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import time
from typing import Callable

log = logging.getLogger(__name__)

CHUNK = 4 * 1024 * 1024
BLKZEROOUT = 0x127F  # _IO(0x12, 127): zero a byte range [start, start+len)
PROGRESS_EVERY = 10.0  # seconds between progress lines in the log


def _zero_out(fd: int, offset: int, length: int) -> None:
    try:
        fcntl.ioctl(fd, BLKZEROOUT, struct.pack("QQ", offset, length))
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL):
            raise
    zeros = bytes(min(CHUNK, length))
    done = 0
    while done < length:
        done += os.pwrite(fd, zeros[: min(len(zeros), length - done)], offset + done)


def copy_device(
    source: str,
    target: str,
    length: int,
    *,
    target_size: int | None = None,
    target_reads_zeros: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Copy the first ``length`` bytes of ``source`` onto ``target``, zero the target up to
    ``target_size`` (default: ``length``), and fsync.

    The target is opened with O_EXCL, so a device in use (mounted) is never written.
    """
    target_size = length if target_size is None else target_size
    if target_size < length:
        raise ValueError(f"target size {target_size} is below the {length} bytes to copy")
    src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dst = os.open(target, os.O_WRONLY | os.O_EXCL | os.O_CLOEXEC)
        try:
            started = last_report = clock()
            offset = 0
            while offset < length:
                want = min(CHUNK, length - offset)
                data = os.pread(src, want, offset)
                if len(data) != want:
                    raise OSError(errno.EIO, f"short read from {source} at {offset}: {len(data)} of {want} bytes")
                if data.count(0) == len(data):
                    if not target_reads_zeros:
                        _zero_out(dst, offset, want)
                else:
                    written = 0
                    while written < want:
                        written += os.pwrite(dst, data[written:], offset + written)
                offset += want
                now = clock()
                if now - last_report >= PROGRESS_EVERY:
                    log.info("copying %s to %s: %d of %d bytes (%.0f%%)", source, target, offset, length, 100 * offset / length)
                    last_report = now
            if target_size > length and not target_reads_zeros:
                _zero_out(dst, length, target_size - length)
            os.fsync(dst)
            if length >= 64 * CHUNK:
                log.info("copied %d bytes from %s to %s in %.1f s", length, source, target, clock() - started)
        finally:
            os.close(dst)
    finally:
        os.close(src)
