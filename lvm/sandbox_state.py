"""The loop sandbox's on-disk state, as a pure model: records, their JSON, directory scans and repair plans.

What :mod:`lvm.sandbox` keeps under its work dir (``volumes/`` and
``snapshots/``: ``<id>.img``, ``<id>.json``, ``*.tmp``), what a scan of it finds,
and what :meth:`lvm.sandbox.LoopBackend.open` must do to repair it, as values
and functions of values.  Nothing here attaches a loop device or writes a
file (the scans only list a directory and read metadata), so all of it is
tested without root; the backend that acts on it is :mod:`lvm.sandbox`, the
file-level I/O :mod:`lvm.images`.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from lvm.backend import ContentSource, SizeRange, Snapshot
from lvm.errors import InvalidParameters
from lvm.loop import LoopDevice, devices_backed_by
from lvm.names import is_valid_lv_name, lv_name_for
from lvm.profiles import Profile, parse_profile
from lvm.thin import above_high_water, admissible

# The sandbox's logger, as before this module was split out of lvm.sandbox.
log = logging.getLogger("lvm.sandbox")

IMAGE_SUFFIX = ".img"
METADATA_SUFFIX = ".json"
TMP_SUFFIX = ".tmp"
METADATA_FORMAT = 1
SNAPSHOT_ID_PREFIX = "snapshot-"  # no volume id starts with "snapshot" (lvm.names reserves it)


def is_snapshot_id(text: str) -> bool:
    """True for ids :func:`snapshot_id_for` makes (and so safe as a file name); never a volume id."""
    return text.startswith(SNAPSHOT_ID_PREFIX) and is_valid_lv_name(text[len(SNAPSHOT_ID_PREFIX):])


def snapshot_id_for(name: str) -> str:
    """The snapshot id of a CO snapshot name: deterministic, so a retried CreateSnapshot finds it."""
    return SNAPSHOT_ID_PREFIX + lv_name_for(name)


@dataclass(frozen=True)
class VolumeRecord:
    """What ``<id>.json`` says about a volume."""

    id: str
    name: str
    size: int
    parameters: tuple[tuple[str, str], ...]  # sorted (key, value) pairs of the profile
    created: str  # ISO 8601, UTC
    source: ContentSource | None = None  # the snapshot or volume it was restored or cloned from

    @functools.cached_property
    def profile(self) -> Profile:
        return parse_profile(dict(self.parameters))

    @property
    def thin(self) -> bool:
        return self.profile.thin

    def to_json(self) -> str:
        data = {
            "format": METADATA_FORMAT,
            "id": self.id,
            "name": self.name,
            "size": self.size,
            "parameters": dict(self.parameters),
            "created": self.created,
        }
        if self.source is not None:
            data["source"] = {"kind": self.source.kind, "id": self.source.id}
        return json.dumps(data, sort_keys=True)  # one line: json's C encoder does not indent


def parse_metadata(volume_id: str, text: str) -> VolumeRecord:
    """Parse the metadata of volume ``volume_id``.

    Raises ValueError when it is malformed or names another volume, InvalidParameters
    when its profile is unknown.
    """
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != METADATA_FORMAT:
        raise ValueError(f"unknown metadata format {data.get('format') if isinstance(data, dict) else data!r}")
    if data.get("id") != volume_id:
        raise ValueError(f"metadata is for volume {data.get('id')!r}")
    name, size, params, created = data.get("name"), data.get("size"), data.get("parameters"), data.get("created")
    if not isinstance(name, str) or not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ValueError("name or size missing or malformed")
    if not isinstance(params, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in params.items()):
        raise ValueError("parameters malformed")
    parse_profile(params)  # InvalidParameters when the profile is not one we know
    source = data.get("source")
    if source is not None:
        if (
            not isinstance(source, dict)
            or source.get("kind") not in (ContentSource.SNAPSHOT, ContentSource.VOLUME)
            or not isinstance(source.get("id"), str)
            or not source["id"]
        ):
            raise ValueError("source malformed")
        source = ContentSource(source["kind"], source["id"])
    return VolumeRecord(volume_id, name, size, tuple(sorted(params.items())), str(created or ""), source)


@dataclass(frozen=True)
class SnapshotRecord:
    """What ``snapshots/<id>.json`` says about a snapshot."""

    id: str
    name: str
    source_volume_id: str
    size: int  # the source volume's size when it was taken
    created_ns: int  # nanoseconds since the epoch
    parameters: tuple[tuple[str, str], ...] = ()  # the source's profile when it was taken (sorted pairs)

    @property
    def snapshot(self) -> Snapshot:
        return Snapshot(
            id=self.id, source_volume_id=self.source_volume_id, size=self.size,
            created_ns=self.created_ns, ready=True, name=self.name,
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": METADATA_FORMAT,
                "id": self.id,
                "name": self.name,
                "source_volume_id": self.source_volume_id,
                "size": self.size,
                "created_ns": self.created_ns,
                "parameters": dict(self.parameters),
            },
            sort_keys=True,
        )


def parse_snapshot_metadata(snapshot_id: str, text: str) -> SnapshotRecord:
    """Parse the metadata of snapshot ``snapshot_id``; ValueError when malformed or another's."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != METADATA_FORMAT:
        raise ValueError(f"unknown metadata format {data.get('format') if isinstance(data, dict) else data!r}")
    if data.get("id") != snapshot_id:
        raise ValueError(f"metadata is for snapshot {data.get('id')!r}")
    name, source, size, created = data.get("name"), data.get("source_volume_id"), data.get("size"), data.get("created_ns")
    if not isinstance(name, str) or not isinstance(source, str) or not source:
        raise ValueError("name or source volume missing or malformed")
    for value in (size, created):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError("size or creation time missing or malformed")
    if size <= 0:
        raise ValueError("size must be positive")
    parameters = data.get("parameters", {})  # absent in snapshots taken before it was recorded
    if not isinstance(parameters, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in parameters.items()):
        raise ValueError("parameters malformed")
    return SnapshotRecord(snapshot_id, name, source, size, created, tuple(sorted(parameters.items())))


