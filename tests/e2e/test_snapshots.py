"""Snapshots, restores, clones and thin volumes over the socket of `csilvm serve --backend loop`.

The data path is real: a pattern is written through a published volume (an
ext4 mount, or the raw block device), snapshotted while published (the plugin
freezes the mounted file system around the copy), overwritten, and read back
through a published restore or clone.
"""

from __future__ import annotations

import os
import random
import time

import grpc
import pytest

from protos.v0 import csi_pb2 as v0_pb
from protos.v1 import csi_pb2 as pb
from tests.e2e.test_controller import GiB, MiB, code_of
from tests.e2e.test_v0 import TIMEOUT, V0
from tests.e2e.test_v0 import capability as v0_capability

PATTERN_SIZE = 3 * MiB + 123


def pattern(seed: int) -> bytes:
    return random.Random(seed).randbytes(PATTERN_SIZE)


class Published:
    """A volume published at a target (staged first for a mount), written and read as the CO's workload would."""

    def __init__(self, csi, volume_id: str, where, block: bool):
        self.csi, self.volume_id, self.block = csi, volume_id, block
        self.staging = str(where / f"staging-{volume_id}")
        self.target = str(where / f"target-{volume_id}")
        if not block:
            os.makedirs(self.staging, exist_ok=True)
            csi.stage(volume_id, self.staging)
        csi.publish(volume_id, "" if block else self.staging, self.target, block=block)

    def _path(self) -> str:
        return self.target if self.block else os.path.join(self.target, "data.bin")

    def write(self, data: bytes) -> None:
        flags = os.O_WRONLY if self.block else os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        fd = os.open(self._path(), flags, 0o644)
        try:
            os.pwrite(fd, data, MiB if self.block else 0)  # block: away from offset 0, to be sure it is data
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> bytes:
        fd = os.open(self._path(), os.O_RDONLY)
        try:
            return os.pread(fd, PATTERN_SIZE, MiB if self.block else 0)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.csi.unpublish(self.volume_id, self.target)
        if not self.block:
            self.csi.unstage(self.volume_id, self.staging)

    def reopen(self) -> None:
        if not self.block:
            self.csi.stage(self.volume_id, self.staging)
        self.csi.publish(self.volume_id, "" if self.block else self.staging, self.target, block=self.block)


@pytest.mark.parametrize("access", ["mount", "block"])
def test_restore_holds_the_snapshot_and_a_clone_the_volume(csi, tmp_path, access):
    block = access == "block"
    vol = csi.create("origin", 32 * MiB, block=block)
    origin = Published(csi, vol.volume_id, tmp_path, block)
    origin.write(pattern(1))
    before = time.time()
    snap = csi.snapshot("snap-of-origin", vol.volume_id)  # published: a mount is frozen around the copy
    assert snap.source_volume_id == vol.volume_id and snap.size_bytes == 32 * MiB and snap.ready_to_use
    assert before - 1 <= snap.creation_time.seconds <= time.time() + 1
    origin.write(pattern(2))  # the volume moves on

    restored = csi.create("restored", 48 * MiB, block=block, from_snapshot=snap.snapshot_id)
    assert restored.capacity_bytes == 48 * MiB
    assert restored.content_source.snapshot.snapshot_id == snap.snapshot_id
    clone = csi.create("clone", 32 * MiB, block=block, from_volume=vol.volume_id)
    assert clone.content_source.volume.volume_id == vol.volume_id

    published = [Published(csi, v.volume_id, tmp_path, block) for v in (restored, clone)]
    try:
        assert published[0].read() == pattern(1), "the restore holds the bytes of the snapshot's moment"
        assert published[1].read() == pattern(2), "the clone holds the volume's bytes of its own moment"
        assert origin.read() == pattern(2)
        published[0].write(pattern(3))
        assert origin.read() == pattern(2) and published[1].read() == pattern(2), "nothing is shared"
    finally:
        for p in published:
            p.close()
        origin.close()
    listed = {v.volume_id: v for v in csi.all_volumes()}
    assert listed["restored"].content_source == restored.content_source
    assert listed["clone"].content_source == clone.content_source
    assert not listed["origin"].HasField("content_source")
    got = csi.controller.ControllerGetVolume(pb.ControllerGetVolumeRequest(volume_id="restored"), timeout=30).volume
    assert got.content_source == restored.content_source
    # A retry with the same source is the same volume; with another source it is another volume.
    assert csi.create("restored", 48 * MiB, block=block, from_snapshot=snap.snapshot_id) == restored
    assert code_of(csi.create, "restored", 48 * MiB, block=block, from_volume=vol.volume_id) == grpc.StatusCode.ALREADY_EXISTS
    # The snapshot outlives its volume.
    csi.delete(vol.volume_id)
    assert [s.snapshot.snapshot_id for s in csi.list_snapshots().entries] == [snap.snapshot_id]
    for v in ("restored", "clone"):
        csi.delete(v)
    csi.delete_snapshot(snap.snapshot_id)
    assert csi.capacity().available_capacity == 2 * GiB


