"""A typed snapshot of one volume group, parsed from ``lvm fullreport`` JSON.

``lvm fullreport --reportformat json --units b --nosuffix <vg>`` prints every
field as a string; sizes are bytes.  One call gives the VG, its PVs, its
visible LVs and their segments, so every read RPC costs one lvm2 process
whatever the number of volumes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from lvm.attr import LvAttr, parse_lv_attr
from lvm.errors import BackendUnavailable, CommandFailed

_HIDDEN_MARKERS = ("_rimage_", "_rmeta_", "_mimage_", "_mlog", "_tmeta", "_tdata", "_cdata", "_cmeta", "_vdata")


@dataclass(frozen=True)
class VolumeGroupInfo:
    name: str
    uuid: str
    extent_size: int  # bytes
    extent_count: int
    free_count: int
    tags: tuple[str, ...]

    @property
    def size(self) -> int:
        return self.extent_size * self.extent_count

    @property
    def free(self) -> int:
        return self.extent_size * self.free_count


@dataclass(frozen=True)
class PhysicalVolumeInfo:
    name: str  # the device path lvm2 uses, e.g. /dev/loop0 ("[unknown]" when missing)
    uuid: str
    size: int  # bytes usable for extents
    extent_count: int
    free_extents: int
    allocatable: bool
    missing: bool
    tags: tuple[str, ...]

    @property
    def path(self) -> str:
        return self.name


@dataclass(frozen=True)
class LogicalVolumeInfo:
    """A visible LV.  ``segtype``/``stripes``/... describe its first segment;
    ``segtypes`` lists every segment's type (hand-made LVs may mix them)."""

    vg_name: str
    name: str
    uuid: str
    size: int  # bytes
    segtype: str
    segtypes: tuple[str, ...]
    stripes: int
    stripe_size: int  # bytes, 0 when not striped
    data_copies: int
    region_size: int  # bytes, 0 when not raid/mirror
    tags: tuple[str, ...]
    attr: LvAttr
    # The PVs of each leg: a raid image with its metadata, a stripe, or (linear) the whole LV.
    legs: tuple[tuple[str, ...], ...] = ()
    sync_percent: float | None = None  # raid/mirror: how much of the copies is in sync (None: n/a)
    sync_action: str = ""  # raid: idle, resync, recover, check, repair, frozen, reshape
    mismatches: int = 0  # raid: mismatches found by the last check
    images_out_of_sync: tuple[str, ...] = ()  # raid images lvm2 marks out of sync ("I")
    origin: str = ""  # a snapshot's (COW or thin) origin LV
    pool_lv: str = ""  # a thin LV's pool
    data_percent: float | None = None  # thin pool / thin LV: data fill; COW snapshot: COW fill
    metadata_percent: float | None = None  # thin pool: metadata fill
    snapshot_invalid: bool = False  # a COW snapshot that overflowed or failed: its data is gone
    roles: tuple[str, ...] = ()  # lv_role: public, origin, thickorigin, snapshot, thicksnapshot, thinsnapshot...

    @property
    def is_thin_pool(self) -> bool:
        return self.segtype == "thin-pool"

    @property
    def is_thin(self) -> bool:
        return self.segtype == "thin"

    @property
    def is_cow_snapshot(self) -> bool:
        """A thick (copy-on-write) snapshot: its own segments are linear, its role says what it is."""
        return "thicksnapshot" in self.roles

    @property
    def pvs(self) -> tuple[str, ...]:
        """Every PV holding a part of this LV, in order of first appearance."""
        return tuple(dict.fromkeys(pv for leg in self.legs for pv in leg))

    @property
    def path(self) -> str:
        return f"/dev/{self.vg_name}/{self.name}"

    @property
    def mirrors(self) -> int:
        """Extra copies of the data (raid1 with ``-m 1`` has one mirror)."""
        return max(self.data_copies - 1, 0)


