"""The sandbox's pure parts for snapshots and thin volumes: space arithmetic, metadata, ids, hole-keeping copies."""

from __future__ import annotations

import errno
import json
import os

import pytest

from lvm import images
from lvm.backend import ContentSource, SizeRange
from lvm.names import is_valid_lv_name
from lvm.profiles import LINEAR
from lvm.images import copy_image, data_ranges
from lvm.sandbox_state import (
    SnapshotRecord,
    Space,
    VolumeRecord,
    is_compatible,
    is_snapshot_id,
    parse_metadata,
    parse_snapshot_metadata,
    plan_snapshot_repair,
    scan_snapshots,
    snapshot_id_for,
)
from lvm.units import MiB


def test_space_without_thin_volumes_is_the_linear_arithmetic_of_before():
    space = Space(capacity=64 * MiB, thick=10 * MiB, thin_virtual=0, data_used=0)
    assert (space.pool, space.free, space.thin_admissible, space.full) == (54 * MiB, 54 * MiB, 54 * MiB, False)


def test_space_thin_volumes_hold_their_promise_against_linear_ones():
    at_one = Space(capacity=64 * MiB, thick=0, thin_virtual=40 * MiB, data_used=MiB)
    assert at_one.free == 24 * MiB and at_one.thin_admissible == 24 * MiB
    at_two = Space(capacity=64 * MiB, thick=0, thin_virtual=40 * MiB, data_used=MiB, ratio=2.0)
    assert at_two.free == 44 * MiB  # 40 MiB promised at 2.0 hold 20 MiB
    assert at_two.thin_admissible == 88 * MiB  # 128 - 40
    # Real data beyond the promises holds what it holds.
    filled = Space(capacity=64 * MiB, thick=0, thin_virtual=8 * MiB, data_used=30 * MiB, ratio=2.0)
    assert filled.free == 34 * MiB and filled.thin_admissible == 68 * MiB  # min(128 - 8, 2 * 34)


def test_space_high_water_mark():
    mark = 64 * MiB * 95 // 100  # 94.99...% of the pool; one byte more is 95%
    assert Space(64 * MiB, 0, 0, mark + 1, full_percent=95.0).full
    below = Space(64 * MiB, 0, 0, mark, full_percent=95.0)
    assert not below.full and below.thin_admissible > 0
    assert Space(64 * MiB, 0, 0, 33 * MiB, full_percent=50.0).thin_admissible == 0
    # No pool at all: full once it holds anything.
    assert Space(64 * MiB, 64 * MiB, 0, 0).pool == 0 and not Space(64 * MiB, 64 * MiB, 0, 0).full
    assert Space(64 * MiB, 64 * MiB, 0, 4096).full


def test_snapshot_ids_are_never_volume_ids():
    for name in ("s", "pvc-1", "snapshot", "snapshot-x", "a/b", "é" * 200, "x" * 128):
        snapshot_id = snapshot_id_for(name)
        assert is_snapshot_id(snapshot_id) and not is_valid_lv_name(snapshot_id)
        assert snapshot_id_for(name) == snapshot_id and len(snapshot_id) < 200
    for text in ("s", "snapshot-", "snapshot-../x", "snapshot-a/b", "../snapshot-x", ""):
        assert not is_snapshot_id(text)


def test_snapshot_metadata_round_trip_and_rejections():
    record = SnapshotRecord("snapshot-s", "s", "v", 8 * MiB, 1_700_000_000_123_456_789)
    assert parse_snapshot_metadata("snapshot-s", record.to_json()) == record
    snap = record.snapshot
    assert (snap.id, snap.source_volume_id, snap.size, snap.created_ns, snap.ready, snap.name) == (
        "snapshot-s", "v", 8 * MiB, 1_700_000_000_123_456_789, True, "s",
    )
    with pytest.raises(ValueError, match="snapshot 'snapshot-s'"):
        parse_snapshot_metadata("snapshot-t", record.to_json())
    for broken in ('{"format": 1, "id": "snapshot-s"}', "[]", '{"format": 2}'):
        with pytest.raises(ValueError):
            parse_snapshot_metadata("snapshot-s", broken)


def test_snapshot_metadata_records_the_source_profile_and_reads_older_records():
    record = SnapshotRecord("snapshot-s", "s", "v", MiB, 1, (("pool", "csilvm-thinpool"), ("type", "thin")))
    assert parse_snapshot_metadata("snapshot-s", record.to_json()) == record
    older = json.loads(record.to_json())
    del older["parameters"]
    assert parse_snapshot_metadata("snapshot-s", json.dumps(older)).parameters == ()
    with pytest.raises(ValueError):
        parse_snapshot_metadata("snapshot-s", json.dumps({**older, "parameters": ["type"]}))


