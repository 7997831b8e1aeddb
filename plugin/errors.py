"""Errors of the CSI layer and the one table that maps every error to a gRPC status code."""

from __future__ import annotations

import grpc

from lvm import errors as storage
from mount import errors as mounting
from plugin.pagination import BadToken


class RequestInvalid(storage.StorageError):
    """A request field is missing or malformed (raised by plugin/validation.py)."""


class TopologyUnsatisfiable(storage.StorageError):
    """The requested topology excludes this node."""


class NotStaged(storage.StorageError):
    """NodePublishVolume of a mount volume that was not staged first."""


# Most specific first: the first matching class decides.
_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (RequestInvalid, grpc.StatusCode.INVALID_ARGUMENT),
    (storage.InvalidParameters, grpc.StatusCode.INVALID_ARGUMENT),
    (mounting.InvalidMountFlags, grpc.StatusCode.INVALID_ARGUMENT),
    (storage.VolumeNotFound, grpc.StatusCode.NOT_FOUND),
    (storage.VolumeExists, grpc.StatusCode.ALREADY_EXISTS),
    (TopologyUnsatisfiable, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (storage.PoolExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (storage.VolumeHasSnapshots, grpc.StatusCode.FAILED_PRECONDITION),
    (storage.OutOfRange, grpc.StatusCode.OUT_OF_RANGE),
    (BadToken, grpc.StatusCode.ABORTED),
    (NotStaged, grpc.StatusCode.FAILED_PRECONDITION),
    (mounting.FilesystemMismatch, grpc.StatusCode.FAILED_PRECONDITION),
    (mounting.TargetBusy, grpc.StatusCode.FAILED_PRECONDITION),
    (storage.VolumeBusy, grpc.StatusCode.FAILED_PRECONDITION),
    (storage.VolumeGroupDegraded, grpc.StatusCode.FAILED_PRECONDITION),
    (storage.BackendUnavailable, grpc.StatusCode.FAILED_PRECONDITION),
    (storage.CommandTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (mounting.UnmountBusy, grpc.StatusCode.FAILED_PRECONDITION),
    (mounting.MountFailed, grpc.StatusCode.INTERNAL),
    (storage.CommandFailed, grpc.StatusCode.INTERNAL),
    (storage.StorageError, grpc.StatusCode.INTERNAL),
)


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC code for an exception; anything unexpected is INTERNAL."""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL
