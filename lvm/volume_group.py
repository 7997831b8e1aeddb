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
from typing import Callable, Mapping, Sequence

from lvm import capacity as capacity_model
from lvm import names
from lvm.attr import Health, State
from lvm.backend import Capacity, Condition, SizeRange, Volume, choose_size, expansion_target
from lvm.errors import (
    BackendUnavailable,
    CommandFailed,
    InvalidParameters,
    OutOfRange,
    StorageError,
    VolumeBusy,
    VolumeExists,
    VolumeGroupDegraded,
    VolumeNotFound,
)
from lvm.lvm2 import Lvm2, VolumeGroupNotFound
from lvm.profiles import Layout, Profile, parse_profile
from lvm.report import LogicalVolumeInfo, Report
from lvm.single_flight import SingleFlight
from lvm.units import GiB, MiB, format_size

log = logging.getLogger(__name__)

VG_TAG = "csilvm"
PROFILE_TAG_PREFIX = "csilvm.profile."
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
        return Profile()
    except ValueError:
        return None


def derived_profile(lv: LogicalVolumeInfo) -> Profile | None:
    """The profile an LV's segments amount to, for LVs csilvm did not tag."""
    if len(set(lv.segtypes)) > 1:
        return None
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


class LvmBackend:
    """A Backend over one LVM volume group; see lvm/backend.py for the contract."""

    kind = "lvm"

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
    ):
        self.vg_name = vg_name
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
            condition=lv_condition(self.vg_name, lv, report),
        )

    def list_volumes(self) -> list[Volume]:
        report = self.lvm2.report(self.vg_name)
        return sorted((self._volume(lv, report) for lv in report.lvs), key=lambda v: v.id)

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
        if profile.layout is not Layout.LINEAR and not self.raid_supported():
            return Capacity.none()
        return capacity_model.capacity(report.free_extents_by_pv(), report.vg.extent_size, profile, self.region_size)

    # -- mutations --------------------------------------------------------------

    def create_volume(self, name: str, size: SizeRange, profile: Profile) -> Volume:
        lv_name = names.lv_name_for(name)
        with self._mutation_lock:
            report = self.lvm2.report(self.vg_name)
            existing = report.lv(lv_name)
            if existing is not None:
                return self._existing(existing, report, name, size, profile)
            self._refuse_degraded(report)
            if profile.layout is not Layout.LINEAR and not self.raid_supported():
                raise OutOfRange(
                    f"type={profile.layout.value} needs the kernel's dm-raid target, which this node lacks: "
                    f"use type=linear or load dm_raid"
                )
            free = report.free_extents_by_pv()
            extent_size = report.vg.extent_size
            granularity = capacity_model.granularity_extents(profile, free)
            if granularity is None:
                raise OutOfRange(
                    f"a {capacity_model.describe(profile)} volume needs {profile.min_devices} physical volumes "
                    f'with free space; volume group "{self.vg_name}" has {sum(1 for n in free.values() if n)}'
                )
            chosen = choose_size(size, granularity * extent_size, self.default_size)
            where = capacity_model.placement(free, extent_size, profile, chosen, self.region_size)
            tags = tuple(sorted({names.name_tag(name), *profile_tags(profile)}))
            self.lvm2.lvcreate(
                self.vg_name, lv_name, where.extents, layout_args=self._layout_args(profile, where),
                tags=tags, pvs=where.pvs,
            )
        segtype = profile.layout.value
        return Volume(
            id=lv_name,
            size=where.extents * extent_size,
            device=f"/dev/{self.vg_name}/{lv_name}",
            name=name,
            profile=profile,
            tags=tags,
            attributes={
                "vg": self.vg_name,
                "lv_name": lv_name,
                "segtype": segtype,
                # What lvm2 reports for a freshly created, active, unopened LV.
                "lv_attr": "rwi-a-r---" if profile.layout is not Layout.LINEAR else "-wi-a-----",
                "tags": ",".join(tags),
            },
        )

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

    def _existing(self, lv: LogicalVolumeInfo, report: Report, name: str, size: SizeRange, profile: Profile) -> Volume:
        """The existing LV when it is what was asked for (a retried CreateVolume); VolumeExists otherwise."""
        owner = names.name_from_tags(lv.tags)
        if owner != name:
            whose = f'volume "{owner}"' if owner is not None else "no csilvm volume (it was made by hand)"
            raise VolumeExists(f'logical volume "{lv.name}" already exists and belongs to {whose}')
        if not size.admits(lv.size):
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
        return self._volume(lv, report)

    def delete_volume(self, volume_id: str) -> None:
        if not is_lv_id(volume_id):
            return  # cannot name an LV, so there is nothing to delete
        with self._mutation_lock:
            report = self.lvm2.report(self.vg_name)
            lv = report.lv(volume_id)
            if lv is None:
                return
            self._refuse_degraded(report)
            if lv.attr.device_open:
                raise VolumeBusy(
                    f'logical volume "{self.vg_name}/{volume_id}" is open (mounted or in use); unpublish it first'
                )
            if lv.attr.active:
                try:
                    self.wipe(lv.path)
                except OSError as exc:
                    raise CommandFailed(f"could not wipe {lv.path} before removing it: {exc}") from None
            else:
                log.warning("not wiping inactive logical volume %s/%s (no device node)", self.vg_name, volume_id)
            try:
                self.lvm2.lvremove(self.vg_name, volume_id)
            except VolumeNotFound:
                pass  # removed by someone else since the report: the outcome asked for

    def _refuse_degraded(self, report: Report) -> None:
        message = missing_pvs_message(self.vg_name, report)
        if message:
            raise VolumeGroupDegraded(message)

    def _lv_or_not_found(self, report: Report, volume_id: str) -> LogicalVolumeInfo:
        lv = report.lv(volume_id) if is_lv_id(volume_id) else None
        if lv is None:
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
                    f"csilvm grows only linear, striped, raid0 and raid1 volumes; grow it with lvextend by hand"
                )
            extent_size = report.vg.extent_size
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