@dataclass(frozen=True)
class DirEntries:
    """The files of a volumes directory, sorted by what they are (names only)."""

    image_ids: frozenset[str]
    metadata_ids: frozenset[str]
    tmp_files: tuple[str, ...]


def classify_entries(filenames: Iterable[str], valid_id: Callable[[str], bool] = is_valid_lv_name) -> DirEntries:
    """Sort file names into images, metadata and tmp files; anything else (foreign files) is ignored.

    ``valid_id`` tells the ids of the directory (volume ids, or snapshot ids) from foreign names.
    """
    images, metadata, tmp = set(), set(), []
    for filename in filenames:
        if filename.endswith(TMP_SUFFIX):
            tmp.append(filename)
        elif filename.endswith(IMAGE_SUFFIX) and valid_id(filename[: -len(IMAGE_SUFFIX)]):
            images.add(filename[: -len(IMAGE_SUFFIX)])
        elif filename.endswith(METADATA_SUFFIX) and valid_id(filename[: -len(METADATA_SUFFIX)]):
            metadata.add(filename[: -len(METADATA_SUFFIX)])
    return DirEntries(frozenset(images), frozenset(metadata), tuple(sorted(tmp)))


@dataclass(frozen=True)
class DirScan:
    """The volumes of a work dir, and the leftovers of interrupted creates and deletes."""

    records: tuple[VolumeRecord, ...]  # whole volumes, sorted by id
    orphan_images: tuple[str, ...]  # ids with an image but no metadata: an interrupted create
    orphan_metadata: tuple[str, ...]  # ids with metadata but no image: an interrupted delete
    unreadable: tuple[str, ...]  # ids whose metadata does not parse: left alone, reported
    tmp_files: tuple[str, ...]  # file names of unfinished metadata writes

    @property
    def used(self) -> int:
        return sum(r.size for r in self.records)

    @property
    def thick(self) -> int:
        """The sizes of the volumes that reserve theirs (all but thin ones)."""
        return sum(r.size for r in self.records if not r.thin)

    @property
    def thin_virtual(self) -> int:
        return sum(r.size for r in self.records if r.thin)


