"""The loop-device sandbox: each volume is a sparse file in a work directory, attached to a loop device.

It lets CI, demos and the Mesos test harness run the real CSI Node path
(mkfs, mounts, block devices) with no LVM and no spare disk.

On disk, under ``<work_dir>/volumes/``, a volume is two files:

* ``<id>.img``  - the sparse image, truncated to the volume size;
* ``<id>.json`` - its metadata (CO name, size, profile, creation time),
  written atomically (``<id>.json.tmp``, fsync, rename).

The rename of the metadata is the commit point of a create: a volume exists
when both files do.  Create writes image -> loop device -> metadata; delete
detaches -> removes image -> removes metadata.  So a kill at any
point leaves either a whole volume, or leftovers that are never listed nor
counted and that :meth:`LoopBackend.open` removes (image without metadata,
metadata without image, ``*.tmp``).  ``open`` also re-attaches every
volume's image after a reboot.

The size in the metadata is the volume's size, whatever the image's or the
loop device's.  An expansion grows the image (ftruncate, fsync), renames the
new metadata (its commit point), then tells the loop device
(``LOOP_SET_CAPACITY``).  Killed before the rename, it leaves an image larger
than its volume: harmless (sparse, not counted, and no device was told of
it, so nothing lives there), and cut back to the metadata's size by a
retried expansion, by ``open`` and before any re-attach, so a device csilvm
attaches never shows more than the metadata records.  Killed after the
rename, it leaves a device smaller than its volume: the volume's condition
says so, and a retried expansion or ``open`` tells the device.

Mutations are serialized by a thread lock and an ``flock`` on
``<work_dir>/.lock``, so two processes sharing a work dir do not race either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import functools
import json
import logging
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from lvm.backend import Capacity, Condition, SizeRange, Volume, choose_size, expansion_target
from lvm.errors import BackendUnavailable, InvalidParameters, OutOfRange, VolumeBusy, VolumeExists, VolumeNotFound
from lvm.loop import LoopDevice, LoopDevices, SystemLoopDevices, devices_backed_by
from lvm.names import is_valid_lv_name, lv_name_for
from lvm.profiles import Layout, Profile, parse_profile
from lvm.thin import ThinPolicy
from lvm.units import MiB, format_size

log = logging.getLogger(__name__)

IMAGE_SUFFIX = ".img"
METADATA_SUFFIX = ".json"
TMP_SUFFIX = ".tmp"
METADATA_FORMAT = 1
LOCK_FILE = ".lock"
GENERATION = struct.Struct("<Q")  # at offset 0 of the lock file

# --- the state on disk (pure where possible) ---------------------------------------------------


@dataclass(frozen=True)
class VolumeRecord:
    """What ``<id>.json`` says about a volume."""

    id: str
    name: str
    size: int
    parameters: tuple[tuple[str, str], ...]  # sorted (key, value) pairs of the profile
    created: str  # ISO 8601, UTC

    @functools.cached_property
    def profile(self) -> Profile:
        return parse_profile(dict(self.parameters))

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": METADATA_FORMAT,
                "id": self.id,
                "name": self.name,
                "size": self.size,
                "parameters": dict(self.parameters),
                "created": self.created,
            },
            sort_keys=True,  # one line: json's C encoder does not indent
        )


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
    return VolumeRecord(volume_id, name, size, tuple(sorted(params.items())), str(created or ""))


@dataclass(frozen=True)
class DirEntries:
    """The files of a volumes directory, sorted by what they are (names only)."""

    image_ids: frozenset[str]
    metadata_ids: frozenset[str]
    tmp_files: tuple[str, ...]


def classify_entries(filenames: Iterable[str]) -> DirEntries:
    """Sort file names into images, metadata and tmp files; anything else (foreign files) is ignored."""
    images, metadata, tmp = set(), set(), []
    for filename in filenames:
        if filename.endswith(TMP_SUFFIX):
            tmp.append(filename)
        elif filename.endswith(IMAGE_SUFFIX) and is_valid_lv_name(filename[: -len(IMAGE_SUFFIX)]):
            images.add(filename[: -len(IMAGE_SUFFIX)])
        elif filename.endswith(METADATA_SUFFIX) and is_valid_lv_name(filename[: -len(METADATA_SUFFIX)]):
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


def scan(volumes_dir: Path) -> DirScan:
    """Read the state of ``volumes_dir`` (which must exist)."""
    entries = classify_entries(os.listdir(volumes_dir))
    records, unreadable = [], []
    for volume_id in sorted(entries.image_ids & entries.metadata_ids):
        try:
            text = (volumes_dir / (volume_id + METADATA_SUFFIX)).read_text()
            records.append(parse_metadata(volume_id, text))
        except (OSError, ValueError, InvalidParameters) as exc:
            log.warning("loop sandbox: metadata of volume %s is unreadable (%s); leaving it alone", volume_id, exc)
            unreadable.append(volume_id)
    return DirScan(
        records=tuple(records),
        orphan_images=tuple(sorted(entries.image_ids - entries.metadata_ids)),
        orphan_metadata=tuple(sorted(entries.metadata_ids - entries.image_ids)),
        unreadable=tuple(unreadable),
        tmp_files=entries.tmp_files,
    )


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


def is_compatible(record: VolumeRecord, name: str, size: SizeRange, profile: Profile) -> str | None:
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
    return None


# --- file helpers ------------------------------------------------------------------------------


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


def _check_volume_id(volume_id: str) -> None:
    """VolumeNotFound for an id no volume can have: such an id never becomes a path."""
    if not is_valid_lv_name(volume_id):
        raise VolumeNotFound(f"no volume {volume_id!r}: not a valid volume id")


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# --- the backend -------------------------------------------------------------------------------


class LoopBackend:
    """Backend (kind ``loop``) of sparse images on loop devices, ``capacity_bytes`` in total.

    Only ``type=linear`` is served.  ``loops`` replaces the real loop devices
    (unit tests).  The constructor calls :meth:`open`.

    Delete does not wipe: the image is unlinked and a later volume is a new
    sparse file, which reads zeros, whatever the old one held.  (LVM wipes
    because a later LV reuses the same extents.)

    The work dir is the truth; the process keeps what it read of it (records,
    and the loop device of each volume) and re-reads it when it may have
    changed under it: each mutation, by any csilvm process, first bumps a
    generation counter kept in the lock file, and a change of the volumes
    directory's mtime reveals files added, removed or renamed by hand.  So a
    create or a GetCapacity costs a pread and a stat, not a read of every
    volume's metadata.
    """

    kind = "loop"
    snapshots_quiesce = False  # a file copy of the image: the caller freezes a mounted file system

    def __init__(
        self,
        work_dir: str | os.PathLike,
        capacity_bytes: int,
        default_size: int,
        granularity: int = MiB,
        *,
        loops: LoopDevices | None = None,
        thin: ThinPolicy | None = None,
    ):
        if capacity_bytes < 0 or default_size <= 0 or granularity <= 0:
            raise ValueError("capacity_bytes must be >= 0, default_size and granularity > 0")
        self.work_dir = Path(os.path.realpath(work_dir))
        self.volumes_dir = self.work_dir / "volumes"
        self.capacity_bytes = capacity_bytes
        self.default_size = default_size
        self.granularity = granularity
        self.loops: LoopDevices = loops if loops is not None else SystemLoopDevices()
        self.thin = thin or ThinPolicy()
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        # What we read of the work dir, valid while _state_key() == _seen.
        self._records: dict[str, VolumeRecord] = {}
        self._used_bytes = 0  # sum of the records' sizes
        self._unreadable: frozenset[str] = frozenset()
        self._devices: dict[str, str] = {}  # volume id -> loop device, checked against sysfs on use
        self._seen: tuple[int, int] | None = None
        self.open()

    # -- lifecycle

    def open(self) -> RepairPlan:
        """Create the work dir if needed, repair leftovers and re-attach images; returns what it did.

        A volume that cannot be re-attached now is logged; :meth:`get_volume` retries.
        """
        with self._lock:
            if self._lock_fd is None:
                try:
                    self.volumes_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                    self._lock_fd = os.open(
                        self.work_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
                    )
                except OSError as exc:
                    raise BackendUnavailable(f"cannot use work dir {self.work_dir}: {exc}") from None
        with self._mutating():
            state, attached = scan(self.volumes_dir), self.loops.attached()
            resize, refresh = self._plan_resize(state.records, attached)
            plan = dataclasses.replace(
                plan_repair(state, attached, self.volumes_dir), resize=resize, refresh=refresh
            )
            if not plan.empty:
                self._bump_generation()
            for device in plan.detach:
                log.info("loop sandbox: detaching %s (its image is a leftover)", device)
                self.loops.detach(device)
            for path in plan.remove:
                log.info("loop sandbox: removing leftover %s", path)
                _remove(path)
            if plan.remove:
                _fsync_dir(self.volumes_dir)
            for path, size in plan.resize:  # before attaching: a device takes its image's size
                try:
                    before = set_file_size(path, size)
                    log.info("loop sandbox: resized %s from %d to %d bytes, its volume's size", path, before, size)
                except OSError as exc:
                    log.warning("loop sandbox: cannot resize %s to %d bytes: %s", path, size, exc)
            for image in plan.attach:
                try:
                    device = self.loops.attach(str(image))
                    log.info("loop sandbox: re-attached %s to %s", image, device)
                except Exception as exc:  # noqa: BLE001 - reported, retried by get_volume
                    log.warning("loop sandbox: cannot re-attach %s: %s", image, exc)
            for device in plan.refresh:
                try:
                    self.loops.set_capacity(device)
                    log.info("loop sandbox: told %s the size of its volume (an expansion was interrupted)", device)
                except Exception as exc:  # noqa: BLE001 - reported; a retried expansion does it
                    log.warning("loop sandbox: cannot resize %s: %s", device, exc)
            self._reload()
            return plan

    def _plan_resize(
        self, records: Iterable[VolumeRecord], attached: list[LoopDevice]
    ) -> tuple[tuple[tuple[Path, int], ...], tuple[str, ...]]:
        """:func:`plan_resize` over the work dir: a stat per volume, a sysfs read per attached volume."""
        records = list(records)
        image_sizes, device_sizes = {}, {}
        for record in records:
            image = self.image_path(record.id)
            try:
                image_sizes[record.id] = os.stat(image).st_size
            except OSError:
                continue
            device_sizes[record.id] = {d: self.loops.size(d) for d in devices_backed_by(image, attached)}
        return plan_resize(self.volumes_dir, records, image_sizes, device_sizes)

    def close(self) -> None:
        with self._lock:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    @contextlib.contextmanager
    def _mutating(self) -> Iterator[None]:
        """Exclusive access to the work dir, against other threads and other processes,
        with the in-memory view of it up to date."""
        with self._lock:
            if self._lock_fd is None:
                raise BackendUnavailable("the loop backend is closed")
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                if self._state_key() != self._seen:
                    self._reload()
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _state_key(self) -> tuple[int, int]:
        """(generation in the lock file, mtime of the volumes dir): changes whenever the dir may have."""
        data = os.pread(self._lock_fd, GENERATION.size, 0)
        generation = GENERATION.unpack(data)[0] if len(data) == GENERATION.size else 0
        return generation, os.stat(self.volumes_dir).st_mtime_ns

    def _bump_generation(self) -> None:
        """Before changing the work dir: tell every other process sharing it to re-read it.

        Called under :meth:`_mutating`, which has just read the generation into ``_seen``.
        """
        os.pwrite(self._lock_fd, GENERATION.pack(self._seen[0] + 1), 0)

    def _changed(self) -> None:
        """After changing the work dir (and the in-memory view with it)."""
        self._seen = self._state_key()

    def _reload(self) -> None:
        state = scan(self.volumes_dir)
        attached = self.loops.attached()
        self._records = {r.id: r for r in state.records}
        self._used_bytes = state.used
        self._unreadable = frozenset(state.unreadable)
        self._devices = self._devices_from(attached)
        self._seen = self._state_key()

    def _devices_from(self, attached: list[LoopDevice]) -> dict[str, str]:
        """Each known volume's loop device among ``attached`` (volumes not attached are left out)."""
        devices = {}
        for volume_id in self._records:
            backing = devices_backed_by(self.image_path(volume_id), attached)
            if backing:
                devices[volume_id] = backing[0]
        return devices

    def probe(self) -> None:
        reason = self.loops.unavailable_reason()
        if reason:
            raise BackendUnavailable(f"loop sandbox: {reason}")
        # access() and statvfs() rather than writing a file: Probe is called
        # often and must stay cheap; both see a read-only remount.
        try:
            read_only = os.statvfs(self.volumes_dir).f_flag & os.ST_RDONLY
        except OSError as exc:
            raise BackendUnavailable(f"loop sandbox: work dir {self.volumes_dir} is unusable: {exc}") from None
        # Root passes access() on a directory with an x bit unless the file system is
        # read-only, which statvfs already told: skip the system call.
        writable = os.geteuid() == 0 or os.access(self.volumes_dir, os.W_OK | os.X_OK)
        if read_only or not writable:
            raise BackendUnavailable(f"loop sandbox: work dir {self.volumes_dir} is not writable")
        if self._lock_fd is None:
            raise BackendUnavailable("the loop backend is closed")

    # -- paths and views

    def image_path(self, volume_id: str) -> Path:
        return self.volumes_dir / (volume_id + IMAGE_SUFFIX)

    def metadata_path(self, volume_id: str) -> Path:
        return self.volumes_dir / (volume_id + METADATA_SUFFIX)

    def _devices_of(self, volume_id: str) -> list[str]:
        """The loop devices backed by the volume's image: the one we know of, if the kernel
        confirms it (one sysfs read), else every one found by reading them all."""
        image = str(self.image_path(volume_id))
        known = self._devices.get(volume_id)
        if known and self.loops.backing_file(known) == image:
            return [known]
        devices = devices_backed_by(image, self.loops.attached())
        if devices:
            self._devices[volume_id] = devices[0]
        else:
            self._devices.pop(volume_id, None)
        return devices

    def _volume(self, record: VolumeRecord, device: str, condition: Condition | None = None) -> Volume:
        return Volume(
            id=record.id,
            size=record.size,
            device=device,
            name=record.name,
            profile=record.profile,
            attributes={"backend": self.kind, "image": str(self.image_path(record.id))},
            condition=condition,
        )

    def _attached_volume(self, record: VolumeRecord) -> Volume:
        """The volume, its image attached to a loop device (attaching it if needed).

        Its condition says what was found before any repair: a volume whose
        loop device was gone is reported once, as re-attached.
        """
        devices = self._devices_of(record.id)
        if devices:
            device, condition = devices[0], self._device_condition(record, devices[0])
        else:
            # The device takes the image's size: make it the volume's first (see image_size_for).
            image = self.image_path(record.id)
            set_file_size(image, image_size_for(record.size, os.stat(image).st_size, ()))
            device = self.loops.attach(str(image))
            condition = Condition.problem(
                f"volume {record.id} had no loop device (detached by hand, or the node rebooted): "
                f"re-attached its image to {device}"
            )
        self._devices[record.id] = device
        return self._volume(record, device, condition)

    def _device_condition(self, record: VolumeRecord, device: str) -> Condition:
        """Whether the kernel's view of an attached volume matches the record (one sysfs read)."""
        size = self.loops.size(device)
        if size is not None and size < record.size:
            return Condition.problem(
                f"loop device {device} of volume {record.id} is {size} bytes, less than the volume's {record.size}: "
                f"an expansion was interrupted; expand the volume again to finish it"
            )
        return Condition()

    # -- the Backend protocol

    def create_volume(self, name: str, size: SizeRange, profile: Profile) -> Volume:
        if not name:
            raise InvalidParameters("a volume name is required")
        if profile.layout is not Layout.LINEAR:
            raise OutOfRange(f"the loop sandbox serves only type=linear, not type={profile.layout.value}")
        volume_id = lv_name_for(name)
        with self._mutating():
            existing = self._records.get(volume_id)
            if existing is not None:
                reason = is_compatible(existing, name, size, profile)
                if reason:
                    raise VolumeExists(reason)
                return self._attached_volume(existing)
            if volume_id in self._unreadable:
                raise VolumeExists(
                    f"volume id {volume_id} exists but its metadata {self.metadata_path(volume_id)} is unreadable"
                )
            chosen = choose_size(size, self.granularity, self.default_size)
            free = max(0, self.capacity_bytes - self._used_bytes)
            if chosen > free:
                raise OutOfRange(
                    f"the loop sandbox has {format_size(free)} ({free} bytes) free of "
                    f"{format_size(self.capacity_bytes)}; volume {name!r} needs {format_size(chosen)}"
                )
            record = VolumeRecord(volume_id, name, chosen, tuple(sorted(profile.as_parameters().items())), _now())
            self._bump_generation()
            try:
                # Under the lock, an image or metadata alone is a leftover of a killed process.
                self._discard(volume_id)
                return self._create(record)
            finally:
                self._changed()

    def _forget(self, volume_id: str) -> None:
        record = self._records.pop(volume_id, None)
        if record is not None:
            self._used_bytes -= record.size

    def _create(self, record: VolumeRecord) -> Volume:
        # One directory sync, in write_atomically after the rename, makes both
        # entries durable: until then a crash leaves at most leftovers, and the
        # create has not returned.
        image = self.image_path(record.id)
        create_sparse_file(image, record.size)
        device = ""
        try:
            device = self.loops.attach(str(image))
            write_atomically(self.metadata_path(record.id), record.to_json())
        except BaseException:
            # Undo in this process; a kill here leaves leftovers that open() removes.
            with contextlib.suppress(Exception):
                if device:
                    self.loops.detach(device)
                _remove(image)
            raise
        self._records[record.id] = record
        self._used_bytes += record.size
        self._devices[record.id] = device
        log.info("loop sandbox: created volume %s (%s) of %d bytes on %s", record.id, record.name, record.size, device)
        return self._volume(record, device)

    def _discard(self, volume_id: str) -> None:
        """Detach and remove whatever files of ``volume_id`` exist (no metadata check)."""
        image = self.image_path(volume_id)
        if image.exists():
            for device in self._devices_of(volume_id):
                self.loops.detach(device)
            _remove(image)
        _remove(self.metadata_path(volume_id))
        self._devices.pop(volume_id, None)

    def delete_volume(self, volume_id: str) -> None:
        if not is_valid_lv_name(volume_id):
            return  # no such volume can exist; never build a path from it
        image, metadata = self.image_path(volume_id), self.metadata_path(volume_id)
        with self._mutating():
            if not image.exists():
                if metadata.exists():  # the leftover of an interrupted delete
                    self._bump_generation()
                    _remove(metadata)
                    self._forget(volume_id)
                    self._changed()
                return
            devices = self._devices_of(volume_id)
            for device in devices:
                reason = self.loops.busy_reason(device)
                if reason:
                    raise VolumeBusy(f"volume {volume_id} is in use: {reason}")
            self._bump_generation()
            try:
                for device in devices:
                    self.loops.detach(device)
                self._devices.pop(volume_id, None)
                # Either order of the two removals reaching the disk is repaired by
                # open() (an image or metadata alone is a leftover): one sync.
                image.unlink()
                self._forget(volume_id)
                _remove(metadata)
                _fsync_dir(self.volumes_dir)
            finally:
                self._changed()
            log.info("loop sandbox: deleted volume %s", volume_id)

    def _record(self, volume_id: str) -> VolumeRecord:
        """The record of a whole volume (under :meth:`_mutating`); VolumeNotFound when there is none."""
        record = self._records.get(volume_id)
        if record is None:
            raise VolumeNotFound(f"no volume {volume_id!r} in the loop sandbox")
        return record

    def get_volume(self, volume_id: str) -> Volume:
        _check_volume_id(volume_id)
        with self._mutating():
            record = self._record(volume_id)
            return self._attached_volume(record)

    def device_of(self, volume_id: str) -> str | None:
        if not is_valid_lv_name(volume_id):
            return None
        devices = self._devices_of(volume_id)
        return devices[0] if devices else None

    def list_volumes(self) -> list[Volume]:
        """Every volume, sorted by id; ``device`` is empty for one whose image is not attached now.

        Each carries its condition, from the one listing of the loop devices and
        a sysfs read per attached volume (as :meth:`volume_condition` would say).
        """
        with self._mutating():
            self._devices = self._devices_from(self.loops.attached())
            volumes = []
            for volume_id in sorted(self._records):
                record, device = self._records[volume_id], self._devices.get(volume_id, "")
                condition = self._device_condition(record, device) if device else self._detached_condition(volume_id)
                volumes.append(self._volume(record, device, condition))
            return volumes

    def volume_condition(self, volume_id: str) -> Condition:
        """Looks at the metadata, the image and its loop device, and repairs nothing.

        It reads the metadata file, not the cache: a volume whose image was
        removed by hand is no longer cached (metadata alone is what an
        interrupted delete leaves, which :meth:`open` removes at start-up and a
        retried delete finishes), yet the CO still has it until it deletes it,
        so it is reported, not NOT_FOUND.  A healthy look costs that read, a
        stat and the sysfs reads of one device (its backing file, its size).
        """
        _check_volume_id(volume_id)
        metadata, image = self.metadata_path(volume_id), self.image_path(volume_id)
        try:
            record = parse_metadata(volume_id, metadata.read_text())
        except FileNotFoundError:
            raise VolumeNotFound(f"no volume {volume_id!r} in the loop sandbox") from None
        except (OSError, ValueError, InvalidParameters) as exc:
            return Condition.problem(
                f"the metadata {metadata} of volume {volume_id} is unreadable ({exc}): restore it, or remove "
                f"it and the image {image} by hand"
            )
        if not image.exists():
            holders = [d.device for d in self.loops.attached() if d.deleted and d.backing_file == str(image)]
            if holders:
                return Condition.problem(
                    f"the image {image} of volume {volume_id} was removed outside csilvm, but "
                    f"{', '.join(holders)} still holds it: copy the data off that device before deleting the volume"
                )
            return Condition.problem(
                f"the image {image} of volume {volume_id} is gone (removed outside csilvm, or a delete was "
                f"interrupted): its data is lost unless the file is restored; delete the volume"
            )
        devices = self._devices_of(volume_id)
        if not devices:
            return self._detached_condition(volume_id)
        return self._device_condition(record, devices[0])

    def _detached_condition(self, volume_id: str) -> Condition:
        return Condition.problem(
            f"the image of volume {volume_id} is not attached to any loop device (detached by hand, or the "
            f"node rebooted): the next ControllerGetVolume, stage or publish re-attaches it"
        )

    def expand_volume(self, volume_id: str, size: SizeRange) -> int:
        """Grow the image (ftruncate, fsync), rename the new metadata, then tell the loop device.

        The metadata's size is the truth (see the module's docstring): killed
        before the rename, the volume keeps its old size over a larger image,
        which this cuts back to the size asked (no device ever showed that
        space); killed after it, the device is smaller than the volume, and a
        retry, which then needs no growth, only tells the device.
        """
        _check_volume_id(volume_id)
        with self._mutating():
            record = self._record(volume_id)
            target = expansion_target(record.size, size, self.granularity)
            free = max(0, self.capacity_bytes - self._used_bytes)
            if target - record.size > free:
                raise OutOfRange(
                    f"volume {volume_id} cannot grow from {format_size(record.size)} to {format_size(target)}: "
                    f"the loop sandbox has {format_size(free)} ({free} bytes) free of "
                    f"{format_size(self.capacity_bytes)}, so it can grow to at most {record.size + free} bytes"
                )
            image = self.image_path(volume_id)
            devices = {d: self.loops.size(d) for d in self._devices_of(volume_id)}
            if target == record.size:
                # No growth: the metadata is left alone; only what an interrupted expansion
                # left behind (see image_size_for) is brought to the volume's size.
                image_size = os.stat(image).st_size
                fitted = image_size_for(target, image_size, devices.values())
                if fitted != image_size:
                    set_file_size(image, fitted)
            else:
                grown = dataclasses.replace(record, size=target)
                self._bump_generation()
                try:
                    before = set_file_size(image, image_size_for(target, os.stat(image).st_size, devices.values()))
                    try:
                        write_atomically(self.metadata_path(volume_id), grown.to_json())
                    except BaseException:
                        # Undo in this process (no device was told); a kill leaves the larger image.
                        with contextlib.suppress(Exception):
                            set_file_size(image, before)
                        raise
                    self._records[volume_id] = grown
                    self._used_bytes += target - record.size
                finally:
                    self._changed()
                log.info("loop sandbox: expanded volume %s from %d to %d bytes", volume_id, record.size, target)
            for device, device_size in devices.items():
                # A device of unknown size is told after a growth only: a request that grows
                # nothing touches nothing on a healthy volume.
                if device_size < target if device_size is not None else target > record.size:
                    self.loops.set_capacity(device)
            return target

    def modify_volume(self, volume_id: str, parameters: Mapping[str, str]) -> Volume:
        """The sandbox has one layout: a change to ``type=linear`` is no change, any other is refused."""
        profile = parse_profile(parameters)  # InvalidParameters when malformed
        _check_volume_id(volume_id)
        with self._mutating():
            record = self._record(volume_id)
            if profile.layout is not Layout.LINEAR:
                raise InvalidParameters(
                    f"the loop sandbox serves only type=linear; volume {volume_id} cannot become "
                    f"type={profile.layout.value}: use the lvm backend for raid layouts"
                )
            return self._attached_volume(record)

    def capacity(self, profile: Profile) -> Capacity:
        if profile.layout is not Layout.LINEAR:
            return Capacity.none()
        with self._mutating():
            used = self._used_bytes
        available = max(0, self.capacity_bytes - used)
        return Capacity(available, available // self.granularity * self.granularity, self.granularity)

    # -- for test harnesses

    def preprovision(self, volumes: Mapping[str, int]) -> list[Volume]:
        """Create the volumes ``{name: size}`` that do not exist yet (at least ``size`` bytes each)."""
        return [self.create_volume(name, SizeRange(required=size), Profile()) for name, size in sorted(volumes.items())]
