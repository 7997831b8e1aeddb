"""Node service over the socket: real mkfs, real mounts, real block devices on the loop sandbox."""

from __future__ import annotations

import errno
import os
import subprocess

import grpc
import pytest

from protos.v1 import csi_pb2 as pb
from plugin.client import volume_capability
from tests.e2e.test_controller import MiB, code_of


@pytest.fixture
def paths(tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    return str(staging), str(tmp_path / "target")


def device_of(csi, volume_id: str) -> str:
    [vol] = [v for v in csi.all_volumes() if v.volume_id == volume_id]
    image = vol.volume_context["lvm.csi.csilvm.io/image"]
    out = subprocess.run(["losetup", "-j", image, "-O", "NAME", "-n"], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def fs_type_of(device: str) -> str:
    return subprocess.run(["blkid", "-p", "-o", "value", "-s", "TYPE", device], capture_output=True, text=True).stdout.strip()


def test_node_info_and_capabilities(csi):
    info = csi.node_info()
    assert info.node_id == "test-node"
    assert dict(info.accessible_topology.segments) == {"lvm.csi.csilvm.io/node": "test-node"}
    rpc = pb.NodeServiceCapability.RPC
    kinds = {c.rpc.type for c in csi.node_capabilities().capabilities}
    assert {rpc.STAGE_UNSTAGE_VOLUME, rpc.GET_VOLUME_STATS} <= kinds


def test_mount_volume_life_keeps_data(csi, paths):
    staging, target = paths
    vol = csi.create("data", 32 * MiB)
    csi.stage(vol.volume_id, staging)
    csi.stage(vol.volume_id, staging)  # idempotent
    assert fs_type_of(device_of(csi, vol.volume_id)) == "ext4"
    csi.publish(vol.volume_id, staging, target)
    csi.publish(vol.volume_id, staging, target)  # idempotent
    with open(os.path.join(target, "hello.txt"), "w") as f:
        f.write("kept")
    stats = csi.stats(vol.volume_id, target)
    units = {u.unit: u for u in stats.usage}
    st = os.statvfs(target)
    assert units[pb.VolumeUsage.BYTES].total == st.f_blocks * st.f_frsize
    assert units[pb.VolumeUsage.INODES].used >= 1
    csi.unpublish(vol.volume_id, target)
    csi.unpublish(vol.volume_id, target)  # idempotent
    assert not os.path.exists(target), "the plugin removes the target it created"
    csi.unstage(vol.volume_id, staging)
    csi.unstage(vol.volume_id, staging)
    csi.stage(vol.volume_id, staging)
    csi.publish(vol.volume_id, staging, target)
    with open(os.path.join(target, "hello.txt")) as f:
        assert f.read() == "kept"
    csi.unpublish(vol.volume_id, target)
    csi.unstage(vol.volume_id, staging)


def test_xfs_and_mount_flags(csi, paths):
    staging, target = paths
    vol = csi.create("xfs-vol", 320 * MiB)  # mkfs.xfs refuses less than 300 MB
    csi.stage(vol.volume_id, staging, fs_type="xfs", mount_flags=["noatime"])
    csi.publish(vol.volume_id, staging, target, fs_type="xfs", mount_flags=["noatime"])
    assert fs_type_of(device_of(csi, vol.volume_id)) == "xfs"
    options = [line.split()[5] for line in open("/proc/self/mountinfo") if line.split()[4] == target]
    assert options and "noatime" in options[-1]
    csi.unpublish(vol.volume_id, target)
    csi.unstage(vol.volume_id, staging)


def test_another_file_system_is_never_reformatted(csi, paths):
    staging, target = paths
    vol = csi.create("keep-ext4", 16 * MiB)
    csi.stage(vol.volume_id, staging)
    csi.unstage(vol.volume_id, staging)
    assert code_of(csi.stage, vol.volume_id, staging, fs_type="xfs") == grpc.StatusCode.FAILED_PRECONDITION
    assert fs_type_of(device_of(csi, vol.volume_id)) == "ext4"


def test_readonly_publish_refuses_writes(csi, paths):
    staging, target = paths
    vol = csi.create("ro", 16 * MiB)
    csi.stage(vol.volume_id, staging)
    csi.publish(vol.volume_id, staging, target, readonly=True)
    with pytest.raises(OSError) as err:
        open(os.path.join(target, "nope"), "w")
    assert err.value.errno == errno.EROFS
    csi.unpublish(vol.volume_id, target)
    csi.unstage(vol.volume_id, staging)


def test_block_volume_publish(csi, paths):
    _, target = paths
    vol = csi.create("raw", 8 * MiB, block=True)
    csi.stage(vol.volume_id, "/tmp", block=True)  # nothing to stage for block
    csi.publish(vol.volume_id, "", target, block=True)
    csi.publish(vol.volume_id, "", target, block=True)  # idempotent
    payload = os.urandom(4096)
    with open(target, "r+b") as f:
        f.seek(MiB)
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    with open(device_of(csi, vol.volume_id), "rb") as dev:
        dev.seek(MiB)
        assert dev.read(4096) == payload
    stats = csi.stats(vol.volume_id, target)
    assert [(u.unit, u.total) for u in stats.usage] == [(pb.VolumeUsage.BYTES, 8 * MiB)]
    csi.unpublish(vol.volume_id, target)
    assert not os.path.exists(target)


def test_publish_requires_stage_and_a_free_target(csi, paths, tmp_path):
    staging, target = paths
    vol = csi.create("order", 16 * MiB)
    assert code_of(csi.publish, vol.volume_id, staging, target) == grpc.StatusCode.FAILED_PRECONDITION
    csi.stage(vol.volume_id, staging)
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "someone-elses-file").write_text("x")
    assert code_of(csi.unpublish, vol.volume_id, str(occupied)) == grpc.StatusCode.FAILED_PRECONDITION
    assert (occupied / "someone-elses-file").exists(), "never delete data that is not ours"
    csi.unstage(vol.volume_id, staging)


def test_node_errors(csi, paths):
    staging, target = paths
    assert code_of(csi.stage, "no-such-volume", staging) == grpc.StatusCode.NOT_FOUND
    assert code_of(csi.publish, "no-such-volume", staging, target) == grpc.StatusCode.NOT_FOUND
    vol = csi.create("errs", 8 * MiB)
    assert code_of(csi.stats, vol.volume_id, "/nonexistent/path") == grpc.StatusCode.NOT_FOUND
    assert code_of(csi.stage, vol.volume_id, "relative/path") == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(csi.node.NodePublishVolume, pb.NodePublishVolumeRequest(volume_id=vol.volume_id, target_path=target)) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(csi.stage, vol.volume_id, staging, mount_flags=["bind"]) == grpc.StatusCode.INVALID_ARGUMENT
    request = pb.NodeStageVolumeRequest(
        volume_id=vol.volume_id, staging_target_path=staging, volume_capability=volume_capability(fs_type="ntfs")
    )
    assert code_of(csi.node.NodeStageVolume, request) == grpc.StatusCode.INVALID_ARGUMENT


def test_delete_of_a_staged_volume_is_refused(csi, paths):
    staging, _ = paths
    vol = csi.create("busy", 16 * MiB)
    csi.stage(vol.volume_id, staging)
    assert code_of(csi.delete, vol.volume_id) == grpc.StatusCode.FAILED_PRECONDITION
    csi.unstage(vol.volume_id, staging)
    csi.delete(vol.volume_id)


def test_deleted_volume_shows_no_old_file_system(csi, paths):
    staging, _ = paths
    vol = csi.create("recycled", 16 * MiB)
    csi.stage(vol.volume_id, staging)
    csi.unstage(vol.volume_id, staging)
    csi.delete(vol.volume_id)
    again = csi.create("recycled", 16 * MiB)
    assert fs_type_of(device_of(csi, again.volume_id)) == ""


def test_delete_of_a_block_published_volume_is_refused(csi, paths):
    # A bind-mounted device node does not hold the device open: the mount table is what tells.
    _, target = paths
    vol = csi.create("busy-block", 4 * MiB, block=True)
    csi.publish(vol.volume_id, "", target, block=True)
    assert code_of(csi.delete, vol.volume_id) == grpc.StatusCode.FAILED_PRECONDITION
    csi.unpublish(vol.volume_id, target)
    csi.delete(vol.volume_id)
    assert csi.all_volumes() == []
