"""CSI v0 (0.3, ``csi.v0``) over the socket of `csilvm serve --backend loop`, which serves it beside v1.

Also: a server started with some API versions answers UNIMPLEMENTED for the others.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from mount.table import read_mount_table
from protos.v0 import csi_pb2 as pb
from protos.v0 import csi_pb2_grpc
from protos.v0_1 import csi_pb2 as v0_1_pb
from protos.v0_1 import csi_pb2_grpc as v0_1_grpc
from protos.v1 import csi_pb2 as v1_pb
from protos.v1 import csi_pb2_grpc as v1_grpc
from tests.e2e.test_controller import GiB, MiB, code_of

_MODE = pb.VolumeCapability.AccessMode
TIMEOUT = 60


def capability(block: bool = False, fs_type: str = "", mode: int = _MODE.SINGLE_NODE_WRITER) -> pb.VolumeCapability:
    access_mode = _MODE(mode=mode)
    if block:
        return pb.VolumeCapability(block=pb.VolumeCapability.BlockVolume(), access_mode=access_mode)
    return pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume(fs_type=fs_type), access_mode=access_mode)


@dataclass
class V0:
    """Stubs of the three v0 services on one channel."""

    channel: grpc.Channel

    def __post_init__(self):
        self.identity = csi_pb2_grpc.IdentityStub(self.channel)
        self.controller = csi_pb2_grpc.ControllerStub(self.channel)
        self.node = csi_pb2_grpc.NodeStub(self.channel)

    def capacity(self, block: bool = False) -> int:
        request = pb.GetCapacityRequest(volume_capabilities=[capability(block)])
        return self.controller.GetCapacity(request, timeout=TIMEOUT).available_capacity

    def create(self, name: str, size: int, block: bool = False) -> pb.Volume:
        request = pb.CreateVolumeRequest(
            name=name,
            capacity_range=pb.CapacityRange(required_bytes=size),
            volume_capabilities=[capability(block)],
        )
        return self.controller.CreateVolume(request, timeout=TIMEOUT).volume

    def stage(self, volume: pb.Volume, staging: str, block: bool = False) -> None:
        self.node.NodeStageVolume(
            pb.NodeStageVolumeRequest(
                volume_id=volume.id, staging_target_path=staging,
                volume_capability=capability(block), volume_attributes=volume.attributes,
            ),
            timeout=TIMEOUT,
        )

    def publish(self, volume: pb.Volume, staging: str, target: str, block: bool = False) -> None:
        self.node.NodePublishVolume(
            pb.NodePublishVolumeRequest(
                volume_id=volume.id, staging_target_path=staging, target_path=target,
                volume_capability=capability(block), volume_attributes=volume.attributes,
            ),
            timeout=TIMEOUT,
        )

    def unpublish(self, volume_id: str, target: str) -> None:
        self.node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target), timeout=TIMEOUT)

    def unstage(self, volume_id: str, staging: str) -> None:
        self.node.NodeUnstageVolume(
            pb.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=staging), timeout=TIMEOUT
        )

    def delete(self, volume_id: str) -> None:
        self.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id=volume_id), timeout=TIMEOUT)


@pytest.fixture
def v0(plugin):
    channel = grpc.insecure_channel(f"unix://{plugin.socket}")
    yield V0(channel)
    channel.close()


@pytest.fixture
def co_paths(tmp_path):
    """The staging and target directories, made by the CO as v0 asks."""
    staging, target = tmp_path / "co" / "staging", tmp_path / "co" / "target"
    staging.mkdir(parents=True)
    target.mkdir()
    return str(staging), str(target)


def device_of(volume: pb.Volume) -> str:
    image = volume.attributes["lvm.csi.csilvm.io/image"]
    out = subprocess.run(["losetup", "-j", image, "-O", "NAME", "-n"], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def is_mount_point(path: str) -> bool:
    return read_mount_table().is_mount_point(os.path.realpath(path))


# --------------------------------------------------------------------- identity and handshake
def test_mesos_like_handshake(v0):
    info = v0.identity.GetPluginInfo(pb.GetPluginInfoRequest(), timeout=TIMEOUT)
    assert info.name == "lvm.csi.csilvm.io" and info.vendor_version and info.manifest["backend"] == "loop"
    service = pb.PluginCapability.Service
    plugin_caps = v0.identity.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest(), timeout=TIMEOUT).capabilities
    assert {c.service.type for c in plugin_caps} == {service.CONTROLLER_SERVICE, service.ACCESSIBILITY_CONSTRAINTS}
    assert v0.identity.Probe(pb.ProbeRequest(), timeout=TIMEOUT).ready.value is True
    rpc = pb.ControllerServiceCapability.RPC
    controller_caps = v0.controller.ControllerGetCapabilities(pb.ControllerGetCapabilitiesRequest(), timeout=TIMEOUT)
    assert {c.rpc.type for c in controller_caps.capabilities} == {
        rpc.CREATE_DELETE_VOLUME, rpc.LIST_VOLUMES, rpc.GET_CAPACITY, rpc.CREATE_DELETE_SNAPSHOT, rpc.LIST_SNAPSHOTS,
    }
    node_caps = v0.node.NodeGetCapabilities(pb.NodeGetCapabilitiesRequest(), timeout=TIMEOUT).capabilities
    assert [c.rpc.type for c in node_caps] == [pb.NodeServiceCapability.RPC.STAGE_UNSTAGE_VOLUME]
    assert v0.node.NodeGetId(pb.NodeGetIdRequest(), timeout=TIMEOUT).node_id == "test-node"
    node_info = v0.node.NodeGetInfo(pb.NodeGetInfoRequest(), timeout=TIMEOUT)
    assert node_info.node_id == "test-node"
    assert dict(node_info.accessible_topology.segments) == {"lvm.csi.csilvm.io/node": "test-node"}


# --------------------------------------------------------------------- controller
def test_create_list_validate_delete(v0):
    assert v0.capacity() == 2 * GiB
    vol = v0.create("pvc-v0", 16 * MiB)
    assert vol.id and vol.capacity_bytes == 16 * MiB
    assert vol.attributes["lvm.csi.csilvm.io/name"] == "pvc-v0"
    assert [dict(t.segments) for t in vol.accessible_topology] == [{"lvm.csi.csilvm.io/node": "test-node"}]
    assert v0.create("pvc-v0", 16 * MiB) == vol  # idempotent
    assert code_of(v0.create, "pvc-v0", 32 * MiB) == grpc.StatusCode.ALREADY_EXISTS
    assert v0.capacity() == 2 * GiB - 16 * MiB

    listed = v0.controller.ListVolumes(pb.ListVolumesRequest(), timeout=TIMEOUT)
    assert [e.volume for e in listed.entries] == [vol] and listed.next_token == ""

    def validate(*caps, topology=()):
        request = pb.ValidateVolumeCapabilitiesRequest(
            volume_id=vol.id, volume_capabilities=list(caps), volume_attributes=vol.attributes,
            accessible_topology=[pb.Topology(segments=t) for t in topology],
        )
        return v0.controller.ValidateVolumeCapabilities(request, timeout=TIMEOUT)

    answer = validate(capability(), capability(block=True))
    assert answer.supported is True and answer.message == ""
    answer = validate(capability(mode=_MODE.MULTI_NODE_MULTI_WRITER))
    assert answer.supported is False and "MULTI_NODE_MULTI_WRITER" in answer.message
    answer = validate(capability(), topology=[{"lvm.csi.csilvm.io/node": "elsewhere"}])
    assert answer.supported is False and answer.message
    missing = pb.ValidateVolumeCapabilitiesRequest(volume_id="nope", volume_capabilities=[capability()])
    assert code_of(v0.controller.ValidateVolumeCapabilities, missing, timeout=TIMEOUT) == grpc.StatusCode.NOT_FOUND

    v0.delete(vol.id)
    v0.delete(vol.id)  # idempotent
    assert v0.capacity() == 2 * GiB
    assert list(v0.controller.ListVolumes(pb.ListVolumesRequest(), timeout=TIMEOUT).entries) == []


def test_capacity_honours_topology_and_unservable_capabilities(v0):
    def capacity(caps, segments=None):
        request = pb.GetCapacityRequest(volume_capabilities=caps)
        if segments is not None:
            request.accessible_topology.segments.update(segments)
        return v0.controller.GetCapacity(request, timeout=TIMEOUT).available_capacity

    assert capacity([capability(block=True)], {"lvm.csi.csilvm.io/node": "test-node"}) == 2 * GiB
    assert capacity([capability()], {"lvm.csi.csilvm.io/node": "elsewhere"}) == 0
    assert capacity([capability(mode=_MODE.MULTI_NODE_MULTI_WRITER)]) == 0


# --------------------------------------------------------------------- node
def test_mount_volume_stage_publish_keeps_data_and_the_co_target(v0, co_paths):
    staging, target = co_paths
    vol = v0.create("data-v0", 32 * MiB)
    v0.stage(vol, staging)
    v0.stage(vol, staging)  # idempotent
    v0.publish(vol, staging, target)  # onto the CO's existing empty directory
    v0.publish(vol, staging, target)  # idempotent
    with open(os.path.join(target, "hello.txt"), "w") as f:
        f.write("kept by v0")
    assert code_of(v0.delete, vol.id) == grpc.StatusCode.FAILED_PRECONDITION  # still in use

    v0.unpublish(vol.id, target)
    v0.unpublish(vol.id, target)  # idempotent
    assert os.path.isdir(target) and not is_mount_point(target), "v0: the CO owns the target, it must stay"
    assert os.listdir(target) == []

    v0.publish(vol, staging, target)
    with open(os.path.join(target, "hello.txt")) as f:
        assert f.read() == "kept by v0"
    v0.unpublish(vol.id, target)
    v0.unstage(vol.id, staging)
    v0.unstage(vol.id, staging)  # idempotent
    assert os.path.isdir(staging) and not is_mount_point(staging)
    v0.delete(vol.id)
    assert v0.capacity() == 2 * GiB


def test_block_volume_stage_publish_keeps_data_and_the_co_target(v0, co_paths, tmp_path):
    staging, _ = co_paths
    target = str(tmp_path / "co" / "block-target")
    open(target, "w").close()  # the CO's target: an empty file
    vol = v0.create("raw-v0", 8 * MiB, block=True)
    v0.stage(vol, staging, block=True)  # nothing to stage for block
    assert not is_mount_point(staging)
    v0.publish(vol, staging, target, block=True)
    v0.publish(vol, staging, target, block=True)  # idempotent
    payload = os.urandom(4096)
    with open(target, "r+b") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    with open(device_of(vol), "rb") as dev:
        assert dev.read(len(payload)) == payload
    v0.unpublish(vol.id, target)
    assert os.path.isfile(target) and not is_mount_point(target) and os.path.getsize(target) == 0
    v0.publish(vol, staging, target, block=True)
    with open(target, "rb") as f:
        assert f.read(len(payload)) == payload
    v0.unpublish(vol.id, target)
    v0.unstage(vol.id, staging)
    v0.delete(vol.id)


def test_publish_of_an_unstaged_mount_volume_is_failed_precondition(v0, co_paths):
    staging, target = co_paths
    vol = v0.create("unstaged-v0", 8 * MiB)
    assert code_of(v0.publish, vol, staging, target) == grpc.StatusCode.FAILED_PRECONDITION
    assert not is_mount_point(target)


# --------------------------------------------------------------------- errors
MOUNT = capability()
INVALID_REQUESTS = {
    "create without name": ("controller", "CreateVolume", pb.CreateVolumeRequest(volume_capabilities=[MOUNT])),
    "create without capabilities": ("controller", "CreateVolume", pb.CreateVolumeRequest(name="x")),
    "create with access type missing": ("controller", "CreateVolume", pb.CreateVolumeRequest(
        name="x", volume_capabilities=[pb.VolumeCapability(access_mode=_MODE(mode=_MODE.SINGLE_NODE_WRITER))])),
    "create with access mode missing": ("controller", "CreateVolume", pb.CreateVolumeRequest(
        name="x", volume_capabilities=[pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume())])),
    "create from a snapshot without its id": ("controller", "CreateVolume", pb.CreateVolumeRequest(
        name="x", volume_capabilities=[MOUNT],
        volume_content_source=pb.VolumeContentSource(snapshot=pb.VolumeContentSource.SnapshotSource()))),
    "create with negative size": ("controller", "CreateVolume", pb.CreateVolumeRequest(
        name="x", volume_capabilities=[MOUNT], capacity_range=pb.CapacityRange(required_bytes=-1))),
    "delete without id": ("controller", "DeleteVolume", pb.DeleteVolumeRequest()),
    "validate without id": ("controller", "ValidateVolumeCapabilities",
                            pb.ValidateVolumeCapabilitiesRequest(volume_capabilities=[MOUNT])),
    "validate without capabilities": ("controller", "ValidateVolumeCapabilities",
                                      pb.ValidateVolumeCapabilitiesRequest(volume_id="x")),
    "list with negative max_entries": ("controller", "ListVolumes", pb.ListVolumesRequest(max_entries=-1)),
    "stage without id": ("node", "NodeStageVolume", pb.NodeStageVolumeRequest(
        staging_target_path="/tmp/s", volume_capability=MOUNT)),
    "stage without staging path": ("node", "NodeStageVolume", pb.NodeStageVolumeRequest(
        volume_id="x", volume_capability=MOUNT)),
    "stage with relative staging path": ("node", "NodeStageVolume", pb.NodeStageVolumeRequest(
        volume_id="x", staging_target_path="rel/s", volume_capability=MOUNT)),
    "stage without capability": ("node", "NodeStageVolume", pb.NodeStageVolumeRequest(
        volume_id="x", staging_target_path="/tmp/s")),
    "unstage without staging path": ("node", "NodeUnstageVolume", pb.NodeUnstageVolumeRequest(volume_id="x")),
    "publish without target": ("node", "NodePublishVolume", pb.NodePublishVolumeRequest(
        volume_id="x", staging_target_path="/tmp/s", volume_capability=MOUNT)),
    "publish mount without staging path": ("node", "NodePublishVolume", pb.NodePublishVolumeRequest(
        volume_id="x", target_path="/tmp/t", volume_capability=MOUNT)),
    "unpublish without id": ("node", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(target_path="/tmp/t")),
    "unpublish without target": ("node", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(volume_id="x")),
}


@pytest.mark.parametrize("case", sorted(INVALID_REQUESTS))
def test_missing_or_malformed_fields_are_invalid_argument(v0, case):
    service, method, request = INVALID_REQUESTS[case]
    call = getattr(getattr(v0, service), method)
    assert code_of(call, request, timeout=TIMEOUT) == grpc.StatusCode.INVALID_ARGUMENT


def test_unknown_volume_and_unoffered_rpcs(v0, co_paths):
    staging, target = co_paths
    stage = pb.NodeStageVolumeRequest(volume_id="nope", staging_target_path=staging, volume_capability=MOUNT)
    assert code_of(v0.node.NodeStageVolume, stage, timeout=TIMEOUT) == grpc.StatusCode.NOT_FOUND
    publish = pb.ControllerPublishVolumeRequest(volume_id="x", node_id="test-node", volume_capability=MOUNT)
    assert code_of(v0.controller.ControllerPublishVolume, publish, timeout=TIMEOUT) == grpc.StatusCode.UNIMPLEMENTED
    snapshot = pb.CreateSnapshotRequest(source_volume_id="x", name="s")
    assert code_of(v0.controller.CreateSnapshot, snapshot, timeout=TIMEOUT) == grpc.StatusCode.NOT_FOUND
    restore = pb.CreateVolumeRequest(
        name="r", volume_capabilities=[MOUNT],
        volume_content_source=pb.VolumeContentSource(snapshot=pb.VolumeContentSource.SnapshotSource(id="nope")),
    )
    assert code_of(v0.controller.CreateVolume, restore, timeout=TIMEOUT) == grpc.StatusCode.NOT_FOUND


# --------------------------------------------------------------------- which versions are served
PROBES = {
    "v1": lambda ch: v1_grpc.IdentityStub(ch).GetPluginInfo(v1_pb.GetPluginInfoRequest(), timeout=TIMEOUT),
    "v0": lambda ch: csi_pb2_grpc.IdentityStub(ch).GetPluginInfo(pb.GetPluginInfoRequest(), timeout=TIMEOUT),
    "v0.1": lambda ch: v0_1_grpc.IdentityStub(ch).GetSupportedVersions(v0_1_pb.GetSupportedVersionsRequest(), timeout=TIMEOUT),
}


@pytest.fixture
def serve_in_process():
    """``serve(api_versions)`` -> a channel to a server started in this process on an in-memory lvm2."""
    from lvm.command import SubprocessRunner
    from tests.fake_lvm2 import FakeLvm
    from lvm.lvm2 import Lvm2
    from lvm.volume_group import LvmBackend
    from plugin.core import Core
    from plugin.server import start_server
    from plugin.settings import PluginSettings

    started = []

    def serve(api_versions):
        fake = FakeLvm({"/dev/fake-a": 65 * MiB})
        backend = LvmBackend("vgv", Lvm2(fake), devices=["/dev/fake-a"], default_size=4 * MiB,
                             wipe=lambda path: None, raid_supported=lambda: False)
        backend.ensure_volume_group()
        sock_dir = tempfile.mkdtemp(prefix="csi-", dir="/tmp")
        running = start_server(Core(backend, PluginSettings(node_id="n"), SubprocessRunner()),
                               f"unix://{sock_dir}/csi.sock", api_versions=api_versions)
        channel = grpc.insecure_channel(f"unix://{sock_dir}/csi.sock")
        started.append((running, channel, sock_dir))
        return channel

    yield serve
    for running, channel, sock_dir in started:
        channel.close()
        running.stop(grace=1)
        Path(sock_dir).rmdir()


def _answers(probe, channel) -> bool:
    try:
        probe(channel)
        return True
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.UNIMPLEMENTED, exc
        return False


@pytest.mark.parametrize("served", [("v0",), ("v1",), ("v0.1",), ("v0", "v0.1"), None])
def test_only_the_chosen_api_versions_are_served(serve_in_process, served):
    channel = serve_in_process(served)
    answering = {name for name, probe in PROBES.items() if _answers(probe, channel)}
    assert answering == set(served or PROBES)
