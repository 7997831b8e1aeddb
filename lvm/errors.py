"""Domain errors of the storage backends.

Each names what went wrong in storage terms; ``plugin/errors.py`` maps them to
gRPC status codes in one place.  Messages are written for an operator.
"""


class StorageError(Exception):
    """Base class of every error a backend raises on purpose."""


class InvalidParameters(StorageError):
    """The request's parameters (profile, name, sizes) are malformed or unknown."""


class VolumeNotFound(StorageError):
    """No volume with this id exists in the configured volume group / sandbox."""


class VolumeExists(StorageError):
    """A volume of this name exists but is incompatible with the request."""


class SnapshotNotFound(VolumeNotFound):
    """No snapshot with this id exists."""


class SourceNotFound(VolumeNotFound):
    """The snapshot or volume a new volume (or snapshot) is to be made from does not exist."""


class SnapshotExists(VolumeExists):
    """A snapshot of this name exists, of another source volume."""


class PoolExhausted(StorageError):
    """A thin pool (or the sandbox's real space) is above its high-water mark: no new volumes or snapshots."""


class VolumeHasSnapshots(StorageError):
    """The volume cannot be deleted or changed while snapshots of it exist (FAILED_PRECONDITION)."""


class OutOfRange(StorageError):
    """No size in the requested range can be allocated (range, pool or placement)."""


class VolumeBusy(StorageError):
    """The volume is in use (open, mounted) and cannot be changed now."""


class BackendUnavailable(StorageError):
    """The backend cannot serve requests now (VG missing, tools absent, loop devices broken)."""


class VolumeGroupDegraded(StorageError):
    """A PV of the volume group is missing: lvm2 refuses to change the VG until it is whole."""


class CommandFailed(StorageError):
    """An external command (lvm2, losetup, ...) failed in a way not classified otherwise."""

    def __init__(self, message: str, *, argv: tuple[str, ...] = (), returncode: int | None = None, stderr: str = ""):
        super().__init__(message)
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr


class CommandTimeout(CommandFailed):
    """An external command ran past its deadline and was killed."""


class CommandNotFound(CommandFailed):
    """The program is not installed (or not on PATH)."""
