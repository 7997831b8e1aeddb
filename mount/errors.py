"""Errors of the host-side (CSI Node) operations: formatting, mounting, publishing.

All subclass :class:`lvm.errors.StorageError`, so the CSI layer's single error
mapping catches them.  Messages are written for an operator and say what to do.
"""

from lvm.errors import InvalidParameters, StorageError


class FilesystemMismatch(StorageError):
    """The device already holds another file system or a partition table; csilvm never reformats."""


class UnsupportedFilesystem(InvalidParameters):
    """The requested file system type is not one csilvm can create."""


class TargetBusy(StorageError):
    """The target path holds something else: another mount, a non-empty directory, the wrong kind of file."""


class InvalidMountFlags(InvalidParameters):
    """A mount flag is malformed or would change what is mounted / bypass csilvm's checks."""


class MountFailed(StorageError):
    """mount or umount failed (the message carries the tool's own words)."""


class UnmountBusy(MountFailed):
    """umount refused because the file system is still in use (open files, nested mounts)."""


class NotABlockDevice(StorageError):
    """A path that should be a block device (or a target file bound to one) is not."""


class ResizeFailed(StorageError):
    """resize2fs, xfs_growfs or btrfs could not grow a file system (the message carries the tool's words)."""
