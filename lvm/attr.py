"""The 10-character ``lv_attr`` of lvm2 reports, parsed into a typed value.

See lvs(8), "lv_attr bits".  Characters lvm2 may add in later releases parse
to an ``OTHER`` member rather than failing: a report must never become
unreadable because of a new state letter.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class _CharEnum(str, enum.Enum):
    """An enum keyed by one lv_attr character; unknown characters map to OTHER."""

    @classmethod
    def _missing_(cls, value: object) -> _CharEnum:
        return cls["OTHER"]  # type: ignore[return-value]


class VolumeType(_CharEnum):
    PLAIN = "-"
    CACHE = "C"
    MIRRORED = "m"
    MIRRORED_NOSYNC = "M"
    ORIGIN = "o"
    ORIGIN_MERGING = "O"
    RAID = "r"
    RAID_NOSYNC = "R"
    SNAPSHOT = "s"
    SNAPSHOT_MERGING = "S"
    PVMOVE = "p"
    VIRTUAL = "v"
    IMAGE = "i"
    IMAGE_OUT_OF_SYNC = "I"
    MIRROR_LOG = "l"
    CONVERTING = "c"
    THIN_VOLUME = "V"
    THIN_POOL = "t"
    THIN_POOL_DATA = "T"
    VDO_POOL = "d"
    VDO_POOL_DATA = "D"
    METADATA = "e"
    OTHER = "?"


class Permissions(_CharEnum):
    WRITEABLE = "w"
    READ_ONLY = "r"
    READ_ONLY_ACTIVATION = "R"  # a writeable LV activated read-only
    UNKNOWN = "-"
    OTHER = "?"


class AllocationPolicy(_CharEnum):
    ANYWHERE = "a"
    CONTIGUOUS = "c"
    INHERIT = "i"
    CLING = "l"
    NORMAL = "n"
    OTHER = "?"


class State(_CharEnum):
    INACTIVE = "-"
    ACTIVE = "a"
    HISTORICAL = "h"
    SUSPENDED = "s"
    INVALID_SNAPSHOT = "I"
    INVALID_SUSPENDED_SNAPSHOT = "S"
    SNAPSHOT_MERGE_FAILED = "m"
    SUSPENDED_SNAPSHOT_MERGE_FAILED = "M"
    DEVICE_WITHOUT_TABLES = "d"
    DEVICE_WITH_INACTIVE_TABLE = "i"
    THIN_POOL_CHECK_NEEDED = "c"
    SUSPENDED_THIN_POOL_CHECK_NEEDED = "C"
    UNKNOWN = "X"  # lvm2 could not ask device-mapper
    OTHER = "?"


class TargetType(_CharEnum):
    NORMAL = "-"
    CACHE = "C"
    MIRROR = "m"
    RAID = "r"
    SNAPSHOT = "s"
    THIN = "t"
    UNKNOWN = "u"
    VIRTUAL = "v"
    VDO = "V"
    OTHER = "?"


class Health(_CharEnum):
    OK = "-"
    PARTIAL = "p"
    REFRESH_NEEDED = "r"
    MISMATCHES = "m"
    WRITEMOSTLY = "w"
    ERROR = "E"
    FAILED = "F"
    OUT_OF_DATA_SPACE = "D"
    METADATA_READ_ONLY = "M"
    UNKNOWN = "X"
    OTHER = "?"


@dataclass(frozen=True)
class LvAttr:
    """``lv_attr`` as values.  ``device_open`` is None when lvm2 could not tell (``X``)."""

    raw: str
    volume_type: VolumeType
    permissions: Permissions
    allocation_policy: AllocationPolicy
    allocation_locked: bool
    fixed_minor: bool
    state: State
    device_open: bool | None
    target_type: TargetType
    zero: bool
    health: Health
    skip_activation: bool

    @property
    def active(self) -> bool:
        return self.state is State.ACTIVE

    def __str__(self) -> str:
        return self.raw


def parse_lv_attr(text: str) -> LvAttr:
    """Parse the 10 ``lv_attr`` characters; raises ValueError on any other length."""
    if len(text) != 10:
        raise ValueError(f"lv_attr must have 10 characters, got {text!r}")
    policy = text[2]
    return LvAttr(
        raw=text,
        volume_type=VolumeType(text[0]),
        permissions=Permissions(text[1]),
        allocation_policy=AllocationPolicy(policy.lower()),
        allocation_locked=policy.isupper(),
        fixed_minor=text[3] == "m",
        state=State(text[4]),
        device_open=None if text[5] == "X" else text[5] == "o",
        target_type=TargetType(text[6]),
        zero=text[7] == "z",
        health=Health(text[8]),
        skip_activation=text[9] == "k",
    )
