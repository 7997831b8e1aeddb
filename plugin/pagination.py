"""ListVolumes pagination: opaque tokens that stay valid while volumes come and go.

A token names the last id of the previous page (ids are unique and sorted), so
the next page starts strictly after it whether or not that volume still exists:
no volume is skipped or repeated because another was created or deleted.
"""

from __future__ import annotations

import base64
import binascii
from typing import Callable, Sequence, TypeVar

from lvm.errors import StorageError

T = TypeVar("T")
_PREFIX = b"csilvm-after:"


class BadToken(StorageError):
    """The starting_token was not produced by this plugin (ABORTED in CSI)."""


def encode_token(last_id: str) -> str:
    return base64.urlsafe_b64encode(_PREFIX + last_id.encode("utf-8")).decode("ascii")


def decode_token(token: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(token.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raw = b""
    if not raw.startswith(_PREFIX):
        raise BadToken(f"starting_token {token!r} was not issued by this plugin: list again without a token")
    return raw[len(_PREFIX):].decode("utf-8", "replace")


def page(items: Sequence[T], max_entries: int, starting_token: str, key: Callable[[T], str]) -> tuple[list[T], str]:
    """One page of ``items`` (sorted by ``key``) after ``starting_token``; returns (page, next_token)."""
    ordered = sorted(items, key=key)
    if starting_token:
        after = decode_token(starting_token)
        ordered = [item for item in ordered if key(item) > after]
    if max_entries <= 0 or len(ordered) <= max_entries:
        return list(ordered), ""
    chosen = list(ordered[:max_entries])
    return chosen, encode_token(key(chosen[-1]))
