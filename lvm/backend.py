"""The interface between the CSI layer and a storage backend, and the values it trades in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol

from lvm.errors import OutOfRange
from lvm.profiles import Profile


@dataclass(frozen=True)
class SizeRange:
    """A CSI capacity range in bytes; 0 means "not set", as in the spec."""

    required: int = 0
    limit: int = 0

    def admits(self, size: int) -> bool:
        return size >= self.required and (self.limit == 0 or size <= self.limit)


@dataclass(frozen=True)
class Condition:
    """A volume's health, as CSI's VolumeCondition: ``abnormal`` with a message a person can act on."""

    abnormal: bool = False
    message: str = "healthy"

    @classmethod
    def problem(cls, message: str) -> Condition:
        return cls(True, message)


@dataclass(frozen=True)
class ContentSource:
    """Where a new volume's bytes come from: a snapshot (restore) or another volume (clone)."""

    kind: str  # "snapshot" or "volume"
    id: str

    SNAPSHOT = "snapshot"
    VOLUME = "volume"


@dataclass(frozen=True)
class Snapshot:
    """A point-in-time copy of a volume, as CSI's Snapshot."""

    id: str
    source_volume_id: str
    size: int  # bytes: the source volume's size when the snapshot was taken
    created_ns: int  # when it was taken, nanoseconds since the epoch
    ready: bool = True  # False while its content is still being made
    name: str | None = None  # the CO's name


@dataclass(frozen=True)
class Volume:
    """A volume as the CO sees it.  ``id`` is the LV name (or sandbox volume name)."""

    id: str
    size: int
    device: str
    name: str | None = None  # the CO's name, when csilvm created it; None for pre-existing LVs
    profile: Profile | None = None  # None when the layout is not one of ours
    tags: tuple[str, ...] = ()
    attributes: Mapping[str, str] = field(default_factory=dict)  # backend facts for volume_context
    # Its health when the backend learnt it while reading the volume: an observation, not part of its identity.
    condition: Condition | None = field(default=None, compare=False)
    content_source: ContentSource | None = None  # what it was restored or cloned from
    # A restore or clone whose copy has not completed (or was cut by a kill): not to be used.
    incomplete: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Capacity:
    """What GetCapacity reports for one profile, in bytes."""

    available: int
    maximum_volume_size: int
    minimum_volume_size: int

    @classmethod
    def none(cls) -> Capacity:
        return cls(0, 0, 0)