def _read_dir(directory: Path, valid_id: Callable[[str], bool], parse: Callable, what: str) -> tuple:
    """The readable records of ``directory`` and its leftovers, as the fields of DirScan and SnapshotScan."""
    entries = classify_entries(os.listdir(directory), valid_id)
    records, unreadable = [], []
    for item_id in sorted(entries.image_ids & entries.metadata_ids):
        try:
            records.append(parse(item_id, (directory / (item_id + METADATA_SUFFIX)).read_text()))
        except (OSError, ValueError, InvalidParameters) as exc:
            log.warning("loop sandbox: metadata of %s %s is unreadable (%s); leaving it alone", what, item_id, exc)
            unreadable.append(item_id)
    return (
        tuple(records),
        tuple(sorted(entries.image_ids - entries.metadata_ids)),
        tuple(sorted(entries.metadata_ids - entries.image_ids)),
        tuple(unreadable),
        entries.tmp_files,
    )


def scan(volumes_dir: Path) -> DirScan:
    """Read the state of ``volumes_dir`` (which must exist)."""
    return DirScan(*_read_dir(volumes_dir, is_valid_lv_name, parse_metadata, "volume"))


@dataclass(frozen=True)
class SnapshotScan:
    """The snapshots of a work dir, and the leftovers of interrupted snapshots and deletes."""

    records: tuple[SnapshotRecord, ...]  # whole snapshots, sorted by id
    orphan_images: tuple[str, ...]  # a copy killed before its metadata was renamed
    orphan_metadata: tuple[str, ...]  # a delete killed between its two removals
    unreadable: tuple[str, ...]
    tmp_files: tuple[str, ...]


def scan_snapshots(snapshots_dir: Path) -> SnapshotScan:
    """Read the state of ``snapshots_dir`` (which must exist)."""
    return SnapshotScan(*_read_dir(snapshots_dir, is_snapshot_id, parse_snapshot_metadata, "snapshot"))


def plan_snapshot_repair(state: SnapshotScan, snapshots_dir: Path) -> tuple[Path, ...]:
    """The leftovers of interrupted snapshots and snapshot deletes: files to remove (never attached)."""
    remove = [snapshots_dir / (i + IMAGE_SUFFIX) for i in state.orphan_images]
    remove += [snapshots_dir / (i + METADATA_SUFFIX) for i in state.orphan_metadata]
    remove += [snapshots_dir / name for name in state.tmp_files]
    return tuple(remove)


@dataclass(frozen=True)
class Space:
    """The sandbox's space, and what each kind of allocation may still take.  Pure.

    ``capacity`` is ``--capacity``.  Linear volumes reserve their size; the
    rest is the thin pool.  Thin volumes promise their (virtual) size, bounded
    by :func:`lvm.thin.admissible`; their images' real allocation and every
    snapshot's are the pool's data.  A linear volume, or a snapshot copy,
    takes real space that neither the data nor the thin promises hold: at a
    ratio of 1.0 thin volumes thus reserve their size against linear ones,
    as before thin existed; at 2.0, half of it.
    """

    capacity: int
    thick: int  # sum of the linear volumes' sizes
    thin_virtual: int  # sum of the thin volumes' sizes
    data_used: int  # bytes allocated to thin images and snapshots
    ratio: float = 1.0
    full_percent: float = 95.0

    @property
    def pool(self) -> int:
        return max(0, self.capacity - self.thick)

    @property
    def data_percent(self) -> float:
        if self.pool == 0:
            return 100.0 if self.data_used else 0.0
        return self.data_used * 100 / self.pool

    @property
    def full(self) -> bool:
        """At or above the high-water mark: no new thin volumes, no new snapshots."""
        return above_high_water(self.data_percent, 0.0, self.full_percent)

    @property
    def promised(self) -> int:
        """Real bytes the thin volumes' promises hold, at the overprovisioning ratio."""
        return math.ceil(self.thin_virtual / self.ratio)

    @property
    def free(self) -> int:
        """Bytes a linear volume, a linear expansion or a snapshot may take."""
        return max(0, self.pool - max(self.data_used, self.promised))

    @property
    def thin_admissible(self) -> int:
        """Bytes of virtual size thin volumes may still add (0 above the high-water mark)."""
        if self.full:
            return 0
        return admissible(self.pool, self.data_used, self.thin_virtual, self.ratio)


@dataclass(frozen=True)
class RepairPlan:
    """What :meth:`LoopBackend.open` does, in this order: detach, remove, resize, attach, refresh."""

    detach: tuple[str, ...]  # devices of leftover or deleted images
    remove: tuple[Path, ...]
    attach: tuple[Path, ...]  # images of whole volumes with no loop device
    resize: tuple[tuple[Path, int], ...] = ()  # images not of their volume's size, and the size they get
    refresh: tuple[str, ...] = ()  # loop devices smaller than their volume: LOOP_SET_CAPACITY

    @property
    def empty(self) -> bool:
        return not (self.detach or self.remove or self.attach or self.resize or self.refresh)


