"""The loop-device sandbox: each volume is a sparse file in a work directory, attached to a loop device.

It lets CI, demos and the Mesos test harness run the real CSI Node path
(mkfs, mounts, block devices) with no LVM and no spare disk.

On disk, under ``<work_dir>/volumes/``, a volume is two files:

* ``<id>.img``  - the sparse image, truncated to the volume size;
* ``<id>.json`` - its metadata (CO name, size, profile, creation time, and the
  snapshot or volume it was restored or cloned from), written atomically
  (``<id>.json.tmp``, fsync, rename).

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

Snapshots live apart, under ``<work_dir>/snapshots/``, by the same rules: a
snapshot is ``<id>.img``, a read-only (0444) copy of its volume's image, and
``<id>.json`` (CO name, source volume id, size, creation time in ns), whose
rename commits it.  Snapshot ids are ``snapshot-<name>``: no volume id can
start with ``snapshot`` (lvm2 reserves it), so a snapshot id given where a
volume id is expected, or the reverse, names nothing.  A snapshot is a whole
copy, not a view: deleting its volume leaves it alone.  A restore (from a
snapshot) or a clone (of a volume) is a create whose image is such a copy,
then truncated up to the new volume's size; its metadata records the source.
Every copy keeps the image's holes: ``FICLONE`` (a reflink, where the work
dir's file system has them: btrfs, xfs), else only the data ranges
(``SEEK_DATA``/``SEEK_HOLE``) are copied.  The copy is made under the lock;
a kill during it leaves an image without metadata, a leftover.  The sandbox
does not freeze anything: the caller freezes a mounted file system around a
snapshot or a clone (``snapshots_quiesce`` is False).

Thin volumes (``type=thin``) are sparse images like linear ones, but they do
not reserve their size: the pool is what ``--capacity`` leaves after the
linear volumes' sizes, its data the real allocation (``st_blocks``) of the
thin images and of every snapshot, and thin volumes are admitted by
:func:`lvm.thin.admissible` under the overprovisioning ratio.  A linear
volume (or a snapshot, which is real data too) gets only what neither the
data nor the thin volumes' promises (virtual size / ratio) hold: see
:class:`Space`.

Mutations are serialized by a thread lock and an ``flock`` on
``<work_dir>/.lock``, so two processes sharing a work dir do not race either.

The code is in three modules: this one, the backend (:class:`LoopBackend`);
:mod:`lvm.sandbox_state`, the pure model of the state on disk (records, scans,
repair plans, :class:`~lvm.sandbox_state.Space`), tested without root; and
:mod:`lvm.images`, the file-level I/O (atomic writes, sparse images, copies).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from lvm import images  # called through the module: tests inject faults with images.<name> = ...
from lvm.backend import (
    Capacity,
    Condition,
    ContentSource,
    SizeRange,
    Snapshot,
    Volume,
    choose_size,
    expansion_target,
)
from lvm.errors import (
    BackendUnavailable,
    InvalidParameters,
    OutOfRange,
    PoolExhausted,
    SnapshotExists,
    SnapshotNotFound,
    SourceNotFound,
    VolumeBusy,
    VolumeExists,
    VolumeNotFound,
)
from lvm.loop import LoopDevice, LoopDevices, SystemLoopDevices, devices_backed_by
from lvm.names import is_valid_lv_name, lv_name_for
from lvm.profiles import DEFAULT_THIN_POOL, Layout, Profile, parse_profile
from lvm.sandbox_state import (
    IMAGE_SUFFIX,
    METADATA_SUFFIX,
    RepairPlan,
    SnapshotRecord,
    Space,
    VolumeRecord,
    image_size_for,
    is_compatible,
    is_snapshot_id,
    parse_metadata,
    plan_repair,
    plan_resize,
    plan_snapshot_repair,
    scan,
    scan_snapshots,
    snapshot_id_for,
)
from lvm.thin import ThinPolicy, fill_message
from lvm.units import MiB, format_size

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
GENERATION = struct.Struct("<Q")  # at offset 0 of the lock file
SERVED_LAYOUTS = (Layout.LINEAR, Layout.THIN)


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


@dataclass(frozen=True)
class _Origin:
    """What a restore or clone copies: an image, and how many of its bytes are the source's."""

    path: Path
    size: int
    label: str  # "snapshot <id>" or "volume <id>"