class Backend(Protocol):
    """What the CSI servicers need from storage.  All sizes are bytes."""

    kind: str  # "lvm" or "loop"
    # Whether taking a snapshot makes a mounted file system consistent by itself (device-mapper
    # suspends, which freezes it); when False, the caller freezes the file system around it.
    snapshots_quiesce: bool

    def probe(self) -> None:
        """Return when usable; raise BackendUnavailable with the reason otherwise."""

    def create_volume(
        self, name: str, size: SizeRange, profile: Profile, source: ContentSource | None = None
    ) -> Volume:
        """Create (or return the existing, compatible) volume called ``name``.

        With ``source``, the new volume holds the source's bytes (restore from a
        snapshot, clone of a volume), any extra size reading as zeros; it is
        returned only once its content is complete.  SourceNotFound when the
        source does not exist; OutOfRange when ``size`` is below the source's.

        Raises VolumeExists when a volume of that name is incompatible (other
        size, profile or source), OutOfRange when no size in ``size`` fits the
        granularity, the pool or the placement, PoolExhausted when a thin pool
        is above its high-water mark.
        """

    def delete_volume(self, volume_id: str) -> None:
        """Remove the volume, wiping its signatures first; an unknown id is success."""

    def get_volume(self, volume_id: str) -> Volume:
        """The volume with this id; VolumeNotFound otherwise."""

    def device_of(self, volume_id: str) -> str | None:
        """The volume's device node if it exists now, found without running any command."""

    def list_volumes(self) -> list[Volume]:
        """Every volume, pre-existing ones included, sorted by id."""

    def expand_volume(self, volume_id: str, size: SizeRange) -> int:
        """Grow the volume to :func:`expansion_target` and return its size in bytes.

        Never shrinks: a range whose ``required`` is at most the current size
        returns the current size and changes nothing.  VolumeNotFound for an
        unknown id; OutOfRange (nothing changed) when the growth does not fit.
        """

    def volume_condition(self, volume_id: str) -> Condition:
        """The volume's health, looked at without repairing anything; VolumeNotFound for an unknown id."""

    def modify_volume(self, volume_id: str, parameters: Mapping[str, str]) -> Volume:
        """Change the volume's layout in place to what the (mutable) ``parameters`` say.

        InvalidParameters when the change cannot be made in place; OutOfRange
        (nothing changed) when it does not fit; the volume as it now is otherwise.
        """

    def create_snapshot(self, name: str, source_volume_id: str) -> Snapshot:
        """Snapshot the volume (or return the existing snapshot called ``name`` of that volume).

        SnapshotExists when ``name`` is a snapshot of another volume; SourceNotFound
        for an unknown source; PoolExhausted / OutOfRange when there is no room.
        """

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Remove the snapshot; an unknown id is success."""

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        """The snapshot with this id; SnapshotNotFound otherwise."""

    def list_snapshots(self) -> list[Snapshot]:
        """Every snapshot, sorted by id."""

    def capacity(self, profile: Profile) -> Capacity:
        """Exact capacity for ``profile``: CreateVolume of maximum_volume_size succeeds."""

    def close(self) -> None:
        """Release resources (nothing on disk is changed)."""


def choose_size(size: SizeRange, granularity: int, default: int) -> int:
    """The smallest multiple of ``granularity`` in the range (``default`` when no range is set).

    Raises OutOfRange when the range holds no such multiple.
    """
    if size.limit and size.required and size.limit < size.required:
        raise OutOfRange(f"limit_bytes {size.limit} is below required_bytes {size.required}")
    if not size.required and size.limit and default > size.limit:
        # No minimum, and the default does not fit: take the largest size that does.
        chosen = size.limit // granularity * granularity
        if chosen < granularity:
            raise OutOfRange(f"limit_bytes {size.limit} is below the smallest volume size {granularity}")
        return chosen
    want = size.required or default
    chosen = max(granularity, -(-want // granularity) * granularity)
    if size.limit and chosen > size.limit:
        raise OutOfRange(
            f"no multiple of {granularity} bytes lies in [{size.required}, {size.limit}]: "
            f"ask for a range that contains one"
        )
    return chosen


def expansion_target(current: int, size: SizeRange, granularity: int) -> int:
    """The size an expansion to ``size`` yields: ``current`` when ``required`` is not above it
    (expansion never shrinks), else the smallest multiple of ``granularity`` at or above ``required``.

    Raises OutOfRange when that multiple exceeds ``limit``.
    """
    if size.limit and size.required and size.limit < size.required:
        raise OutOfRange(f"limit_bytes {size.limit} is below required_bytes {size.required}")
    if size.required <= current:
        return current
    chosen = -(-size.required // granularity) * granularity
    if size.limit and chosen > size.limit:
        raise OutOfRange(
            f"no multiple of {granularity} bytes lies in [{size.required}, {size.limit}]: "
            f"ask for a range that contains one"
        )
    return chosen


def restore_range(size: SizeRange, source_size: int) -> SizeRange:
    """The size range of a restore or clone of a ``source_size`` source: at least the source
    (the spec's OUT_OF_RANGE for a smaller one), the source's size when no size is asked for."""
    if size.required and size.required < source_size:
        raise OutOfRange(
            f"required_bytes {size.required} is below the source's size {source_size}: "
            f"a restored or cloned volume is at least as large as its source"
        )
    if size.limit and size.limit < source_size:
        raise OutOfRange(
            f"limit_bytes {size.limit} is below the source's size {source_size}: "
            f"a restored or cloned volume is at least as large as its source"
        )
    return SizeRange(size.required or source_size, size.limit)