def test_a_published_block_volume_can_be_snapshotted_and_cloned(csi, tmp_path):
    vol = csi.create("raw", 8 * MiB, block=True)
    origin = Published(csi, vol.volume_id, tmp_path, block=True)
    try:
        origin.write(pattern(4))
        snap = csi.snapshot("raw-snap", vol.volume_id)
        clone = csi.create("raw-clone", 8 * MiB, block=True, from_volume=vol.volume_id)
        restored = csi.create("raw-restored", 8 * MiB, block=True, from_snapshot=snap.snapshot_id)
        for copy in (clone, restored):
            published = Published(csi, copy.volume_id, tmp_path, block=True)
            assert published.read() == pattern(4)
            published.close()
    finally:
        origin.close()


def test_create_snapshot_errors_and_idempotency(csi):
    csi.create("a", 8 * MiB)
    csi.create("b", 8 * MiB)
    snap = csi.snapshot("s", "a")
    assert csi.snapshot("s", "a") == snap
    assert code_of(csi.snapshot, "s", "b") == grpc.StatusCode.ALREADY_EXISTS
    assert code_of(csi.snapshot, "t", "no-such-volume") == grpc.StatusCode.NOT_FOUND
    assert code_of(csi.snapshot, "t", "a", {"unknown": "x"}) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(csi.create, "r", 8 * MiB, from_snapshot="snapshot-nope") == grpc.StatusCode.NOT_FOUND
    assert code_of(csi.create, "r", 8 * MiB, from_volume="no-such-volume") == grpc.StatusCode.NOT_FOUND
    assert code_of(csi.create, "r", 4 * MiB, 4 * MiB, from_snapshot=snap.snapshot_id) == grpc.StatusCode.OUT_OF_RANGE
    assert code_of(csi.get_snapshot, "snapshot-nope") == grpc.StatusCode.NOT_FOUND
    assert code_of(csi.get_snapshot, "a") == grpc.StatusCode.NOT_FOUND  # a volume's id names no snapshot
    assert csi.get_snapshot(snap.snapshot_id) == snap
    csi.delete_snapshot("snapshot-nope")  # unknown: success
    csi.delete_snapshot(snap.snapshot_id)
    csi.delete_snapshot(snap.snapshot_id)
    assert code_of(csi.get_snapshot, snap.snapshot_id) == grpc.StatusCode.NOT_FOUND


def test_list_snapshots_pages_and_filters(csi):
    csi.create("a", 8 * MiB)
    csi.create("b", 8 * MiB)
    made = [csi.snapshot("s1", "a"), csi.snapshot("s2", "a"), csi.snapshot("s3", "b")]
    ids = sorted(s.snapshot_id for s in made)
    everything = csi.list_snapshots()
    assert [e.snapshot.snapshot_id for e in everything.entries] == ids and everything.next_token == ""

    first = csi.list_snapshots(max_entries=2)
    assert len(first.entries) == 2 and first.next_token
    second = csi.list_snapshots(max_entries=2, starting_token=first.next_token)
    assert len(second.entries) == 1 and second.next_token == ""
    assert [e.snapshot.snapshot_id for e in [*first.entries, *second.entries]] == ids

    by_id = csi.list_snapshots(snapshot_id=made[1].snapshot_id)
    assert [e.snapshot for e in by_id.entries] == [made[1]]
    assert list(csi.list_snapshots(snapshot_id="snapshot-nope").entries) == []
    of_a = csi.list_snapshots(source_volume_id="a")
    assert sorted(e.snapshot.snapshot_id for e in of_a.entries) == sorted([made[0].snapshot_id, made[1].snapshot_id])
    assert list(csi.list_snapshots(source_volume_id="nope").entries) == []
    assert [e.snapshot for e in csi.list_snapshots(snapshot_id=made[2].snapshot_id, source_volume_id="b").entries] == [made[2]]
    assert list(csi.list_snapshots(snapshot_id=made[2].snapshot_id, source_volume_id="a").entries) == []
    assert code_of(csi.list_snapshots, starting_token="not-a-token") == grpc.StatusCode.ABORTED
    # A token stays valid while snapshots come and go.
    csi.delete_snapshot(first.entries[0].snapshot.snapshot_id)
    again = csi.list_snapshots(max_entries=2, starting_token=first.next_token)
    assert [e.snapshot for e in again.entries] == [e.snapshot for e in second.entries]


