"""Day two on the loop sandbox, over the socket: volumes grow (block, xfs online, ext4 at the next stage),
expansion is exact, a damaged volume reports its condition, and layout changes are refused but to linear."""

from __future__ import annotations

import fcntl
import hashlib
import os
import struct

import grpc
import pytest

MiB = 1 << 20
BLKGETSIZE64 = 0x80081272


def code_of(call, *args, **kwargs) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call(*args, **kwargs)
    assert err.value.details()
    return err.value.code()


def device_size(path) -> int:
    with open(path, "rb") as f:
        return struct.unpack("Q", fcntl.ioctl(f.fileno(), BLKGETSIZE64, b"\0" * 8))[0]


def total(path) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_published_block_volume_grows_with_its_data(csi, tmp_path):
    vol = csi.create("grow-block", 8 * MiB, block=True)
    target = tmp_path / "target"
    csi.publish(vol.volume_id, "", str(target), block=True)
    payload = os.urandom(MiB)
    with open(target, "r+b") as f:
        f.seek(7 * MiB)
        f.write(payload)
    grown = csi.expand(vol.volume_id, 16 * MiB, block=True)
    assert (grown.capacity_bytes, grown.node_expansion_required) == (16 * MiB, False)
    assert csi.node_expand(vol.volume_id, str(target)).capacity_bytes == 16 * MiB
    assert device_size(target) == 16 * MiB
    with open(target, "r+b") as f:
        f.seek(7 * MiB)
        assert f.read(MiB) == payload
        f.seek(15 * MiB)
        f.write(payload)  # the new space is usable
    assert csi.stats(vol.volume_id, str(target)).usage[0].total == 16 * MiB
    csi.unpublish(vol.volume_id, str(target))


def test_a_published_xfs_grows_online(csi, tmp_path):
    vol = csi.create("grow-xfs", 320 * MiB)  # mkfs.xfs refuses less than 300 MB
    staging, target = tmp_path / "staging", tmp_path / "target"
    staging.mkdir()
    csi.stage(vol.volume_id, str(staging), fs_type="xfs")
    csi.publish(vol.volume_id, str(staging), str(target), fs_type="xfs")
    (target / "data").write_bytes(os.urandom(2 * MiB))
    before, checksum = total(target), sha256(target / "data")
    grown = csi.expand(vol.volume_id, 400 * MiB)
    assert grown.node_expansion_required
    assert csi.node_expand(vol.volume_id, str(target), str(staging)).capacity_bytes == 400 * MiB
    assert total(target) >= before + 72 * MiB
    assert csi.node_expand(vol.volume_id, str(target), str(staging)).capacity_bytes == 400 * MiB  # idempotent
    assert sha256(target / "data") == checksum
    assert code_of(csi.node_expand, vol.volume_id, str(tmp_path / "elsewhere")) == grpc.StatusCode.NOT_FOUND
    assert code_of(csi.node_expand, "no-such-volume", str(target)) == grpc.StatusCode.NOT_FOUND
    csi.unpublish(vol.volume_id, str(target))
    csi.unstage(vol.volume_id, str(staging))


def test_an_ext4_grown_while_unstaged_is_grown_at_the_next_stage(csi, tmp_path):
    vol = csi.create("grow-ext4", 32 * MiB)
    staging = tmp_path / "staging"
    staging.mkdir()
    csi.stage(vol.volume_id, str(staging), fs_type="ext4")
    (staging / "data").write_bytes(os.urandom(MiB))
    before, checksum = total(staging), sha256(staging / "data")
    csi.unstage(vol.volume_id, str(staging))
    csi.expand(vol.volume_id, 64 * MiB)
    csi.stage(vol.volume_id, str(staging), fs_type="ext4")
    assert total(staging) >= before + 28 * MiB
    assert sha256(staging / "data") == checksum
    csi.unstage(vol.volume_id, str(staging))


def test_expansion_takes_exactly_what_get_capacity_says(plugin_factory):
    plugin = plugin_factory(capacity="64MiB")
    csi = plugin.start()
    vol = csi.create("exact", 16 * MiB)
    free = csi.capacity({}).available_capacity
    assert code_of(csi.expand, vol.volume_id, 16 * MiB + free + MiB) == grpc.StatusCode.OUT_OF_RANGE
    assert csi.get_volume(vol.volume_id).volume.capacity_bytes == 16 * MiB
    assert csi.expand(vol.volume_id, 16 * MiB + free).capacity_bytes == 64 * MiB
    assert csi.capacity({}).available_capacity == 0
    assert csi.expand(vol.volume_id, MiB).capacity_bytes == 64 * MiB  # never shrinks
    assert code_of(csi.expand, "no-such-volume", MiB) == grpc.StatusCode.NOT_FOUND


def test_a_volume_whose_image_was_removed_reports_abnormal(plugin, csi, tmp_path):
    vol = csi.create("damaged", 16 * MiB)
    healthy = csi.create("healthy", 16 * MiB)
    staging, target = tmp_path / "staging", tmp_path / "target"
    staging.mkdir()
    csi.stage(vol.volume_id, str(staging))
    csi.publish(vol.volume_id, str(staging), str(target))
    assert not csi.get_volume(vol.volume_id).status.volume_condition.abnormal
    assert not csi.stats(vol.volume_id, str(target)).volume_condition.abnormal
    listed = {e.volume.volume_id: e.status.volume_condition for e in csi.list_volumes().entries}
    assert not listed[vol.volume_id].abnormal and not listed[healthy.volume_id].abnormal

    (plugin.work_dir / "volumes" / f"{vol.volume_id}.img").unlink()  # an operator's mistake
    condition = csi.get_volume(vol.volume_id).status.volume_condition
    assert condition.abnormal and "removed outside csilvm" in condition.message, condition
    stats = csi.stats(vol.volume_id, str(target))
    assert stats.volume_condition.abnormal and stats.usage[0].total > 0
    assert not csi.get_volume(healthy.volume_id).status.volume_condition.abnormal
    assert code_of(csi.get_volume, "no-such-volume") == grpc.StatusCode.NOT_FOUND
    csi.unpublish(vol.volume_id, str(target))
    csi.unstage(vol.volume_id, str(staging))


def test_the_sandbox_changes_no_layout(csi):
    vol = csi.create("layout", 8 * MiB)
    csi.modify(vol.volume_id, {"type": "linear"})
    assert code_of(csi.modify, vol.volume_id, {"type": "raid1"}) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(csi.modify, vol.volume_id, {"XXX_FakeKey": "x"}) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(csi.modify, "no-such-volume", {"type": "linear"}) == grpc.StatusCode.NOT_FOUND
