"""Freezing a mounted file system (FIFREEZE/FITHAW) while a copy of its device is taken.

``FIFREEZE`` writes the file system's dirty data and journal out and blocks
new writes until ``FITHAW``, so the device holds a consistent file system for
as long as it is frozen.  Device-mapper snapshots do this by themselves (a
suspend freezes); a plain file copy of the sandbox's image needs it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from typing import Iterator

log = logging.getLogger(__name__)

FIFREEZE = 0xC0045877  # _IOWR('X', 119, int)
FITHAW = 0xC0045878  # _IOWR('X', 120, int)


@contextlib.contextmanager
def frozen(mount_point: str) -> Iterator[bool]:
    """Freeze the file system mounted at ``mount_point`` for the duration; yields whether it froze.

    A file system that cannot be frozen (no support, or frozen already by
    someone else, who will thaw it) is synced instead, and yields False.
    """
    fd = os.open(mount_point, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.ioctl(fd, FIFREEZE, 0)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EBUSY, errno.EINVAL):
                raise
            log.info("cannot freeze %s (%s): syncing it instead", mount_point, os.strerror(exc.errno))
            os.sync()
            yield False
            return
        try:
            yield True
        finally:
            fcntl.ioctl(fd, FITHAW, 0)
    finally:
        os.close(fd)
