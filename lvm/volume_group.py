"""The LVM backend: volumes are logical volumes of one volume group.

Costs in lvm2 processes (asserted by tests/unit/test_lvm_backend.py):
CreateVolume = 1 fullreport + 1 lvcreate; DeleteVolume = 1 fullreport + 1
lvremove; GetCapacity, ListVolumes and get_volume = 1 fullreport, whatever
the number of LVs.  Mutations are serialized by one lock (the report they
decide on stays true until they run); reads take no lock.
"""

from __future__ import annotations

import errno
import logging
import os
import platform
import re
import threading
import time
from typing import Callable, Mapping, Sequence

from lvm import capacity as capacity_model
from lvm import names
from lvm import thin as thin_model
from lvm.copy import copy_device
from lvm.attr import Health, State
from lvm.backend import (
    Capacity,
    Condition,
    ContentSource,
    SizeRange,
    Snapshot,
    Volume,
    choose_size,
    expansion_target,
    restore_range,
)
from lvm.errors import (
    BackendUnavailable,
    CommandFailed,
    InvalidParameters,
    OutOfRange,
    PoolExhausted,
    SnapshotExists,
    SnapshotNotFound,
    SourceNotFound,
    StorageError,
    VolumeBusy,
    VolumeExists,
    VolumeGroupDegraded,
    VolumeHasSnapshots,
    VolumeNotFound,
)
from lvm.lvm2 import Lvm2, VolumeGroupNotFound
from lvm.profiles import DEFAULT_THIN_POOL, Layout, Profile, parse_profile
from lvm.report import LogicalVolumeInfo, Report
from lvm.single_flight import SingleFlight
from lvm.units import GiB, MiB, format_size

log = logging.getLogger(__name__)

VG_TAG = "csilvm"
PROFILE_TAG_PREFIX = "csilvm.profile."
POOL_TAG = "csilvm.pool"  # a thin pool csilvm created (and so may one day grow or remove)
SNAPSHOT_TAG = "csilvm.snapshot"  # the LV is a CSI snapshot, not a volume
SOURCE_TAG_PREFIX = "csilvm.source."  # a snapshot's source volume id
SIZE_TAG_PREFIX = "csilvm.size."  # a snapshot's size: its source's size when taken
CREATED_TAG_PREFIX = "csilvm.created."  # a snapshot's creation time, ns since the epoch
FROM_TAG_PREFIX = "csilvm.from."  # a restored or cloned volume's source: csilvm.from.<kind>.<id>
INCOMPLETE_TAG = "csilvm.incomplete"  # its content is still being copied: not usable yet
TEMPORARY_TAG = "csilvm.temporary"  # a point-in-time source of a clone being made
WIPE_BYTES = MiB
# lvm2's LV name alphabet; ids outside it never reach an lvm2 command line.
_LV_ID = re.compile(r"^[A-Za-z0-9+_.][A-Za-z0-9+_.-]{0,126}$")


def is_lv_id(volume_id: str) -> bool:
    """True when ``volume_id`` could name an LV (so it is safe to put in ``<vg>/<lv>``)."""
    return bool(_LV_ID.match(volume_id)) and volume_id not in (".", "..")


def wipe_device_ends(path: str, length: int = WIPE_BYTES) -> None:
    """Zero the first and last ``length`` bytes of a block device, then fsync.

    Opened with O_EXCL: the kernel refuses (EBUSY) while the device is mounted
    or held, so a volume in use is never wiped.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_EXCL | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            raise VolumeBusy(f"{path} is in use (mounted or open), not wiping it") from None
        raise
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        zeros = bytes(min(length, size))
        for offset in sorted({0, max(size - len(zeros), 0)}):
            written = 0
            while written < len(zeros):
                written += os.pwrite(fd, zeros[written:], offset + written)
        os.fsync(fd)
    finally:
        os.close(fd)


def device_mapper_available() -> bool:
    """Whether the kernel has device-mapper (a /dev/mapper/control node alone proves nothing)."""
    try:
        with open("/proc/misc", encoding="ascii", errors="replace") as misc:
            return any(line.split()[-1:] == ["device-mapper"] for line in misc)
    except OSError:
        return False


def raid_supported_by_kernel() -> bool:
    """Whether lvcreate --type raid0/raid1 can work here.

    True when dm-raid is loaded or built in, or when device-mapper is present
    and the dm-raid module exists for the running kernel (lvm2 loads it).
    """
    if os.path.exists("/sys/module/dm_raid"):
        return True
    if not device_mapper_available():
        return False
    modules = f"/lib/modules/{platform.release()}"
    for index in ("modules.builtin", "modules.dep"):
        try:
            with open(os.path.join(modules, index), encoding="utf-8", errors="replace") as f:
                if any("/dm-raid.ko" in line for line in f):
                    return True
        except OSError:
            continue
    return False


def profile_tags(profile: Profile) -> tuple[str, ...]:
    """Tags that record ``profile`` exactly: ``csilvm.profile.<key>.<value>``."""
    return tuple(f"{PROFILE_TAG_PREFIX}{key}.{value}" for key, value in profile.as_parameters().items())


def profile_from_tags(tags: Sequence[str]) -> Profile | None:
    """The profile recorded by :func:`profile_tags`; None when there is none (or it is unreadable)."""
    params = {}
    for tag in tags:
        if tag.startswith(PROFILE_TAG_PREFIX):
            key, _, value = tag[len(PROFILE_TAG_PREFIX):].partition(".")
            params[key] = value
    if "type" not in params:
        return None
    try:
        layout = Layout(params["type"])
        if layout is Layout.RAID0:
            return Profile(
                Layout.RAID0,
                stripes=int(params["stripes"]) if "stripes" in params else None,
                stripe_size=int(params["stripesize"]) if "stripesize" in params else None,
            )
        if layout is Layout.RAID1:
            return Profile(Layout.RAID1, mirrors=int(params.get("mirrors", "1")))
        if layout is Layout.THIN:
            return Profile(Layout.THIN, pool=params.get("pool", DEFAULT_THIN_POOL))
        return Profile()
    except ValueError:
        return None


def derived_profile(lv: LogicalVolumeInfo) -> Profile | None:
    """The profile an LV's segments amount to, for LVs csilvm did not tag."""
    if len(set(lv.segtypes)) > 1:
        return None
    if lv.is_thin:
        return Profile(Layout.THIN, pool=lv.pool_lv)
    if lv.segtype == "linear" or (lv.segtype == "striped" and lv.stripes == 1):
        return Profile()
    if lv.segtype in ("striped", "raid0"):
        return Profile(Layout.RAID0, stripes=lv.stripes, stripe_size=lv.stripe_size or None)
    if lv.segtype == "raid1":
        return Profile(Layout.RAID1, mirrors=lv.mirrors)
    return None