class LoopBackend:
    """Backend (kind ``loop``) of sparse images on loop devices, ``capacity_bytes`` in total.

    ``type=linear`` and ``type=thin`` are served.  A linear volume reserves its
    size; thin volumes share what linear ones leave (one pool, the work dir:
    the profile's ``pool`` is recorded, not used) under ``thin``'s
    overprovisioning ratio and high-water mark, and snapshot copies are data
    of that pool too (see :class:`Space`).  ``loops`` replaces the real loop
    devices (unit tests).  The constructor calls :meth:`open`.

    Snapshots are read-only, hole-keeping copies of a volume's image, kept in
    ``<work_dir>/snapshots`` and independent of their volume, which can be
    deleted (or grown) while they live.  A volume created from a snapshot or
    from another volume starts as such a copy.  Every copy is made under the
    work dir's lock, so a large one holds up other calls while it lasts; the
    caller freezes a mounted source file system around it
    (``snapshots_quiesce`` is False).

    Delete does not wipe: the image is unlinked and a later volume is a new
    sparse file, which reads zeros, whatever the old one held.  (LVM wipes
    because a later LV reuses the same extents.)

    The work dir is the truth; the process keeps what it read of it (records,
    and the loop device of each volume) and re-reads it when it may have
    changed under it: each mutation, by any csilvm process, first bumps a
    generation counter kept in the lock file, and a change of the volumes
    or snapshots directory's mtime reveals files added, removed or renamed by
    hand.  So a create or a GetCapacity costs a pread and two stats, not a
    read of every volume's metadata; only once thin volumes or snapshots
    exist, a stat of each of their images too (their real allocation is the
    thin pool's data, which no cache would keep true).
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
        self.snapshots_dir = self.work_dir / "snapshots"
        self.capacity_bytes = capacity_bytes
        self.default_size = default_size
        self.granularity = granularity
        self.loops: LoopDevices = loops if loops is not None else SystemLoopDevices()
        self.thin = thin or ThinPolicy()
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        # What we read of the work dir, valid while _state_key() == _seen.
        self._records: dict[str, VolumeRecord] = {}
        self._thick_bytes = 0  # sum of the linear records' sizes
        self._thin_bytes = 0  # sum of the thin records' sizes
        self._unreadable: frozenset[str] = frozenset()
        self._snapshots: dict[str, SnapshotRecord] = {}
        self._unreadable_snapshots: frozenset[str] = frozenset()
        self._devices: dict[str, str] = {}  # volume id -> loop device, checked against sysfs on use
        self._seen: tuple[int, int, int] | None = None
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
                    self.snapshots_dir.mkdir(exist_ok=True, mode=0o700)
                    self._lock_fd = os.open(
                        self.work_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
                    )
                except OSError as exc:
                    raise BackendUnavailable(f"cannot use work dir {self.work_dir}: {exc}") from None
        with self._mutating():
            state, attached = scan(self.volumes_dir), self.loops.attached()
            resize, refresh = self._plan_resize(state.records, attached)
            plan = plan_repair(state, attached, self.volumes_dir)
            plan = dataclasses.replace(
                plan,
                remove=plan.remove + plan_snapshot_repair(scan_snapshots(self.snapshots_dir), self.snapshots_dir),
                resize=resize,
                refresh=refresh,
            )
            if not plan.empty:
                self._bump_generation()
            for device in plan.detach:
                log.info("loop sandbox: detaching %s (its image is a leftover)", device)
                self.loops.detach(device)
            for path in plan.remove:
                log.info("loop sandbox: removing leftover %s", path)
                _remove(path)
            for directory in sorted({path.parent for path in plan.remove}):
                images._fsync_dir(directory)
            for path, size in plan.resize:  # before attaching: a device takes its image's size
                try:
                    before = images.set_file_size(path, size)
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

    def _state_key(self) -> tuple[int, int, int]:
        """(generation in the lock file, mtimes of the volumes and snapshots dirs): changes whenever they may have."""
        data = os.pread(self._lock_fd, GENERATION.size, 0)
        generation = GENERATION.unpack(data)[0] if len(data) == GENERATION.size else 0
        return generation, os.stat(self.volumes_dir).st_mtime_ns, os.stat(self.snapshots_dir).st_mtime_ns

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
        self._thick_bytes, self._thin_bytes = state.thick, state.thin_virtual
        self._unreadable = frozenset(state.unreadable)
        snapshots = scan_snapshots(self.snapshots_dir)
        self._snapshots = {r.id: r for r in snapshots.records}
        self._unreadable_snapshots = frozenset(snapshots.unreadable)
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

    def snapshot_image_path(self, snapshot_id: str) -> Path:
        return self.snapshots_dir / (snapshot_id + IMAGE_SUFFIX)

    def snapshot_metadata_path(self, snapshot_id: str) -> Path:
        return self.snapshots_dir / (snapshot_id + METADATA_SUFFIX)

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
            content_source=record.source,
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
            images.set_file_size(image, image_size_for(record.size, os.stat(image).st_size, ()))
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

    def create_volume(
        self, name: str, size: SizeRange, profile: Profile, source: ContentSource | None = None
    ) -> Volume:
        """Create the volume ``name`` (empty, or a copy of ``source``), or return the compatible one.

        With no range, a restore or clone gets its source's size.
        """
        if not name:
            raise InvalidParameters("a volume name is required")
        if profile.layout not in SERVED_LAYOUTS:
            raise OutOfRange(
                f"the loop sandbox serves only type=linear and type=thin, not type={profile.layout.value}"
            )
        volume_id = lv_name_for(name)
        with self._mutating():
            existing = self._records.get(volume_id)
            if existing is not None:
                reason = is_compatible(existing, name, size, profile, source)
                if reason:
                    raise VolumeExists(reason)
                return self._attached_volume(existing)
            if volume_id in self._unreadable:
                raise VolumeExists(
                    f"volume id {volume_id} exists but its metadata {self.metadata_path(volume_id)} is unreadable"
                )
            origin = self._origin(source, name) if source is not None else None
            chosen = choose_size(size, self.granularity, origin.size if origin else self.default_size)
            if origin is not None and chosen < origin.size:
                raise OutOfRange(
                    f"volume {name!r} cannot hold {origin.label}: it is {format_size(origin.size)} "
                    f"({origin.size} bytes) and the requested range gives {format_size(chosen)}; "
                    f"ask for at least {origin.size} bytes"
                )
            self._admit(name, chosen, profile)
            record = VolumeRecord(
                volume_id, name, chosen, tuple(sorted(profile.as_parameters().items())), _now(), source
            )
            self._bump_generation()
            try:
                # Under the lock, an image or metadata alone is a leftover of a killed process.
                self._discard(volume_id)
                return self._create(record, origin)
            finally:
                self._changed()

    def _origin(self, source: ContentSource, name: str) -> _Origin:
        """The image a new volume is copied from, and the bytes of it that are the source's; SourceNotFound."""
        if source.kind == ContentSource.SNAPSHOT:
            snapshot = self._snapshots.get(source.id) if is_snapshot_id(source.id) else None
            if snapshot is None:
                raise SourceNotFound(f"no snapshot {source.id!r} in the loop sandbox to restore volume {name!r} from")
            return _Origin(self.snapshot_image_path(snapshot.id), snapshot.size, f"snapshot {snapshot.id}")
        volume = self._records.get(source.id) if is_valid_lv_name(source.id) else None
        if volume is None:
            raise SourceNotFound(f"no volume {source.id!r} in the loop sandbox to clone volume {name!r} from")
        return _Origin(self.image_path(volume.id), volume.size, f"volume {volume.id}")

    def _data_used(self) -> int:
        """Bytes the thin images and the snapshots hold on disk: a stat each (none without either)."""
        used = sum(images.allocated_bytes(self.image_path(r.id)) for r in self._records.values() if r.thin)
        return used + sum(images.allocated_bytes(self.snapshot_image_path(i)) for i in self._snapshots)

    def _space(self) -> Space:
        """The space as it is now (under :meth:`_mutating`)."""
        return Space(
            capacity=self.capacity_bytes,
            thick=self._thick_bytes,
            thin_virtual=self._thin_bytes,
            data_used=self._data_used() if self._thin_bytes or self._snapshots else 0,
            ratio=self.thin.overprovision_ratio,
            full_percent=self.thin.full_percent,
        )

    def _fill_message(self, space: Space, pool: str | None = None) -> str:
        label = f"{pool or DEFAULT_THIN_POOL} (the loop sandbox's work dir {self.work_dir}, {format_size(space.pool)})"
        return fill_message(label, space.data_percent, 0.0, self.thin.full_percent)

    def _admit(self, name: str, size: int, profile: Profile) -> None:
        """OutOfRange (or PoolExhausted, for thin above the high-water mark) unless ``size`` bytes fit."""
        space = self._space()
        if profile.thin:
            if space.full:
                raise PoolExhausted(self._fill_message(space, profile.pool))
            room = space.thin_admissible
            if size > room:
                raise OutOfRange(
                    f"the loop sandbox's thin pool admits {format_size(room)} ({room} bytes) more of thin volumes "
                    f"(pool {format_size(space.pool)}, {space.data_used} bytes of data, "
                    f"{format_size(space.thin_virtual)} of thin volumes, overprovisioning ratio "
                    f"{self.thin.overprovision_ratio:g}); volume {name!r} needs {format_size(size)}"
                )
            return
        if size > space.free:
            raise OutOfRange(
                f"the loop sandbox has {format_size(space.free)} ({space.free} bytes) free of "
                f"{format_size(self.capacity_bytes)}{self._held_by_thin(space)}; volume {name!r} needs {format_size(size)}"
            )

    @staticmethod
    def _held_by_thin(space: Space) -> str:
        if not (space.thin_virtual or space.data_used):
            return ""
        return (
            f" ({format_size(space.thick)} of linear volumes, {space.data_used} bytes of thin data and snapshots, "
            f"{space.promised} bytes promised to thin volumes)"
        )

    def _account(self, record: VolumeRecord, sign: int) -> None:
        if record.thin:
            self._thin_bytes += sign * record.size
        else:
            self._thick_bytes += sign * record.size

    def _forget(self, volume_id: str) -> None:
        record = self._records.pop(volume_id, None)
        if record is not None:
            self._account(record, -1)

    def _create(self, record: VolumeRecord, origin: _Origin | None = None) -> Volume:
        # One directory sync, in write_atomically after the rename, makes both
        # entries durable: until then a crash leaves at most leftovers, and the
        # create has not returned.
        image = self.image_path(record.id)
        how = "empty"
        if origin is None:
            images.create_sparse_file(image, record.size)
        else:
            try:
                how = images.copy_image(origin.path, image, origin.size, record.size)
            except BaseException:
                with contextlib.suppress(Exception):
                    _remove(image)  # a kill here leaves it: a leftover open() removes
                raise
        device = ""
        try:
            device = self.loops.attach(str(image))
            images.write_atomically(self.metadata_path(record.id), record.to_json())
        except BaseException:
            # Undo in this process; a kill here leaves leftovers that open() removes.
            with contextlib.suppress(Exception):
                if device:
                    self.loops.detach(device)
                _remove(image)
            raise
        self._records[record.id] = record
        self._account(record, +1)
        self._devices[record.id] = device
        profile = " ".join(f"{k}={v}" for k, v in record.parameters)
        if origin is None:
            log.info(
                "loop sandbox: created volume %s (%s) of %d bytes, %s, on %s",
                record.id, record.name, record.size, profile, device,
            )
        else:
            log.info(
                "loop sandbox: created volume %s (%s) of %d bytes, %s, on %s from %s (%s)",
                record.id, record.name, record.size, profile, device, origin.label, how,
            )
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
            record = self._records.get(volume_id)
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
                images._fsync_dir(self.volumes_dir)
            finally:
                self._changed()
            if record is not None:
                log.info(
                    "loop sandbox: deleted volume %s (%s) of %d bytes, %s", volume_id, record.name, record.size,
                    " ".join(f"{k}={v}" for k, v in record.parameters),
                )
            else:
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
            if target > record.size:
                self._admit_growth(record, target)
            image = self.image_path(volume_id)
            devices = {d: self.loops.size(d) for d in self._devices_of(volume_id)}
            if target == record.size:
                # No growth: the metadata is left alone; only what an interrupted expansion
                # left behind (see image_size_for) is brought to the volume's size.
                image_size = os.stat(image).st_size
                fitted = image_size_for(target, image_size, devices.values())
                if fitted != image_size:
                    images.set_file_size(image, fitted)
            else:
                grown = dataclasses.replace(record, size=target)
                self._bump_generation()
                try:
                    before = images.set_file_size(image, image_size_for(target, os.stat(image).st_size, devices.values()))
                    try:
                        images.write_atomically(self.metadata_path(volume_id), grown.to_json())
                    except BaseException:
                        # Undo in this process (no device was told); a kill leaves the larger image.
                        with contextlib.suppress(Exception):
                            images.set_file_size(image, before)
                        raise
                    self._records[volume_id] = grown
                    self._account(record, -1)
                    self._account(grown, +1)
                finally:
                    self._changed()
                log.info("loop sandbox: expanded volume %s from %d to %d bytes", volume_id, record.size, target)
            for device, device_size in devices.items():
                # A device of unknown size is told after a growth only: a request that grows
                # nothing touches nothing on a healthy volume.
                if device_size < target if device_size is not None else target > record.size:
                    self.loops.set_capacity(device)
            return target

    def _admit_growth(self, record: VolumeRecord, target: int) -> None:
        """OutOfRange unless ``record`` may grow to ``target`` bytes: from the free space (linear), or
        within the thin pool's overprovisioning bound and below its high-water mark (thin)."""
        space, growth = self._space(), target - record.size
        grow = f"volume {record.id} cannot grow from {format_size(record.size)} to {format_size(target)}"
        if record.thin:
            if space.full:
                raise OutOfRange(f"{grow}: {self._fill_message(space, record.profile.pool)}")
            room = space.thin_admissible
            if growth > room:
                raise OutOfRange(
                    f"{grow}: the loop sandbox's thin pool admits {format_size(room)} ({room} bytes) more of "
                    f"thin volumes at the overprovisioning ratio {self.thin.overprovision_ratio:g}, so it can grow "
                    f"to at most {record.size + room} bytes"
                )
            return
        if growth > space.free:
            raise OutOfRange(
                f"{grow}: the loop sandbox has {format_size(space.free)} ({space.free} bytes) free of "
                f"{format_size(self.capacity_bytes)}{self._held_by_thin(space)}, so it can grow to at most "
                f"{record.size + space.free} bytes"
            )

    def modify_volume(self, volume_id: str, parameters: Mapping[str, str]) -> Volume:
        """Only linear volumes are modified, and only to ``type=linear``, which is no change; any other is refused."""
        profile = parse_profile(parameters)  # InvalidParameters when malformed
        _check_volume_id(volume_id)
        with self._mutating():
            record = self._record(volume_id)
            if record.thin:
                raise InvalidParameters(
                    f"volume {volume_id} is type=thin: the loop sandbox modifies only type=linear volumes "
                    f"(it cannot move a volume in or out of its thin pool)"
                )
            if profile.layout is not Layout.LINEAR:
                raise InvalidParameters(
                    f"the loop sandbox modifies only type=linear volumes; volume {volume_id} cannot become "
                    f"type={profile.layout.value}: use the lvm backend for raid and thin layouts"
                )
            return self._attached_volume(record)

    def capacity(self, profile: Profile) -> Capacity:
        """Exact: a volume of ``maximum_volume_size`` is admitted.  Thin: what the pool admits (0 above
        its high-water mark), floored to the granularity; linear: the free space."""
        if profile.layout not in SERVED_LAYOUTS:
            return Capacity.none()
        with self._mutating():
            space = self._space()
        if profile.thin:
            room = space.thin_admissible // self.granularity * self.granularity
            return Capacity(room, room, self.granularity)
        return Capacity(space.free, space.free // self.granularity * self.granularity, self.granularity)

    # -- snapshots

    def create_snapshot(self, name: str, source_volume_id: str) -> Snapshot:
        """Copy the volume's image (read-only, holes kept) and commit it by renaming its metadata.

        Idempotent by name: the snapshot ``name`` of the same volume is returned
        as it was taken (same id, same creation time); of another volume it is
        SnapshotExists.  PoolExhausted when the pool is above its high-water mark
        or has no room for the copy's data.
        """
        if not name:
            raise InvalidParameters("a snapshot name is required")
        snapshot_id = snapshot_id_for(name)
        with self._mutating():
            existing = self._snapshots.get(snapshot_id)
            if existing is not None:
                if existing.name != name:
                    raise SnapshotExists(
                        f"snapshot id {snapshot_id} belongs to the snapshot named {existing.name!r}, not {name!r}"
                    )
                if existing.source_volume_id != source_volume_id:
                    raise SnapshotExists(
                        f"snapshot {name!r} exists, of volume {existing.source_volume_id!r}, not {source_volume_id!r}"
                    )
                return existing.snapshot
            if snapshot_id in self._unreadable_snapshots:
                raise SnapshotExists(
                    f"snapshot id {snapshot_id} exists but its metadata {self.snapshot_metadata_path(snapshot_id)} "
                    f"is unreadable"
                )
            source = self._records.get(source_volume_id) if is_valid_lv_name(source_volume_id) else None
            if source is None:
                raise SourceNotFound(f"no volume {source_volume_id!r} in the loop sandbox to snapshot")
            space = self._space()
            if space.full:
                raise PoolExhausted(self._fill_message(space))
            image = self.image_path(source.id)
            need = min(images.allocated_bytes(image), source.size)
            if need > space.free:
                raise PoolExhausted(
                    f"not enough space for snapshot {name!r}: volume {source.id} holds {need} bytes of data, "
                    f"the loop sandbox has {space.free} bytes free of {format_size(self.capacity_bytes)}"
                    f"{self._held_by_thin(space)}; delete volumes or snapshots"
                )
            record = SnapshotRecord(snapshot_id, name, source.id, source.size, time.time_ns(), source.parameters)
            self._bump_generation()
            try:
                self._discard_snapshot(snapshot_id)  # under the lock, files alone are a killed process's
                snapshot_image = self.snapshot_image_path(snapshot_id)
                try:
                    how = images.copy_image(image, snapshot_image, source.size, source.size, read_only=True)
                    images.write_atomically(self.snapshot_metadata_path(snapshot_id), record.to_json())
                except BaseException:
                    with contextlib.suppress(Exception):
                        _remove(snapshot_image)  # a kill here leaves it: a leftover open() removes
                    raise
                self._snapshots[snapshot_id] = record
            finally:
                self._changed()
            log.info(
                "loop sandbox: snapshot %s (%s) of volume %s, %d bytes (%s)",
                snapshot_id, name, source.id, source.size, how,
            )
            return record.snapshot

    def _discard_snapshot(self, snapshot_id: str) -> None:
        _remove(self.snapshot_image_path(snapshot_id))
        _remove(self.snapshot_metadata_path(snapshot_id))

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Remove the image, then the metadata (either alone is a leftover :meth:`open` removes)."""
        if not is_snapshot_id(snapshot_id):
            return  # no such snapshot can exist; never build a path from it
        image, metadata = self.snapshot_image_path(snapshot_id), self.snapshot_metadata_path(snapshot_id)
        with self._mutating():
            if not (image.exists() or metadata.exists()):
                return
            self._bump_generation()
            try:
                _remove(image)
                self._snapshots.pop(snapshot_id, None)
                _remove(metadata)
                images._fsync_dir(self.snapshots_dir)
            finally:
                self._changed()
            log.info("loop sandbox: deleted snapshot %s", snapshot_id)

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        if not is_snapshot_id(snapshot_id):
            raise SnapshotNotFound(f"no snapshot {snapshot_id!r}: not a snapshot id of the loop sandbox")
        with self._mutating():
            record = self._snapshots.get(snapshot_id)
            if record is None:
                raise SnapshotNotFound(f"no snapshot {snapshot_id!r} in the loop sandbox")
            return record.snapshot

    def list_snapshots(self) -> list[Snapshot]:
        with self._mutating():
            return [self._snapshots[i].snapshot for i in sorted(self._snapshots)]

    # -- for test harnesses

    def preprovision(self, volumes: Mapping[str, int]) -> list[Volume]:
        """Create the volumes ``{name: size}`` that do not exist yet (at least ``size`` bytes each)."""
        return [self.create_volume(name, SizeRange(required=size), Profile()) for name, size in sorted(volumes.items())]
