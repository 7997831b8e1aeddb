"""The pure parts of thin provisioning, snapshots and restores: arithmetic, names, parameters, copies."""

from __future__ import annotations

import os

import pytest

from lvm import thin
from lvm.backend import SizeRange, restore_range
from lvm.copy import copy_device
from lvm.errors import InvalidParameters, OutOfRange
from lvm.names import is_valid_lv_name, snapshot_lv_name_for
from lvm.profiles import DEFAULT_THIN_POOL, Layout, Profile, parse_profile
from lvm.volume_group import cow_extents_for, profile_from_tags, profile_tags, thin_pool_metadata_extents

MiB = 1 << 20


def test_ratio_bounds_the_promise_and_written_data_bounds_it_more():
    # An empty 64 MiB pool at ratio 2 admits exactly 128 MiB.
    assert thin.admissible(64 * MiB, 0, 0, 2.0) == 128 * MiB
    assert thin.admissible(64 * MiB, 0, 100 * MiB, 2.0) == 28 * MiB
    # Written data shrinks what is left: 40 MiB written leaves 24 MiB of real space, 48 MiB at ratio 2.
    assert thin.admissible(64 * MiB, 40 * MiB, 0, 2.0) == 48 * MiB
    # Never negative, and no overcommit at ratio 1.
    assert thin.admissible(64 * MiB, 0, 200 * MiB, 2.0) == 0
    assert thin.admissible(64 * MiB, 0, 0, 1.0) == 64 * MiB


def test_high_water_mark_counts_data_or_metadata():
    assert not thin.above_high_water(94.99, 10, 95)
    assert thin.above_high_water(95.0, 0, 95)
    assert thin.above_high_water(1, 96, 95)
    message = thin.fill_message("vg/pool", 96.5, 3, 95)
    assert "vg/pool" in message and "96.50%" in message and "95%" in message


def test_pool_size_is_bytes_or_a_percentage_of_the_vg():
    assert thin.PoolSize.parse("64MiB").resolve(10 * MiB * 1024) == 64 * MiB
    assert thin.PoolSize.parse("50%").resolve(200 * MiB) == 100 * MiB
    for bad in ("0%", "150%", "x%", "0", "lots"):
        with pytest.raises(InvalidParameters):
            thin.PoolSize.parse(bad)
    with pytest.raises(InvalidParameters):
        thin.ThinPolicy(overprovision_ratio=0.5)
    with pytest.raises(InvalidParameters):
        thin.ThinPolicy(full_percent=0)


def test_thin_profile_parses_records_and_reads_back():
    profile = parse_profile({"type": "thin"})
    assert profile == Profile(Layout.THIN, pool=DEFAULT_THIN_POOL) and profile.min_devices == 1
    other = parse_profile({"type": "thin", "pool": "fast"})
    assert other.as_parameters() == {"type": "thin", "pool": "fast"}
    assert profile_from_tags(profile_tags(other)) == other
    with pytest.raises(InvalidParameters):
        parse_profile({"type": "thin", "pool": "bad/name"})
    with pytest.raises(InvalidParameters):
        parse_profile({"type": "thin", "mirrors": "1"})


def test_snapshot_names_are_valid_lv_names_apart_from_volume_names():
    kubernetes = "snapshot-8c4a3d0e-2a1b-4c5d-9e8f-0123456789ab"
    name = snapshot_lv_name_for(kubernetes)
    assert is_valid_lv_name(name) and name.startswith("snap.") and name != kubernetes
    assert snapshot_lv_name_for(kubernetes) == name  # deterministic: a retry finds it
    assert is_valid_lv_name(snapshot_lv_name_for("ünïcode/with spaces"))


def test_cow_store_is_never_smaller_than_what_a_full_overwrite_needs():
    # dm-snapshot's persistent store: one 4 KiB header chunk, and per 256 data chunks one 4 KiB index chunk.
    for extents in (1, 8, 16, 192, 1000, 4096):
        chunks = extents * MiB // 4096
        needed_bytes = 4096 + chunks * 4096 + -(-chunks // 256) * 4096
        assert cow_extents_for(extents) * MiB >= needed_bytes


def test_pool_metadata_estimate_follows_lvm2_minimum():
    assert thin_pool_metadata_extents(64, MiB) == 2
    assert thin_pool_metadata_extents(64 * 1024, MiB) == 64  # 64 GiB: 1 Mi chunks of 64 bytes


def test_restore_range_is_at_least_the_source():
    assert restore_range(SizeRange(), 16 * MiB) == SizeRange(16 * MiB, 0)
    assert restore_range(SizeRange(32 * MiB, 0), 16 * MiB) == SizeRange(32 * MiB, 0)
    assert restore_range(SizeRange(0, 32 * MiB), 16 * MiB) == SizeRange(16 * MiB, 32 * MiB)
    with pytest.raises(OutOfRange, match="below the source"):
        restore_range(SizeRange(8 * MiB, 0), 16 * MiB)
    with pytest.raises(OutOfRange, match="below the source"):
        restore_range(SizeRange(0, 8 * MiB), 16 * MiB)


@pytest.mark.parametrize("reads_zeros", [False, True])
def test_copy_gives_the_source_bytes_and_zeros_beyond(tmp_path, reads_zeros):
    source, target = tmp_path / "source", tmp_path / "target"
    data = bytearray(os.urandom(9 * MiB))
    data[4 * MiB:8 * MiB] = bytes(4 * MiB)  # a chunk of zeros in the middle
    source.write_bytes(bytes(data))
    garbage = b"\xff" * (12 * MiB)
    target.write_bytes(bytes(12 * MiB) if reads_zeros else garbage)
    copy_device(str(source), str(target), len(data), target_size=12 * MiB, target_reads_zeros=reads_zeros)
    assert target.read_bytes() == bytes(data) + bytes(3 * MiB)


def test_copy_refuses_a_target_smaller_than_the_source(tmp_path):
    (tmp_path / "s").write_bytes(b"x" * 10)
    (tmp_path / "t").write_bytes(b"")
    with pytest.raises(ValueError):
        copy_device(str(tmp_path / "s"), str(tmp_path / "t"), 10, target_size=5)