def plan_repair(state: DirScan, attached: list[LoopDevice], volumes_dir: Path) -> RepairPlan:
    """Plan the repair of a work dir after a restart, a reboot or a kill -9."""
    volumes_dir = Path(os.path.realpath(volumes_dir))
    image = lambda volume_id: volumes_dir / (volume_id + IMAGE_SUFFIX)  # noqa: E731
    detach: list[str] = []
    for volume_id in state.orphan_images:
        detach += devices_backed_by(image(volume_id), attached)
    # Devices whose image was removed under them (a delete killed between detach and remove
    # cannot cause this, but an operator's rm can): they hold disk space and a device number.
    detach += [
        d.device
        for d in attached
        if d.deleted and Path(d.backing_file).parent == volumes_dir and d.backing_file.endswith(IMAGE_SUFFIX)
    ]
    remove = [image(i) for i in state.orphan_images]
    remove += [volumes_dir / (i + METADATA_SUFFIX) for i in state.orphan_metadata]
    remove += [volumes_dir / name for name in state.tmp_files]
    attach = [image(r.id) for r in state.records if not devices_backed_by(image(r.id), attached)]
    return RepairPlan(tuple(sorted(set(detach))), tuple(remove), tuple(attach))


def image_size_for(volume_size: int, image_size: int, device_sizes: Iterable[int | None]) -> int:
    """The size a volume's image must have, given the sizes of the loop devices on it (None: unknown).

    The volume's size, which its metadata records, is the truth.  A smaller
    image is grown to it (sparse: it reads zeros).  A larger image is the
    leftover of an expansion killed before its metadata was renamed: no loop
    device was told of it, so nothing was written there, and it is cut back,
    but never below what a device does show (a device attached by hand since
    may hold data there), and not at all when a device's size is unknown.
    """
    if image_size <= volume_size:
        return volume_size
    sizes = list(device_sizes)
    if any(size is None for size in sizes):
        return image_size
    return max(volume_size, min(image_size, max(sizes, default=0)))


def plan_resize(
    volumes_dir: Path,
    records: Iterable[VolumeRecord],
    image_sizes: Mapping[str, int],
    device_sizes: Mapping[str, Mapping[str, int | None]],
) -> tuple[tuple[tuple[Path, int], ...], tuple[str, ...]]:
    """(images to resize and their size, devices to refresh) that bring volumes to their recorded size.

    ``image_sizes`` maps a volume id to its image's size, ``device_sizes`` to the
    loop devices on its image and their sizes.  A device smaller than its
    volume is one whose expansion was killed before the device was told.
    """
    resize, refresh = [], []
    for record in records:
        if record.id not in image_sizes:
            continue
        devices = device_sizes.get(record.id, {})
        size = image_size_for(record.size, image_sizes[record.id], devices.values())
        if size != image_sizes[record.id]:
            resize.append((volumes_dir / (record.id + IMAGE_SUFFIX), size))
        refresh += [d for d, s in sorted(devices.items()) if s is not None and s < record.size]
    return tuple(resize), tuple(refresh)


def is_compatible(
    record: VolumeRecord, name: str, size: SizeRange, profile: Profile, source: ContentSource | None = None
) -> str | None:
    """Why an existing volume does not answer a CreateVolume request, or None when it does."""
    if record.name != name:
        return f"volume id {record.id} belongs to the volume named {record.name!r}, not {name!r}"
    if not size.admits(record.size):
        return (
            f"volume {name!r} exists with size {record.size} bytes, "
            f"outside the requested range [{size.required}, {size.limit or 'unlimited'}]"
        )
    if record.profile != profile:
        return (
            f"volume {name!r} exists with parameters {dict(record.parameters)}, "
            f"not {profile.as_parameters()}"
        )
    if record.source != source:
        return (
            f"volume {name!r} exists with content source {_describe_source(record.source)}, "
            f"not {_describe_source(source)}"
        )
    return None


def _describe_source(source: ContentSource | None) -> str:
    return "none (an empty volume)" if source is None else f"{source.kind} {source.id!r}"