def test_volume_metadata_records_its_source():
    source = ContentSource(ContentSource.SNAPSHOT, "snapshot-s")
    record = VolumeRecord("r", "r", 8 * MiB, (("type", "linear"),), "2024-01-01T00:00:00+00:00", source)
    assert parse_metadata("r", record.to_json()) == record
    plain = VolumeRecord("r", "r", 8 * MiB, (("type", "linear"),), "2024-01-01T00:00:00+00:00")
    assert "source" not in plain.to_json() and parse_metadata("r", plain.to_json()).source is None
    with pytest.raises(ValueError, match="source"):
        parse_metadata("r", record.to_json().replace('"snapshot"', '"tape"'))
    assert is_compatible(record, "r", SizeRange(), LINEAR, source) is None
    assert "content source" in is_compatible(record, "r", SizeRange(), LINEAR, None)
    assert "content source" in is_compatible(record, "r", SizeRange(), LINEAR, ContentSource("volume", "v"))


def test_scan_and_repair_of_the_snapshots_dir(tmp_path):
    whole = SnapshotRecord("snapshot-a", "a", "v", MiB, 1)
    (tmp_path / "snapshot-a.img").write_bytes(b"")
    (tmp_path / "snapshot-a.json").write_text(whole.to_json())
    (tmp_path / "snapshot-orphan.img").write_bytes(b"")
    (tmp_path / "snapshot-gone.json").write_text(whole.to_json().replace("snapshot-a", "snapshot-gone"))
    (tmp_path / "snapshot-x.json.tmp").write_text("{")
    (tmp_path / "snapshot-bad.img").write_bytes(b"")
    (tmp_path / "snapshot-bad.json").write_text("{")
    (tmp_path / "a.img").write_bytes(b"")  # a volume's name: foreign here
    state = scan_snapshots(tmp_path)
    assert state.records == (whole,) and state.unreadable == ("snapshot-bad",)
    assert set(plan_snapshot_repair(state, tmp_path)) == {
        tmp_path / "snapshot-orphan.img", tmp_path / "snapshot-gone.json", tmp_path / "snapshot-x.json.tmp",
    }


def _sparse_file(path, size: int, chunks: dict[int, bytes]) -> None:
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, data in chunks.items():
            f.seek(offset)
            f.write(data)


def test_copy_image_keeps_holes_and_zero_fills_past_the_source(tmp_path):
    src = tmp_path / "src"
    _sparse_file(src, 64 * MiB, {0: b"HEAD", 40 * MiB: b"MID" * 5000, 64 * MiB - 4: b"TAIL"})
    how = copy_image(src, tmp_path / "dst", 64 * MiB, 96 * MiB)
    dst = (tmp_path / "dst").read_bytes()
    assert how in ("reflink", "sparse copy") and len(dst) == 96 * MiB
    assert dst[: 64 * MiB] == src.read_bytes() and dst[64 * MiB:] == bytes(32 * MiB)
    assert os.stat(tmp_path / "dst").st_blocks * 512 <= 2 * MiB
    with pytest.raises(FileExistsError):
        copy_image(src, tmp_path / "dst", 64 * MiB, 64 * MiB)  # never over an existing file


def test_copy_image_takes_only_the_sources_length(tmp_path):
    """An image longer than its volume (an interrupted expansion) is copied up to the volume's size only."""
    src = tmp_path / "src"
    _sparse_file(src, 16 * MiB, {0: b"KEEP", 8 * MiB: b"PAST"})
    copy_image(src, tmp_path / "dst", 8 * MiB, 16 * MiB, read_only=True)
    dst = (tmp_path / "dst").read_bytes()
    assert dst[:4] == b"KEEP" and dst[8 * MiB:] == bytes(8 * MiB)
    assert os.stat(tmp_path / "dst").st_mode & 0o777 == 0o444


def test_copy_by_hand_when_the_kernel_cannot_copy_ranges(tmp_path, monkeypatch):
    def refuse(*args):
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    monkeypatch.setattr(images, "_reflink", lambda src_fd, dst_fd: False)
    src = tmp_path / "src"
    _sparse_file(src, 8 * MiB, {MiB: b"\x01" * (2 * MiB), 5 * MiB: bytes(MiB)})  # data, and written zeros
    assert copy_image(src, tmp_path / "dst", 8 * MiB, 8 * MiB) == "sparse copy"
    assert (tmp_path / "dst").read_bytes() == src.read_bytes()
    assert os.stat(tmp_path / "dst").st_blocks * 512 <= 2 * MiB + 64 * 1024, "written zeros stay holes"


def test_data_ranges_skip_holes(tmp_path):
    src = tmp_path / "src"
    _sparse_file(src, 16 * MiB, {4 * MiB: b"x", 12 * MiB: b"y"})
    fd = os.open(src, os.O_RDONLY)
    try:
        ranges = list(data_ranges(fd, 16 * MiB))
        assert sum(end - start for start, end in ranges) < 16 * MiB
        assert any(start <= 4 * MiB < end for start, end in ranges) and any(start <= 12 * MiB < end for start, end in ranges)
        assert all(end <= 8 * MiB for start, end in data_ranges(fd, 8 * MiB))
    finally:
        os.close(fd)