@dataclass(frozen=True)
class Report:
    vg: VolumeGroupInfo
    pvs: tuple[PhysicalVolumeInfo, ...]
    lvs: tuple[LogicalVolumeInfo, ...]  # visible LVs only, sorted by name

    def lv(self, name: str) -> LogicalVolumeInfo | None:
        for lv in self.lvs:
            if lv.name == name:
                return lv
        return None

    def thin_lvs_of(self, pool: str) -> list[LogicalVolumeInfo]:
        return [lv for lv in self.lvs if lv.is_thin and lv.pool_lv == pool]

    def cow_snapshots_of(self, origin: str) -> list[LogicalVolumeInfo]:
        return [lv for lv in self.lvs if lv.is_cow_snapshot and lv.origin == origin]

    def free_extents_by_pv(self) -> dict[str, int]:
        """Free extents of each PV that new extents may go to (allocatable, present)."""
        return {pv.name: pv.free_extents for pv in self.pvs if pv.allocatable and not pv.missing}


def is_hidden_lv_name(name: str) -> bool:
    """Internal sub-LVs (raid images and metadata, pool parts) are never volumes."""
    return name.startswith("[") or any(marker in name for marker in _HIDDEN_MARKERS)


def _tags(text: str) -> tuple[str, ...]:
    return tuple(sorted(t for t in text.split(",") if t))


def _int(record: Mapping[str, Any], key: str, default: int = 0) -> int:
    text = record.get(key, "")
    if text in ("", None):
        return default
    return int(text)


