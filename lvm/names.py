"""Mapping between CSI volume names and LVM logical volume names and tags.

A CO may name a volume anything (Kubernetes: ``pvc-<uuid>``, Mesos: a UUID,
other COs: any UTF-8).  LVM allows ``[A-Za-z0-9+_.-]``, no leading ``-``, no
reserved names or suffixes.  The mapping is deterministic, so a retried
CreateVolume finds the same LV; the exact CO name is also kept in a tag, which
settles the rare collision of two names that map to the same LV name.
"""

from __future__ import annotations

import hashlib
import re
from typing import Iterable

# lvm2 accepts 127 characters, but raid sub-LVs append "_rimage_NN" and
# device-mapper names join "<vg>-<lv>": keep room for both.
MAX_LV_NAME = 96
NAME_TAG_PREFIX = "csilvm.name."

_VALID = re.compile(r"^[A-Za-z0-9+_.][A-Za-z0-9+_.-]*$")
_INVALID_CHAR = re.compile(r"[^A-Za-z0-9+_.-]")
_RESERVED_NAMES = {".", "..", "snapshot", "pvmove"}
_RESERVED_PREFIXES = ("snapshot", "pvmove")
_RESERVED_SUBSTRINGS = (
    "_cdata", "_cmeta", "_corig", "_cpool", "_cvol", "_imeta", "_iorig", "_mimage", "_mlog",
    "_pmspare", "_rimage", "_rmeta", "_tdata", "_tmeta", "_vdata", "_vorigin", "_wcorig",
)
_TAG_SAFE = re.compile(r"[A-Za-z0-9_.-]")


def is_valid_lv_name(name: str) -> bool:
    """True when lvm2 accepts ``name`` as an LV name and it leaves room for raid sub-LVs."""
    return (
        0 < len(name) <= MAX_LV_NAME
        and bool(_VALID.match(name))
        and name not in _RESERVED_NAMES
        and not name.startswith(_RESERVED_PREFIXES)
        and not any(s in name for s in _RESERVED_SUBSTRINGS)
    )


def lv_name_for(co_name: str) -> str:
    """The LV name for a CO volume name: itself when valid, else a sanitized name with a hash."""
    if is_valid_lv_name(co_name):
        return co_name
    digest = hashlib.sha256(co_name.encode("utf-8")).hexdigest()[:12]
    base = _INVALID_CHAR.sub("_", co_name)
    for reserved in _RESERVED_SUBSTRINGS:
        base = base.replace(reserved, reserved.replace("_", "-", 1))
    base = base.lstrip("-.") or "vol"
    if base.startswith(_RESERVED_PREFIXES):
        base = "v" + base
    return f"{base[: MAX_LV_NAME - len(digest) - 1]}-{digest}"


SNAPSHOT_PREFIX = "snap."


def snapshot_lv_name_for(co_name: str) -> str:
    """The LV name of a CSI snapshot: ``snap.`` and the CO's name, mapped like a volume's name.

    (Kubernetes names snapshots ``snapshot-<uuid>``, and lvm2 reserves names
    beginning with "snapshot"; the prefix also keeps snapshots apart from volumes.)
    """
    return lv_name_for(SNAPSHOT_PREFIX + co_name)


def name_tag(co_name: str) -> str:
    """The LV tag that records the CO's name, escaped to lvm2's tag alphabet (``+XX`` per byte)."""
    escaped = "".join(
        ch if _TAG_SAFE.fullmatch(ch) else "".join(f"+{b:02X}" for b in ch.encode("utf-8"))
        for ch in co_name
    )
    return NAME_TAG_PREFIX + escaped


def name_from_tags(tags: Iterable[str]) -> str | None:
    """The CO name recorded by :func:`name_tag`, or None for an LV csilvm did not create."""
    for tag in tags:
        if tag.startswith(NAME_TAG_PREFIX):
            return _unescape(tag[len(NAME_TAG_PREFIX):])
    return None


def _unescape(text: str) -> str:
    out = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "+" and re.fullmatch(r"[0-9A-F]{2}", text[i + 1:i + 3]):
            out.append(int(text[i + 1:i + 3], 16))
            i += 3
        else:
            out += text[i].encode("utf-8")
            i += 1
    return out.decode("utf-8", errors="replace")