def profile_of(lv: LogicalVolumeInfo) -> Profile | None:
    """The profile recorded in the tags while the LV's layout agrees with it, else the layout's own.

    (A layout change is the lvconvert first, then the tags: a kill between the
    two leaves tags that the layout contradicts, and the layout wins.)
    """
    derived = derived_profile(lv)
    tagged = profile_from_tags(lv.tags)
    if tagged is not None and (derived is None or tagged.layout is derived.layout) and (
        tagged.layout is not Layout.RAID1 or derived is None or tagged.mirrors == derived.mirrors
    ):
        return tagged
    return derived


def missing_pvs_message(vg_name: str, report: Report) -> str | None:
    """What an operator must know and do when PVs of the VG are missing; None when it is whole."""
    missing = [pv for pv in report.pvs if pv.missing]
    if not missing:
        return None
    which = ", ".join(f"{pv.name if pv.name != '[unknown]' else 'a device'} (PV UUID {pv.uuid})" for pv in missing)
    return (
        f'volume group "{vg_name}" is missing physical volume {which}; lvm2 changes nothing in it until it is whole. '
        f"Bring the device back (its volumes return by themselves), or drop it with "
        f"`vgreduce --removemissing {vg_name}` — which refuses while volumes still use it; "
        f"repair raid1 volumes onto another PV first (`lvconvert --repair {vg_name}/<volume>`), and know that "
        f"`--force` deletes every volume with data on the missing PV"
    )


def lv_condition(vg_name: str, lv: LogicalVolumeInfo, report: Report) -> Condition:
    """The health of ``lv`` from what lvm2 and the kernel report, with what to do about it."""
    full = f"{vg_name}/{lv.name}"
    health = lv.attr.health
    if health is Health.PARTIAL:
        missing = missing_pvs_message(vg_name, report) or "a physical volume under it is missing"
        return Condition.problem(f"logical volume {full} is partial: {missing}")
    if health is Health.REFRESH_NEEDED:
        return Condition.problem(
            f"a device under logical volume {full} failed: once it works again run `lvchange --refresh {full}`, "
            f"or replace the failed leg with `lvconvert --repair {full}`"
        )
    if health is Health.MISMATCHES or lv.mismatches:
        return Condition.problem(
            f"raid logical volume {full} has {lv.mismatches or 'some'} mismatched region(s) between its copies: "
            f"run `lvchange --syncaction repair {full}`"
        )
    if health in (Health.ERROR, Health.FAILED, Health.OUT_OF_DATA_SPACE, Health.METADATA_READ_ONLY):
        return Condition.problem(f"logical volume {full} reports health {health.name.lower().replace('_', ' ')}")
    if lv.images_out_of_sync or (lv.sync_percent is not None and lv.sync_percent < 100):
        done = f"{lv.sync_percent:.2f}%" if lv.sync_percent is not None else "partly"
        action = f" ({lv.sync_action})" if lv.sync_action and lv.sync_action != "idle" else ""
        return Condition.problem(
            f"raid logical volume {full} is {done} in sync{action}: its copies are not all complete yet, "
            f"so a device failure now could lose data; it needs no action unless it stays below 100%"
        )
    if lv.attr.state is not State.ACTIVE:
        return Condition.problem(
            f"logical volume {full} is not active (state {lv.attr.state.name.lower()}): run `lvchange -ay {full}`"
        )
    return Condition()


def is_snapshot(lv: LogicalVolumeInfo) -> bool:
    return SNAPSHOT_TAG in lv.tags


def is_volume(lv: LogicalVolumeInfo) -> bool:
    """Whether the LV is a volume: not a thin pool, nor one of csilvm's snapshots or temporary LVs."""
    return not lv.is_thin_pool and SNAPSHOT_TAG not in lv.tags and TEMPORARY_TAG not in lv.tags


def tag_value(tags: Sequence[str], prefix: str) -> str | None:
    for tag in tags:
        if tag.startswith(prefix):
            return tag[len(prefix):]
    return None


def content_source_of(lv: LogicalVolumeInfo) -> ContentSource | None:
    recorded = tag_value(lv.tags, FROM_TAG_PREFIX)
    if recorded is None:
        return None
    kind, _, source_id = recorded.partition(".")
    return ContentSource(kind, source_id)


def content_source_tag(source: ContentSource) -> str:
    return f"{FROM_TAG_PREFIX}{source.kind}.{source.id}"