def parse_fullreport(json_text: str, vg_name: str) -> Report:
    """Parse ``lvm fullreport`` JSON and return the snapshot of ``vg_name``.

    Raises BackendUnavailable when the VG is not in the report and
    CommandFailed when the text is not a fullreport.
    """
    try:
        document = json.loads(json_text)
        entries = document["report"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CommandFailed(f"lvm fullreport printed unparseable output ({exc}): {json_text[:200]!r}") from None
    for entry in entries:
        vgs = entry.get("vg") or []
        if vgs and vgs[0].get("vg_name") == vg_name:
            try:
                return _parse_entry(entry, vg_name)
            except (KeyError, ValueError, TypeError) as exc:
                raise CommandFailed(f"lvm fullreport of {vg_name} has an unexpected shape: {exc!r}") from None
    raise BackendUnavailable(f'volume group "{vg_name}" not found by lvm fullreport')


def _parse_entry(entry: Mapping[str, Any], vg_name: str) -> Report:
    vg_record = entry["vg"][0]
    vg = VolumeGroupInfo(
        name=vg_record["vg_name"],
        uuid=vg_record["vg_uuid"],
        extent_size=_int(vg_record, "vg_extent_size"),
        extent_count=_int(vg_record, "vg_extent_count"),
        free_count=_int(vg_record, "vg_free_count"),
        tags=_tags(vg_record.get("vg_tags", "")),
    )
    pvs = tuple(
        PhysicalVolumeInfo(
            name=pv["pv_name"],
            uuid=pv["pv_uuid"],
            size=_int(pv, "pv_size"),
            extent_count=_int(pv, "pv_pe_count"),
            free_extents=_int(pv, "pv_pe_count") - _int(pv, "pv_pe_alloc_count"),
            allocatable=pv.get("pv_allocatable") == "allocatable",
            missing=pv.get("pv_missing") == "missing" or pv["pv_name"] == "[unknown]",
            tags=_tags(pv.get("pv_tags", "")),
        )
        for pv in entry.get("pv") or []
    )
    segments_by_lv: dict[str, list[Mapping[str, Any]]] = {}
    for seg in entry.get("seg") or []:
        segments_by_lv.setdefault(seg["lv_uuid"], []).append(seg)
    records = entry.get("lv") or []
    segments_by_name = {
        record["lv_name"].strip("[]"): sorted(segments_by_lv.get(record["lv_uuid"], []), key=lambda s: _int(s, "seg_start"))
        for record in records
    }
    attr_by_name = {record["lv_name"].strip("[]"): record.get("lv_attr", "") for record in records}
    def listed(record: Mapping[str, Any]) -> bool:
        """Visible LVs, and thin pools (lvm2 calls them private, but they are named and csilvm needs them)."""
        if is_hidden_lv_name(record["lv_name"]):
            return False
        segments = segments_by_name.get(record["lv_name"], [])
        return "private" not in record.get("lv_role", "").split(",") or (
            bool(segments) and segments[0].get("segtype") == "thin-pool"
        )

    lvs = [_parse_lv(vg_name, record, segments_by_name, attr_by_name) for record in records if listed(record)]
    return Report(vg=vg, pvs=pvs, lvs=tuple(sorted(lvs, key=lambda lv: lv.name)))


def _devices(text: str) -> list[str]:
    """``/dev/loop0(11),r1_rimage_0(0)`` -> ``["/dev/loop0", "r1_rimage_0"]``."""
    return [item.rsplit("(", 1)[0] for item in text.split(",") if item]


def _pvs_under(name: str, segments_by_name: Mapping[str, list[Mapping[str, Any]]], depth: int = 0) -> list[str]:
    """The PVs holding LV (or sub-LV) ``name``, following sub-LVs down."""
    found: list[str] = []
    for seg in segments_by_name.get(name, []):
        for device in _devices(seg.get("devices", "")) + _devices(seg.get("metadata_devices", "")):
            if device in segments_by_name and depth < 8:
                found += _pvs_under(device, segments_by_name, depth + 1)
            else:
                found.append(device)
    return list(dict.fromkeys(found))


def _legs(name: str, segments: list[Mapping[str, Any]], segments_by_name: Mapping[str, list[Mapping[str, Any]]]) -> tuple[tuple[str, ...], ...]:
    """The PVs of each leg: per raid image (with its rmeta), per stripe, or one leg for the rest."""
    if not segments:
        return ()
    first = segments[0]
    images = _devices(first.get("devices", ""))
    if images and all(image in segments_by_name for image in images):  # raid: sub-LVs
        metas = _devices(first.get("metadata_devices", ""))
        legs = []
        for i, image in enumerate(images):
            pvs = _pvs_under(image, segments_by_name)
            if i < len(metas):
                pvs += _pvs_under(metas[i], segments_by_name)
            legs.append(tuple(dict.fromkeys(pvs)))
        return tuple(legs)
    if first.get("segtype") == "striped" and _int(first, "stripes", 1) > 1:
        stripes: dict[int, list[str]] = {}
        for seg in segments:
            for i, device in enumerate(_devices(seg.get("devices", ""))):
                stripes.setdefault(i, []).append(device)
        return tuple(tuple(dict.fromkeys(stripes[i])) for i in sorted(stripes))
    return (tuple(_pvs_under(name, segments_by_name)),)


def _percent(text: str | None) -> float | None:
    try:
        return float(text) if text not in ("", None) else None
    except ValueError:
        return None


def _parse_lv(
    vg_name: str,
    record: Mapping[str, Any],
    segments_by_name: Mapping[str, list[Mapping[str, Any]]],
    attr_by_name: Mapping[str, str],
) -> LogicalVolumeInfo:
    name = record["lv_name"]
    segments = segments_by_name.get(name, [])
    first: Mapping[str, Any] = segments[0] if segments else {}
    images = _devices(first.get("devices", ""))
    return LogicalVolumeInfo(
        vg_name=vg_name,
        name=record["lv_name"],
        uuid=record["lv_uuid"],
        size=_int(record, "lv_size"),
        segtype=first.get("segtype", ""),
        segtypes=tuple(s.get("segtype", "") for s in segments),
        stripes=_int(first, "stripes", 1),
        stripe_size=_int(first, "stripe_size"),
        data_copies=_int(first, "data_copies", 1),
        region_size=_int(first, "region_size"),
        tags=_tags(record.get("lv_tags", "")),
        attr=parse_lv_attr(record["lv_attr"]),
        legs=_legs(name, segments, segments_by_name),
        sync_percent=_percent(record.get("sync_percent")),
        sync_action=record.get("raid_sync_action", "") or "",
        mismatches=_int(record, "raid_mismatch_count"),
        images_out_of_sync=tuple(i for i in images if attr_by_name.get(i, "")[:1] == "I"),
        origin=(record.get("origin") or "").strip("[]"),
        pool_lv=(record.get("pool_lv") or "").strip("[]"),
        data_percent=_percent(record.get("data_percent")),
        metadata_percent=_percent(record.get("metadata_percent")),
        snapshot_invalid=record.get("lv_snapshot_invalid") == "snapshot invalid",
        roles=tuple(r for r in (record.get("lv_role") or "").split(",") if r),
    )
