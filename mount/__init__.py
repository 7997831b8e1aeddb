"""Everything the CSI Node service does to the host: file systems, mounts, usage.

- :mod:`mount.table`: the kernel's mount table as a typed snapshot.
- :mod:`mount.fs`: probe / create file systems, never reformat.
- :mod:`mount.ops`: idempotent stage, unstage, publish (bind / block), unpublish.
- :mod:`mount.stats`: usage numbers and the device behind a mount.
"""

from mount.errors import (
    FilesystemMismatch,
    InvalidMountFlags,
    MountFailed,
    NotABlockDevice,
    TargetBusy,
    UnmountBusy,
    UnsupportedFilesystem,
)
from mount.fs import SUPPORTED_FS_TYPES, detect_fs, ensure_fs, make_fs, probe_device
from mount.ops import (
    publish_bind,
    publish_block,
    stage_filesystem,
    unpublish,
    unstage,
    validate_mount_flags,
)
from mount.stats import Usage, block_device_size, device_of_mount, filesystem_usage
from mount.table import MountEntry, MountTable, parse_mountinfo, read_mount_table

__all__ = [
    "FilesystemMismatch",
    "InvalidMountFlags",
    "MountFailed",
    "NotABlockDevice",
    "TargetBusy",
    "UnmountBusy",
    "UnsupportedFilesystem",
    "SUPPORTED_FS_TYPES",
    "detect_fs",
    "ensure_fs",
    "make_fs",
    "probe_device",
    "publish_bind",
    "publish_block",
    "stage_filesystem",
    "unpublish",
    "unstage",
    "validate_mount_flags",
    "Usage",
    "block_device_size",
    "device_of_mount",
    "filesystem_usage",
    "MountEntry",
    "MountTable",
    "parse_mountinfo",
    "read_mount_table",
]