def thin_pool_metadata_extents(data_extents: int, extent_size: int) -> int:
    """lvm2's estimate of a new thin pool's metadata LV: 64 bytes per 64 KiB chunk, at least 2 MiB."""
    metadata = max(2 * MiB, data_extents * extent_size // (64 * 1024) * 64)
    return -(-metadata // extent_size)


def cow_extents_for(origin_extents: int) -> int:
    """COW store extents that a snapshot of ``origin_extents`` can never overflow.

    A snapshot's exception store holds each changed 4 KiB chunk plus 16 bytes
    of index per chunk (a 4 KiB index chunk per 256 data chunks) and a header
    chunk: less than 1/128 more than the origin, plus one extent.  lvm2 cuts a
    request above what the origin can ever need down to that maximum.
    """
    return origin_extents + -(-origin_extents // 128) + 1


class LvmBackend:
    """A Backend over one LVM volume group; see lvm/backend.py for the contract.

    Thin volumes (``type=thin``) live in a thin pool of the VG, which csilvm
    creates on first use when the operator set its size, or adopts.  Snapshots
    are LVs tagged ``csilvm.snapshot`` with their source, size and creation
    time in tags: thin snapshots of thin volumes (instant, sharing blocks), and
    for thick volumes COW snapshots whose exception store is as large as the
    origin, so that they can never overflow (see README, "Snapshots").
    Restores and clones of thin sources into the same pool are thin snapshots
    too; every other restore or clone is a new LV plus a block copy, tagged
    ``csilvm.incomplete`` until the copy is complete.
    """

    kind = "lvm"
    snapshots_quiesce = True  # lvcreate -s suspends the origin, which freezes a mounted file system

    def __init__(
        self,
        vg_name: str,
        lvm2: Lvm2,
        devices: Sequence[str] | None = None,
        default_size: int = GiB,
        *,
        wipe: Callable[[str], None] = wipe_device_ends,
        raid_supported: Callable[[], bool] = raid_supported_by_kernel,
        region_size: int = capacity_model.DEFAULT_REGION_SIZE,
        thin: thin_model.ThinPolicy | None = None,
        copy: Callable[..., None] = copy_device,
    ):
        self.vg_name = vg_name
        self.thin = thin or thin_model.ThinPolicy()
        self.copy = copy
        self.lvm2 = lvm2
        self.devices = list(devices) if devices else None
        self.default_size = default_size
        self.wipe = wipe
        self.raid_supported = raid_supported
        self.region_size = region_size
        self._mutation_lock = threading.Lock()
        self._probe = SingleFlight()  # concurrent Probes share one lvm2 report

    # -- setup ----------------------------------------------------------------

    def ensure_volume_group(self) -> None:
        """Create the VG from ``devices`` if missing; check it is ours if present.

        Without ``devices`` the VG must exist already (an operator's VG, any tags).
        """
        with self._mutation_lock:
            try:
                report = self.lvm2.report(self.vg_name)
            except VolumeGroupNotFound:
                report = None
            if report is not None:
                if self.devices is not None:
                    self._check_ours(report)
                return
            if self.devices is None:
                raise BackendUnavailable(
                    f'volume group "{self.vg_name}" does not exist: create it, or give csilvm devices to create it on'
                )
            wanted = {os.path.realpath(d): d for d in self.devices}
            known = {os.path.realpath(pv.name): pv for pv in self.lvm2.physical_volumes()}
            taken = [f"{wanted[p]} (in volume group {known[p].vg_name})" for p in wanted if p in known and known[p].vg_name]
            if taken:
                raise BackendUnavailable(
                    f'cannot create volume group "{self.vg_name}": device(s) already used: {", ".join(taken)}'
                )
            missing = [d for p, d in wanted.items() if p not in known]
            if missing:
                self.lvm2.pvcreate(missing)
            self.lvm2.vgcreate(self.vg_name, self.devices, extent_size="1m", tags=[VG_TAG])

    def _check_ours(self, report: Report) -> None:
        have = {os.path.realpath(pv.name) for pv in report.pvs}
        want = {os.path.realpath(d) for d in self.devices or ()}
        if have != want:
            raise BackendUnavailable(
                f'volume group "{self.vg_name}" exists on {", ".join(sorted(pv.name for pv in report.pvs))}, '
                f'not on the configured devices {", ".join(sorted(self.devices or ()))}: '
                f"fix the configuration or the volume group"
            )
        if VG_TAG not in report.vg.tags:
            raise BackendUnavailable(
                f'volume group "{self.vg_name}" exists but has no "{VG_TAG}" tag, so csilvm did not create it; '
                f"refusing to manage it as csilvm's (run without devices to use an existing volume group)"
            )

    def probe(self) -> None:
        try:
            self._probe.run(lambda: self.lvm2.report(self.vg_name))
        except BackendUnavailable:
            raise
        except StorageError as exc:
            raise BackendUnavailable(f"lvm2 cannot report volume group {self.vg_name}: {exc}") from None

    def close(self) -> None:
        pass

    # -- reads ------------------------------------------------------------------

    def _volume(self, lv: LogicalVolumeInfo, report: Report) -> Volume:
        return Volume(
            id=lv.name,
            size=lv.size,
            device=lv.path,
            name=names.name_from_tags(lv.tags),
            profile=profile_of(lv),
            tags=lv.tags,
            attributes={
                "vg": self.vg_name,
                "lv_name": lv.name,
                "segtype": lv.segtype,
                "lv_attr": lv.attr.raw,
                "tags": ",".join(lv.tags),
            },
            condition=self._condition(lv, report),
            content_source=content_source_of(lv),
            incomplete=INCOMPLETE_TAG in lv.tags,
        )

    def _condition(self, lv: LogicalVolumeInfo, report: Report) -> Condition:
        if INCOMPLETE_TAG in lv.tags:
            source = content_source_of(lv)
            what = f"the {source.kind} {source.id}" if source else "its source"
            return Condition.problem(
                f"volume {lv.name} is incomplete: its content is being copied from {what}, or the copy was "
                f"interrupted; CreateVolume with the same name finishes it (DeleteVolume drops it)"
            )
        condition = lv_condition(self.vg_name, lv, report)
        if condition.abnormal or not lv.is_thin:
            return condition
        pool = report.lv(lv.pool_lv)
        if pool is not None and self._pool_full(pool):
            return Condition.problem(
                f"{self._fill_message(pool)}; writes to logical volume {self.vg_name}/{lv.name} fail once it is 100% full"
            )
        return condition

    def list_volumes(self) -> list[Volume]:
        report = self.lvm2.report(self.vg_name)
        return sorted((self._volume(lv, report) for lv in report.lvs if is_volume(lv)), key=lambda v: v.id)

    def get_volume(self, volume_id: str) -> Volume:
        report = self.lvm2.report(self.vg_name)
        return self._volume(self._lv_or_not_found(report, volume_id), report)

    def device_of(self, volume_id: str) -> str | None:
        path = f"/dev/{self.vg_name}/{volume_id}"
        return path if is_lv_id(volume_id) and os.path.exists(path) else None

    def capacity(self, profile: Profile) -> Capacity:
        report = self.lvm2.report(self.vg_name)
        if missing_pvs_message(self.vg_name, report):
            return Capacity.none()  # lvm2 refuses every create until the VG is whole
        if profile.thin:
            available = self._thin_admissible(report, profile.thin_pool)
            extent_size = report.vg.extent_size
            available = available // extent_size * extent_size
            return Capacity(available, available, extent_size) if available else Capacity.none()
        if profile.layout is not Layout.LINEAR and not self.raid_supported():
            return Capacity.none()
        return capacity_model.capacity(report.free_extents_by_pv(), report.vg.extent_size, profile, self.region_size)

    # -- mutations --------------------------------------------------------------

    def create_volume(
        self, name: str, size: SizeRange, profile: Profile, source: ContentSource | None = None
    ) -> Volume:
        lv_name = names.lv_name_for(name)
        with self._mutation_lock:
            report = self.lvm2.report(self.vg_name)
            existing = report.lv(lv_name)
            if existing is not None:
                lv = self._existing(existing, name, size, profile, source)
                if INCOMPLETE_TAG in lv.tags:
                    return self._populate(report, lv, size, source)
                return self._volume(lv, report)
            self._refuse_degraded(report)
            tags = {names.name_tag(name), *profile_tags(profile)}
            if source is not None:
                source_lv, source_size = self._source_lv(report, source)
                tags |= {content_source_tag(source), INCOMPLETE_TAG}
                size = restore_range(size, source_size)
                if profile.thin and source_lv.is_thin and source_lv.pool_lv == profile.thin_pool:
                    # Thin from thin in the same pool: a writable thin snapshot, grown by _populate if asked.
                    chosen = choose_size(size, report.vg.extent_size, source_size)
                    self._admit_thin(report, report.lv(source_lv.pool_lv), chosen)
                    self.lvm2.lvcreate_snapshot(self.vg_name, lv_name, source_lv.name, writable=True, tags=sorted(tags))
                else:
                    self._create_lv(report, lv_name, size, profile, tuple(sorted(tags)), default=source_size)
                log.info(
                    "created volume %s/%s (%s), %s, from the %s %s", self.vg_name, lv_name, name,
                    capacity_model.describe(profile), source.kind, source.id,
                )
                report = self.lvm2.report(self.vg_name)
                return self._populate(report, self._lv_or_not_found(report, lv_name), size, source)
            chosen = self._create_lv(report, lv_name, size, profile, tuple(sorted(tags)), self.default_size)
        log.info(
            "created volume %s/%s (%s) of %d bytes, %s", self.vg_name, lv_name, name, chosen, capacity_model.describe(profile)
        )
        tags = tuple(sorted(tags))
        return Volume(
            id=lv_name,
            size=chosen,
            device=f"/dev/{self.vg_name}/{lv_name}",
            name=name,
            profile=profile,
            tags=tags,
            attributes={
                "vg": self.vg_name,
                "lv_name": lv_name,
                "segtype": "thin" if profile.thin else profile.layout.value,
                # What lvm2 reports for a freshly created, active, unopened LV.
                "lv_attr": {Layout.LINEAR: "-wi-a-----", Layout.THIN: "Vwi-a-tz--"}.get(profile.layout, "rwi-a-r---"),
                "tags": ",".join(tags),
            },
        )

    def _create_lv(
        self, report: Report, lv_name: str, size: SizeRange, profile: Profile, tags: tuple[str, ...], default: int
    ) -> int:
        """lvcreate an LV of ``profile`` in ``size`` (``default`` when unset); returns its size."""
        extent_size = report.vg.extent_size
        if profile.thin:
            report, pool = self._ensure_pool(report, profile.thin_pool)
            chosen = choose_size(size, extent_size, default)
            self._admit_thin(report, pool, chosen)
            self.lvm2.lvcreate_thin(self.vg_name, lv_name, chosen, pool.name, tags=tags)
            return chosen
        if profile.layout is not Layout.LINEAR and not self.raid_supported():
            raise OutOfRange(
                f"type={profile.layout.value} needs the kernel's dm-raid target, which this node lacks: "
                f"use type=linear or load dm_raid"
            )
        free = report.free_extents_by_pv()
        granularity = capacity_model.granularity_extents(profile, free)
        if granularity is None:
            raise OutOfRange(
                f"a {capacity_model.describe(profile)} volume needs {profile.min_devices} physical volumes "
                f'with free space; volume group "{self.vg_name}" has {sum(1 for n in free.values() if n)}'
            )
        chosen = choose_size(size, granularity * extent_size, default)
        where = capacity_model.placement(free, extent_size, profile, chosen, self.region_size)
        self.lvm2.lvcreate(
            self.vg_name, lv_name, where.extents, layout_args=self._layout_args(profile, where), tags=tags, pvs=where.pvs,
        )
        return where.extents * extent_size

    @staticmethod
    def _layout_args(profile: Profile, where: capacity_model.Placement) -> list[str]:
        if profile.layout is Layout.RAID0:
            args = ["--type", "raid0", "-i", str(where.stripes)]
            if profile.stripe_size is not None:
                args += ["-I", str(profile.stripe_size // 1024)]
            return args
        if profile.layout is Layout.RAID1:
            return ["--type", "raid1", "-m", str(profile.mirrors)]
        return ["--type", "linear"]

    def _existing(
        self, lv: LogicalVolumeInfo, name: str, size: SizeRange, profile: Profile, source: ContentSource | None
    ) -> LogicalVolumeInfo:
        """The existing LV when it is what was asked for (a retried CreateVolume); VolumeExists otherwise."""
        owner = names.name_from_tags(lv.tags)
        if not is_volume(lv) or owner != name:
            whose = f'volume "{owner}"' if owner is not None else "no csilvm volume (it was made by hand)"
            if is_snapshot(lv):
                whose = f'snapshot "{owner}"'
            raise VolumeExists(f'logical volume "{lv.name}" already exists and belongs to {whose}')
        have_source = content_source_of(lv)
        if have_source != source:
            def said(s: ContentSource | None) -> str:
                return f"the {s.kind} {s.id}" if s else "no content source"
            raise VolumeExists(f'volume "{name}" exists with content from {said(have_source)}, not {said(source)}')
        # An incomplete thin restore may still be smaller than asked: _populate grows it.
        if INCOMPLETE_TAG not in lv.tags and not size.admits(lv.size):
            raise VolumeExists(
                f'volume "{name}" exists with {format_size(lv.size)} ({lv.size} bytes), outside the requested '
                f"range required={size.required} limit={size.limit}"
            )
        have = profile_of(lv)
        if have != profile:
            described = capacity_model.describe(have) if have is not None else f"segment type {lv.segtype}"
            raise VolumeExists(
                f'volume "{name}" exists as {described}, not {capacity_model.describe(profile)}'
            )
        return lv

    # -- restores and clones ------------------------------------------------------

    def _source_lv(self, report: Report, source: ContentSource) -> tuple[LogicalVolumeInfo, int]:
        """The LV a restore or clone reads, and the source's size; SourceNotFound when there is none."""
        lv = report.lv(source.id) if is_lv_id(source.id) else None
        if source.kind == ContentSource.SNAPSHOT:
            if lv is None or not is_snapshot(lv):
                raise SourceNotFound(f'no snapshot "{source.id}" in volume group "{self.vg_name}"')
            if lv.snapshot_invalid:
                raise VolumeBusy(f"snapshot {source.id} is invalid (its store failed): it cannot be restored; delete it")
            return lv, self._snapshot(lv).size
        if lv is None or not is_volume(lv):
            raise SourceNotFound(f'no volume "{source.id}" in volume group "{self.vg_name}"')
        if INCOMPLETE_TAG in lv.tags:
            raise VolumeBusy(f"volume {source.id} is itself incomplete (its content is being copied): clone it later")
        return lv, lv.size

    def _populate(
        self, report: Report, lv: LogicalVolumeInfo, size: SizeRange, source: ContentSource | None
    ) -> Volume:
        """Give the incomplete volume ``lv`` its source's content, then mark it complete (the commit point).

        Runs again from the start after a kill: a thin restore is grown to its
        size, a copy is made again (from a new point-in-time source for a clone).
        """
        if source is None:  # tagged incomplete by hand, or by a csilvm older than its tags: nothing to redo
            raise VolumeBusy(f"volume {lv.name} is incomplete and records no source: delete it and create it again")
        source_lv, source_size = self._source_lv(report, source)
        extent_size = report.vg.extent_size
        if lv.is_thin and lv.origin == source_lv.name:
            wanted = choose_size(size, extent_size, source_size)
            if lv.size < wanted:
                self._admit_thin(report, report.lv(lv.pool_lv), wanted - lv.size)
                self.lvm2.lvextend(self.vg_name, lv.name, wanted // extent_size)
        else:
            self._copy_from(report, lv, source_lv, source_size, source.kind == ContentSource.VOLUME)
        self.lvm2.lvchange_tags(self.vg_name, lv.name, delete=[INCOMPLETE_TAG])
        log.info("volume %s/%s now holds the content of %s %s", self.vg_name, lv.name, source.kind, source.id)
        report = self.lvm2.report(self.vg_name)
        return self._volume(self._lv_or_not_found(report, lv.name), report)

    def _copy_from(
        self, report: Report, lv: LogicalVolumeInfo, source_lv: LogicalVolumeInfo, source_size: int, clone: bool
    ) -> None:
        """Copy the source's bytes onto ``lv``: a clone reads a temporary snapshot of its source (a point in
        time), a restore the snapshot itself (activated for the copy when it is a thin one)."""
        read_from = source_lv
        temporary = f"{lv.name}.src"
        if clone:
            if report.lv(temporary) is not None:
                self.lvm2.lvremove(self.vg_name, temporary)  # left by a killed attempt: a new point in time
            cow = None if source_lv.is_thin else cow_extents_for(source_lv.size // report.vg.extent_size)
            self.lvm2.lvcreate_snapshot(self.vg_name, temporary, source_lv.name, cow_extents=cow, tags=[TEMPORARY_TAG])
            report = self.lvm2.report(self.vg_name)
            read_from = self._lv_or_not_found(report, temporary, any_lv=True)
        activated = read_from.is_thin and not read_from.attr.active
        if activated:
            self.lvm2.lvchange_activate(self.vg_name, read_from.name, True)
        try:
            self.copy(read_from.path, lv.path, source_size, target_size=lv.size, target_reads_zeros=lv.is_thin)
        except OSError as exc:
            raise CommandFailed(f"copying {read_from.path} onto {lv.path} failed: {exc}") from None
        finally:
            if clone:
                self.lvm2.lvremove(self.vg_name, temporary)
            elif activated:
                self.lvm2.lvchange_activate(self.vg_name, read_from.name, False)

    # -- thin pools ---------------------------------------------------------------

    def _pool_full(self, pool: LogicalVolumeInfo) -> bool:
        return thin_model.above_high_water(
            pool.data_percent or 0.0, pool.metadata_percent or 0.0, self.thin.full_percent
        )

    def _fill_message(self, pool: LogicalVolumeInfo) -> str:
        return thin_model.fill_message(
            f"{self.vg_name}/{pool.name}", pool.data_percent or 0.0, pool.metadata_percent or 0.0, self.thin.full_percent
        )

    def _new_pool_extents(self, report: Report) -> int | None:
        """Data extents of the pool csilvm would create now; None when it creates none, or it does not fit."""
        if self.thin.pool_size is None:
            return None
        extent_size = report.vg.extent_size
        data = self.thin.pool_size.resolve(report.vg.size) // extent_size
        metadata = thin_pool_metadata_extents(data, extent_size)
        # lvm2 also keeps a spare metadata LV (_pmspare) of the same size, for repairs.
        fits = data > 0 and data + 2 * metadata <= sum(report.free_extents_by_pv().values())
        return data if fits else None

    def _thin_admissible(self, report: Report, pool_name: str) -> int:
        """Bytes of virtual size the pool admits now (a pool not yet created: what it will admit)."""
        pool = report.lv(pool_name)
        ratio = self.thin.overprovision_ratio
        if pool is None:
            data = self._new_pool_extents(report)
            return thin_model.admissible(data * report.vg.extent_size, 0, 0, ratio) if data else 0
        if not pool.is_thin_pool or self._pool_full(pool):
            return 0
        used = int(pool.size * (pool.data_percent or 0.0) / 100)
        virtual = sum(lv.size for lv in report.thin_lvs_of(pool.name))
        return thin_model.admissible(pool.size, used, virtual, ratio)

    def _admit_thin(self, report: Report, pool: LogicalVolumeInfo | None, size: int) -> None:
        """PoolExhausted above the high-water mark; OutOfRange when ``size`` more virtual bytes exceed the bound."""
        if pool is None:
            raise VolumeNotFound(f'the thin pool of volume group "{self.vg_name}" disappeared')
        if self._pool_full(pool):
            raise PoolExhausted(self._fill_message(pool))
        available = self._thin_admissible(report, pool.name)
        if size > available:
            raise OutOfRange(
                f"thin pool {self.vg_name}/{pool.name} admits {available} more bytes of virtual size "
                f"({format_size(pool.size)} of data, overprovision ratio {self.thin.overprovision_ratio:g}, "
                f"{pool.data_percent or 0.0:.2f}% written), not {size}: ask for less, or free or grow the pool"
            )

    def _ensure_pool(self, report: Report, pool_name: str) -> tuple[Report, LogicalVolumeInfo]:
        """The thin pool ``pool_name``, created first (``--thin-pool-size``) when it does not exist."""
        pool = report.lv(pool_name)
        if pool is not None:
            if not pool.is_thin_pool:
                raise InvalidParameters(
                    f'logical volume "{self.vg_name}/{pool_name}" exists and is not a thin pool: '
                    f"name another pool with the parameter pool"
                )
            return report, pool
        if self.thin.pool_size is None:
            raise InvalidParameters(
                f'thin pool "{self.vg_name}/{pool_name}" does not exist, and csilvm creates thin pools only with '
                f"--thin-pool-size: create it (lvcreate --type thin-pool) or set that flag"
            )
        data = self._new_pool_extents(report)
        if data is None:
            raise OutOfRange(
                f'a thin pool of {self.thin.pool_size} (with its metadata and spare) does not fit in the free space '
                f'of volume group "{self.vg_name}"'
            )
        self.lvm2.lvcreate_thin_pool(self.vg_name, pool_name, data, tags=[POOL_TAG])
        log.info("created thin pool %s/%s of %d extents", self.vg_name, pool_name, data)
        report = self.lvm2.report(self.vg_name)
        return report, self._lv_or_not_found(report, pool_name, any_lv=True)

    # -- snapshots ----------------------------------------------------------------

    def _snapshot(self, lv: LogicalVolumeInfo) -> Snapshot:
        size = tag_value(lv.tags, SIZE_TAG_PREFIX)
        created = tag_value(lv.tags, CREATED_TAG_PREFIX)
        return Snapshot(
            id=lv.name,
            source_volume_id=tag_value(lv.tags, SOURCE_TAG_PREFIX) or lv.origin,
            size=int(size) if size and size.isdigit() else lv.size,
            created_ns=int(created) if created and created.isdigit() else 0,
            ready=not lv.snapshot_invalid,
            name=names.name_from_tags(lv.tags),
        )

    def create_snapshot(self, name: str, source_volume_id: str) -> Snapshot:
        lv_name = names.snapshot_lv_name_for(name)
        with self._mutation_lock:
            report = self.lvm2.report(self.vg_name)
            existing = report.lv(lv_name)
            if existing is not None:
                owner = names.name_from_tags(existing.tags)
                if not is_snapshot(existing) or owner != name:
                    raise SnapshotExists(f'logical volume "{lv_name}" already exists and is not snapshot "{name}"')
                snapshot = self._snapshot(existing)
                if snapshot.source_volume_id != source_volume_id:
                    raise SnapshotExists(
                        f'snapshot "{name}" exists, of volume {snapshot.source_volume_id}, not of {source_volume_id}'
                    )
                return snapshot
            source = report.lv(source_volume_id) if is_lv_id(source_volume_id) else None
            if source is None or not is_volume(source):
                raise SourceNotFound(f'no volume "{source_volume_id}" in volume group "{self.vg_name}"')
            if INCOMPLETE_TAG in source.tags:
                raise VolumeBusy(f"volume {source_volume_id} is incomplete (its content is being copied): snapshot it later")
            self._refuse_degraded(report)
            created = time.time_ns()
            source_profile = profile_of(source)
            tags = sorted({
                names.name_tag(name), SNAPSHOT_TAG, f"{SOURCE_TAG_PREFIX}{source.name}",
                f"{SIZE_TAG_PREFIX}{source.size}", f"{CREATED_TAG_PREFIX}{created}",
                *(profile_tags(source_profile) if source_profile is not None else ()),
            })
            if source.is_thin:
                pool = report.lv(source.pool_lv)
                if pool is not None and self._pool_full(pool):
                    raise PoolExhausted(self._fill_message(pool))
                self.lvm2.lvcreate_snapshot(self.vg_name, lv_name, source.name, tags=tags)
            else:
                cow = cow_extents_for(source.size // report.vg.extent_size)
                self.lvm2.lvcreate_snapshot(self.vg_name, lv_name, source.name, cow_extents=cow, tags=tags)
            log.info("snapshot %s/%s of %s taken", self.vg_name, lv_name, source.name)
            return Snapshot(lv_name, source.name, source.size, created, True, name)

    def delete_snapshot(self, snapshot_id: str) -> None:
        if not is_lv_id(snapshot_id):
            return
        with self._mutation_lock:
            report = self.lvm2.report(self.vg_name)
            lv = report.lv(snapshot_id)
            if lv is None or not is_snapshot(lv):
                return
            if lv.attr.device_open:
                raise VolumeBusy(f"snapshot {snapshot_id} is open (a restore is reading it): try again when it is done")
            try:
                self.lvm2.lvremove(self.vg_name, snapshot_id)
            except VolumeNotFound:
                pass

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        report = self.lvm2.report(self.vg_name)
        lv = report.lv(snapshot_id) if is_lv_id(snapshot_id) else None
        if lv is None or not is_snapshot(lv):
            raise SnapshotNotFound(f'no snapshot "{snapshot_id}" in volume group "{self.vg_name}"')
        return self._snapshot(lv)

    def list_snapshots(self) -> list[Snapshot]:
        report = self.lvm2.report(self.vg_name)
        return [self._snapshot(lv) for lv in report.lvs if is_snapshot(lv)]

    def delete_volume(self, volume_id: str) -> None:
        if not is_lv_id(volume_id):
            return  # cannot name an LV, so there is nothing to delete
        with self._mutation_lock:
            report = self.lvm2.report(self.vg_name)
            lv = report.lv(volume_id)
            if lv is None or not is_volume(lv):
                return  # a snapshot or a pool is not a volume: DeleteVolume never removes one
            self._refuse_degraded(report)
            if lv.attr.device_open:
                raise VolumeBusy(
                    f'logical volume "{self.vg_name}/{volume_id}" is open (mounted or in use); unpublish it first'
                )
            snapshots = report.cow_snapshots_of(volume_id)
            if snapshots:
                raise VolumeHasSnapshots(
                    f"volume {volume_id} has snapshot(s) {', '.join(sorted(s.name for s in snapshots))}, which are "
                    f"copy-on-write snapshots of a thick volume and would go with it: delete them first"
                )
            if lv.is_thin:
                pass  # a thin LV's blocks return to the pool, which zeroes them before any reuse
            elif lv.attr.active:
                try:
                    self.wipe(lv.path)
                except OSError as exc:
                    raise CommandFailed(f"could not wipe {lv.path} before removing it: {exc}") from None
            else:
                log.warning("not wiping inactive logical volume %s/%s (no device node)", self.vg_name, volume_id)
            try:
                self.lvm2.lvremove(self.vg_name, volume_id)
            except VolumeNotFound:
                return  # removed by someone else since the report: the outcome asked for
            have = profile_of(lv)
            log.info(
                "deleted volume %s/%s (%s) of %d bytes, %s", self.vg_name, volume_id, names.name_from_tags(lv.tags),
                lv.size, capacity_model.describe(have) if have else f"segment type {lv.segtype}",
            )

    def _refuse_degraded(self, report: Report) -> None:
        message = missing_pvs_message(self.vg_name, report)
        if message:
            raise VolumeGroupDegraded(message)

    def _lv_or_not_found(self, report: Report, volume_id: str, *, any_lv: bool = False) -> LogicalVolumeInfo:
        """The volume's LV (with ``any_lv``, any LV of that name); VolumeNotFound otherwise."""
        lv = report.lv(volume_id) if is_lv_id(volume_id) else None
        if lv is None or not (any_lv or is_volume(lv)):
            raise VolumeNotFound(f'no logical volume "{volume_id}" in volume group "{self.vg_name}"')
        return lv

    def volume_condition(self, volume_id: str) -> Condition:
        return self.get_volume(volume_id).condition

    def expand_volume(self, volume_id: str, size: SizeRange) -> int:
        with self._mutation_lock:
            report = self.lvm2.report(self.vg_name)
            lv = self._lv_or_not_found(report, volume_id)
            profile = derived_profile(lv)
            if profile is None:
                raise InvalidParameters(
                    f'logical volume "{self.vg_name}/{volume_id}" mixes segment types ({", ".join(lv.segtypes)}): '
                    f"csilvm grows only linear, striped, raid0, raid1 and thin volumes; grow it with lvextend by hand"
                )
            extent_size = report.vg.extent_size
            if profile.thin:
                target = expansion_target(lv.size, size, extent_size)
                if target == lv.size:
                    return lv.size
                self._refuse_degraded(report)
                self._admit_thin(report, report.lv(lv.pool_lv), target - lv.size)
                self.lvm2.lvextend(self.vg_name, volume_id, target // extent_size)
                log.info("grew thin volume %s/%s from %d to %d bytes", self.vg_name, volume_id, lv.size, target)
                return target
            snapshots = report.cow_snapshots_of(volume_id)
            if snapshots and size.required > lv.size:
                raise VolumeHasSnapshots(
                    f"volume {volume_id} has snapshot(s) {', '.join(sorted(s.name for s in snapshots))}: lvm2 does not "
                    f"grow an active thick volume that has copy-on-write snapshots; delete them (restoring them "
                    f"into new volumes first if they are needed), then grow it"
                )
            granularity = len(lv.legs) if profile.layout is Layout.RAID0 else 1
            target = expansion_target(lv.size, size, granularity * extent_size)
            if target == lv.size:
                return lv.size
            self._refuse_degraded(report)
            current, wanted = lv.size // extent_size, target // extent_size
            pvs = capacity_model.extension_pvs(
                profile, lv.legs, report.free_extents_by_pv(), current, wanted, extent_size,
                lv.region_size or self.region_size,
            )
            self.lvm2.lvextend(self.vg_name, volume_id, wanted, pvs=pvs)
            log.info("grew logical volume %s/%s from %d to %d bytes", self.vg_name, volume_id, lv.size, target)
            return target

    def modify_volume(self, volume_id: str, parameters: Mapping[str, str]) -> Volume:
        with self._mutation_lock:
            report = self.lvm2.report(self.vg_name)
            lv = self._lv_or_not_found(report, volume_id)
            have = profile_of(lv)
            if have is None:
                raise InvalidParameters(
                    f'logical volume "{self.vg_name}/{volume_id}" has a layout csilvm does not manage '
                    f"({', '.join(lv.segtypes)}): change it with lvconvert by hand"
                )
            merged = {**have.as_parameters(), **parameters}
            if "type" in parameters and parameters["type"] != have.layout.value:
                merged = dict(parameters)  # a new type starts from that type's defaults
            want = parse_profile(merged)
            self._check_changeable(volume_id, have, want)
            if want != have:
                self._refuse_degraded(report)
                if want.mirrors != have.mirrors or want.layout is not have.layout:
                    pvs = capacity_model.mirror_change_pvs(
                        lv.legs, report.free_extents_by_pv(), lv.size // report.vg.extent_size, want.mirrors,
                        report.vg.extent_size, lv.region_size or self.region_size,
                        has_metadata=have.layout is Layout.RAID1,
                    )
                    self.lvm2.lvconvert_mirrors(self.vg_name, volume_id, want.mirrors, pvs=pvs)
                    log.info(
                        "changed logical volume %s/%s from %s to %s", self.vg_name, volume_id,
                        capacity_model.describe(have), capacity_model.describe(want),
                    )
            old_tags = {t for t in lv.tags if t.startswith(PROFILE_TAG_PREFIX)}
            new_tags = set(profile_tags(want))
            self.lvm2.lvchange_tags(
                self.vg_name, volume_id, add=sorted(new_tags - old_tags), delete=sorted(old_tags - new_tags)
            )
            report = self.lvm2.report(self.vg_name)
            return self._volume(self._lv_or_not_found(report, volume_id), report)

    def _check_changeable(self, volume_id: str, have: Profile, want: Profile) -> None:
        """InvalidParameters with the reason when ``have`` cannot become ``want`` in place."""
        if want == have:
            return
        mirrored = (Layout.LINEAR, Layout.RAID1)
        if have.layout in mirrored and want.layout in mirrored:
            return
        raise InvalidParameters(
            f"volume {volume_id} cannot change from {capacity_model.describe(have)} to "
            f"{capacity_model.describe(want)} in place: only the number of raid1 mirrors changes online "
            f"(type=linear <-> type=raid1 with mirrors=N); raid0 stripes are fixed at creation — "
            f"create a new volume with the layout you want and copy the data"
        )
