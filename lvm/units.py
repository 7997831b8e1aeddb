"""Byte sizes: parsing operator input (``2GiB``, ``500M``, ``1048576``) and printing them."""

from __future__ import annotations

import re

from lvm.errors import InvalidParameters

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

_BINARY = {"": 1, "b": 1, "k": KiB, "kib": KiB, "m": MiB, "mib": MiB, "g": GiB, "gib": GiB, "t": TiB, "tib": TiB}
_DECIMAL = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int, *, decimal_units: bool = True) -> int:
    """Parse a size in bytes.

    ``K``, ``M``, ``G``, ``T`` and ``KiB`` ... ``TiB`` are powers of 1024.
    ``KB`` ... ``TB`` are powers of 1000, unless ``decimal_units`` is false
    (Mesos' own flag parsing, where ``2GB`` means 2 GiB).
    """
    if isinstance(text, int):
        if text < 0:
            raise InvalidParameters(f"size must not be negative: {text}")
        return text
    match = _SIZE.match(text)
    if not match:
        raise InvalidParameters(f"not a size: {text!r} (use bytes or a unit such as 512MiB, 2GiB)")
    number, unit = int(match.group(1)), match.group(2).lower()
    if unit in _BINARY:
        return number * _BINARY[unit]
    if unit in _DECIMAL:
        return number * (_DECIMAL[unit] if decimal_units else _BINARY[unit[0]])
    raise InvalidParameters(f"unknown size unit {match.group(2)!r} in {text!r} (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")


def format_size(size: int) -> str:
    """The shortest exact binary spelling: 1073741824 -> '1GiB', 1000 -> '1000B'."""
    for unit, factor in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size}B"