def test_thin_volumes_over_the_socket(plugin_factory):
    csi = plugin_factory("--thin-overprovision-ratio", "2", capacity="64MiB").start()
    thin = {"type": "thin"}
    assert csi.capacity(thin).available_capacity == 128 * MiB
    assert csi.capacity(thin).maximum_volume_size.value == 128 * MiB
    assert code_of(csi.create, "t", 129 * MiB, parameters=thin) == grpc.StatusCode.OUT_OF_RANGE
    vol = csi.create("t", 128 * MiB, parameters=thin)
    assert vol.capacity_bytes == 128 * MiB and vol.volume_context["lvm.csi.csilvm.io/type"] == "thin"
    assert vol.volume_context["lvm.csi.csilvm.io/pool"] == "csilvm-thinpool"
    assert csi.capacity(thin).available_capacity == 0
    assert csi.capacity().available_capacity == 0  # every byte promised at 2.0
    snap = csi.snapshot("ts", "t")  # an empty thin volume: a snapshot of no data, which fits
    assert code_of(csi.create, "tr", 0, parameters=thin, from_snapshot=snap.snapshot_id) == grpc.StatusCode.OUT_OF_RANGE
    csi.delete("t")
    assert csi.capacity(thin).available_capacity == 128 * MiB
    restored = csi.create("tr", 0, parameters=thin, from_snapshot=snap.snapshot_id)  # the source's size
    assert restored.capacity_bytes == 128 * MiB and restored.volume_context["lvm.csi.csilvm.io/type"] == "thin"


def test_v0_snapshots(plugin, tmp_path):
    channel = grpc.insecure_channel(f"unix://{plugin.socket}")
    try:
        v0 = V0(channel)
        rpc = v0_pb.ControllerServiceCapability.RPC
        caps = v0.controller.ControllerGetCapabilities(v0_pb.ControllerGetCapabilitiesRequest(), timeout=TIMEOUT)
        assert {rpc.CREATE_DELETE_SNAPSHOT, rpc.LIST_SNAPSHOTS} <= {c.rpc.type for c in caps.capabilities}
        vol = v0.create("v0-vol", 8 * MiB)

        def create_snapshot(name: str, source: str) -> v0_pb.Snapshot:
            request = v0_pb.CreateSnapshotRequest(name=name, source_volume_id=source)
            return v0.controller.CreateSnapshot(request, timeout=TIMEOUT).snapshot

        def list_snapshots(**fields) -> v0_pb.ListSnapshotsResponse:
            return v0.controller.ListSnapshots(v0_pb.ListSnapshotsRequest(**fields), timeout=TIMEOUT)

        snap = create_snapshot("v0-snap", vol.id)
        assert snap.id and snap.source_volume_id == vol.id and snap.size_bytes == 8 * MiB
        assert snap.status.type == v0_pb.SnapshotStatus.READY
        assert abs(snap.created_at / 1e9 - time.time()) < 60, "v0 counts nanoseconds since the epoch"
        assert create_snapshot("v0-snap", vol.id) == snap
        other = create_snapshot("v0-other", vol.id)
        assert code_of(create_snapshot, "v0-snap", "nope") == grpc.StatusCode.ALREADY_EXISTS
        assert code_of(create_snapshot, "v0-third", "nope") == grpc.StatusCode.NOT_FOUND
        listed = list_snapshots()
        assert [e.snapshot for e in listed.entries] == sorted([snap, other], key=lambda s: s.id)
        page = list_snapshots(max_entries=1)
        assert len(page.entries) == 1 and page.next_token
        assert [e.snapshot for e in list_snapshots(snapshot_id=snap.id).entries] == [snap]
        assert len(list_snapshots(source_volume_id=vol.id).entries) == 2

        request = v0_pb.CreateVolumeRequest(
            name="v0-restored", capacity_range=v0_pb.CapacityRange(required_bytes=8 * MiB),
            volume_capabilities=[v0_capability()],
        )
        request.volume_content_source.snapshot.id = snap.id
        restored = v0.controller.CreateVolume(request, timeout=TIMEOUT).volume
        assert restored.content_source.snapshot.id == snap.id and restored.capacity_bytes == 8 * MiB

        for s in (snap, other):
            v0.controller.DeleteSnapshot(v0_pb.DeleteSnapshotRequest(snapshot_id=s.id), timeout=TIMEOUT)
        v0.controller.DeleteSnapshot(v0_pb.DeleteSnapshotRequest(snapshot_id=snap.id), timeout=TIMEOUT)
        assert list(list_snapshots().entries) == []
    finally:
        channel.close()


def test_capabilities_advertise_snapshots_and_clones(csi):
    rpc = pb.ControllerServiceCapability.RPC
    kinds = {c.rpc.type for c in csi.controller_capabilities().capabilities}
    assert {rpc.CREATE_DELETE_SNAPSHOT, rpc.LIST_SNAPSHOTS, rpc.GET_SNAPSHOT, rpc.CLONE_VOLUME} <= kinds
