"""CSI 0.1 (``package csi``, Mesos 1.5) over the socket of `csilvm serve --backend loop`, beside v1 and v0.

0.1 has no staging: the plugin stages mount volumes itself under
``$CSILVM_STATE_DIR/csi-0.1-staging``; here the state dir is inside the test's
tmp_path, so the conftest clean-up unmounts whatever a failing test leaves.
"""

from __future__ import annotations

import os

import grpc
import pytest

from mount.table import read_mount_table
from protos.v0_1 import csi_pb2 as pb
from protos.v0_1 import csi_pb2_grpc
from tests.e2e.test_controller import GiB, MiB, code_of

_MODE = pb.VolumeCapability.AccessMode
TIMEOUT = 60
VERSION = pb.Version(major=0, minor=1, patch=0)


def capability(block: bool = False, mode: int = _MODE.SINGLE_NODE_WRITER) -> pb.VolumeCapability:
    if block:
        return pb.VolumeCapability(block=pb.VolumeCapability.BlockVolume(), access_mode=_MODE(mode=mode))
    return pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume(fs_type="ext4"), access_mode=_MODE(mode=mode))


class V01:
    """Stubs of the three 0.1 services on one channel; every request carries VERSION."""

    def __init__(self, channel: grpc.Channel):
        self.identity = csi_pb2_grpc.IdentityStub(channel)
        self.controller = csi_pb2_grpc.ControllerStub(channel)
        self.node = csi_pb2_grpc.NodeStub(channel)

    def capacity(self) -> int:
        request = pb.GetCapacityRequest(version=VERSION, volume_capabilities=[capability()])
        return self.controller.GetCapacity(request, timeout=TIMEOUT).available_capacity

    def create(self, name: str, size: int, block: bool = False) -> pb.VolumeInfo:
        request = pb.CreateVolumeRequest(
            version=VERSION, name=name, volume_capabilities=[capability(block)],
            capacity_range=pb.CapacityRange(required_bytes=size, limit_bytes=size),
        )
        return self.controller.CreateVolume(request, timeout=TIMEOUT).volume_info

    def publish(self, info: pb.VolumeInfo, target: str, block: bool = False, readonly: bool = False) -> None:
        request = pb.NodePublishVolumeRequest(
            version=VERSION, volume_id=info.id, target_path=target, readonly=readonly,
            volume_capability=capability(block), volume_attributes=info.attributes,
        )
        self.node.NodePublishVolume(request, timeout=TIMEOUT)

    def unpublish(self, volume_id: str, target: str) -> None:
        request = pb.NodeUnpublishVolumeRequest(version=VERSION, volume_id=volume_id, target_path=target)
        self.node.NodeUnpublishVolume(request, timeout=TIMEOUT)

    def delete(self, volume_id: str) -> None:
        self.controller.DeleteVolume(pb.DeleteVolumeRequest(version=VERSION, volume_id=volume_id), timeout=TIMEOUT)


@pytest.fixture
def state_dir(tmp_path):
    return tmp_path / "state"


@pytest.fixture
def v01(plugin_factory, state_dir):
    p = plugin_factory()
    p.env = {**os.environ, "CSILVM_STATE_DIR": str(state_dir)}
    p.start()
    channel = grpc.insecure_channel(f"unix://{p.socket}")
    yield V01(channel)
    channel.close()


def mounts_below(path) -> list[str]:
    return [e.mount_point for e in read_mount_table().under(os.path.realpath(path))]


def is_mount_point(path) -> bool:
    return read_mount_table().is_mount_point(os.path.realpath(path))


# --------------------------------------------------------------------- identity, versions, probes
def test_supported_versions_probes_and_node_id(v01):
    supported = v01.identity.GetSupportedVersions(pb.GetSupportedVersionsRequest(), timeout=TIMEOUT).supported_versions
    assert [(v.major, v.minor, v.patch) for v in supported] == [(0, 1, 0)]
    info = v01.identity.GetPluginInfo(pb.GetPluginInfoRequest(version=VERSION), timeout=TIMEOUT)
    assert info.name == "lvm.csi.csilvm.io" and info.vendor_version and info.manifest["backend"] == "loop"
    v01.controller.ControllerProbe(pb.ControllerProbeRequest(version=VERSION), timeout=TIMEOUT)
    v01.node.NodeProbe(pb.NodeProbeRequest(version=VERSION), timeout=TIMEOUT)
    assert v01.node.GetNodeID(pb.GetNodeIDRequest(version=VERSION), timeout=TIMEOUT).node_id == "test-node"
    rpc = pb.ControllerServiceCapability.RPC
    caps = v01.controller.ControllerGetCapabilities(pb.ControllerGetCapabilitiesRequest(version=VERSION), timeout=TIMEOUT)
    assert {c.rpc.type for c in caps.capabilities} == {rpc.CREATE_DELETE_VOLUME, rpc.LIST_VOLUMES, rpc.GET_CAPACITY}
    node_caps = v01.node.NodeGetCapabilities(pb.NodeGetCapabilitiesRequest(version=VERSION), timeout=TIMEOUT)
    assert list(node_caps.capabilities) == []


REQUESTS_WITH_VERSION = {
    "GetPluginInfo": ("identity", pb.GetPluginInfoRequest),
    "ControllerProbe": ("controller", pb.ControllerProbeRequest),
    "ControllerGetCapabilities": ("controller", pb.ControllerGetCapabilitiesRequest),
    "GetCapacity": ("controller", pb.GetCapacityRequest),
    "ListVolumes": ("controller", pb.ListVolumesRequest),
    "CreateVolume": ("controller", lambda **kw: pb.CreateVolumeRequest(name="v", volume_capabilities=[capability()], **kw)),
    "DeleteVolume": ("controller", lambda **kw: pb.DeleteVolumeRequest(volume_id="v", **kw)),
    "NodeProbe": ("node", pb.NodeProbeRequest),
    "GetNodeID": ("node", pb.GetNodeIDRequest),
    "NodeGetCapabilities": ("node", pb.NodeGetCapabilitiesRequest),
    "NodePublishVolume": ("node", lambda **kw: pb.NodePublishVolumeRequest(
        volume_id="v", target_path="/tmp/t", volume_capability=capability(), **kw)),
    "NodeUnpublishVolume": ("node", lambda **kw: pb.NodeUnpublishVolumeRequest(volume_id="v", target_path="/tmp/t", **kw)),
}


@pytest.mark.parametrize("method", sorted(REQUESTS_WITH_VERSION))
def test_missing_or_unsupported_version_is_invalid_argument(v01, method):
    service, make = REQUESTS_WITH_VERSION[method]
    call = getattr(getattr(v01, service), method)
    for version, expected in [(None, "version missing"), (pb.Version(major=0, minor=2, patch=0), "0.2.0"),
                              (pb.Version(), "0.0.0"), (pb.Version(major=1), "1.0.0")]:
        request = make() if version is None else make(version=version)
        with pytest.raises(grpc.RpcError) as err:
            call(request, timeout=TIMEOUT)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, version)
        assert expected in err.value.details()


# --------------------------------------------------------------------- controller
def test_create_list_validate_delete(v01):
    assert v01.capacity() == 2 * GiB
    info = v01.create("mesos-a", 13 * MiB)
    assert info.id and info.capacity_bytes == 13 * MiB and info.attributes["lvm.csi.csilvm.io/name"] == "mesos-a"
    assert v01.create("mesos-a", 13 * MiB) == info  # idempotent
    assert code_of(v01.create, "mesos-a", 20 * MiB) == grpc.StatusCode.ALREADY_EXISTS
    assert v01.capacity() == 2 * GiB - 13 * MiB
    listed = v01.controller.ListVolumes(pb.ListVolumesRequest(version=VERSION), timeout=TIMEOUT)
    assert [e.volume_info for e in listed.entries] == [info]

    def validate(cap):
        request = pb.ValidateVolumeCapabilitiesRequest(
            version=VERSION, volume_id=info.id, volume_capabilities=[cap], volume_attributes=info.attributes
        )
        return v01.controller.ValidateVolumeCapabilities(request, timeout=TIMEOUT)

    assert validate(capability()).supported is True
    answer = validate(capability(mode=_MODE.MULTI_NODE_MULTI_WRITER))
    assert answer.supported is False and "MULTI_NODE_MULTI_WRITER" in answer.message

    v01.delete(info.id)
    v01.delete(info.id)  # idempotent
    assert v01.capacity() == 2 * GiB


@pytest.mark.parametrize("request_", [
    pb.CreateVolumeRequest(version=VERSION, volume_capabilities=[capability()]),
    pb.CreateVolumeRequest(version=VERSION, name="x"),
    pb.DeleteVolumeRequest(version=VERSION),
], ids=["create without name", "create without capabilities", "delete without id"])
def test_missing_controller_fields_are_invalid_argument(v01, request_):
    call = getattr(v01.controller, type(request_).__name__[: -len("Request")])
    assert code_of(call, request_, timeout=TIMEOUT) == grpc.StatusCode.INVALID_ARGUMENT


# --------------------------------------------------------------------- node: publish without staging
def test_publish_mounts_and_data_survives_unpublish_and_republish(v01, tmp_path, state_dir):
    info = v01.create("mesos-data", 32 * MiB)
    target = tmp_path / "mounts" / info.id
    target.mkdir(parents=True)  # 0.1: the CO makes the target
    v01.publish(info, str(target))
    v01.publish(info, str(target))  # idempotent
    assert is_mount_point(target)
    [staging] = mounts_below(state_dir)  # staged privately, under the state dir
    (target / "data").write_text("survives")

    v01.unpublish(info.id, str(target))
    v01.unpublish(info.id, str(target))  # idempotent
    assert target.is_dir() and not is_mount_point(target), "the CO owns the target: unmounted, not removed"
    assert list(target.iterdir()) == []
    assert mounts_below(state_dir) == [] and not os.path.exists(staging), "unpublish unstages"

    v01.publish(info, str(target))
    assert (target / "data").read_text() == "survives"
    v01.unpublish(info.id, str(target))
    v01.delete(info.id)
    assert v01.capacity() == 2 * GiB


def test_staging_is_kept_while_another_target_uses_it(v01, tmp_path, state_dir):
    info = v01.create("mesos-shared", 16 * MiB)
    first, second = tmp_path / "t1", tmp_path / "t2"
    first.mkdir()
    second.mkdir()
    v01.publish(info, str(first))
    v01.publish(info, str(second), readonly=True)
    assert len(mounts_below(state_dir)) == 1  # one staging mount for both targets
    (first / "f").write_text("shared")
    v01.unpublish(info.id, str(first))
    assert len(mounts_below(state_dir)) == 1
    assert (second / "f").read_text() == "shared"
    with pytest.raises(OSError):
        (second / "g").write_text("read-only")
    v01.unpublish(info.id, str(second))
    assert mounts_below(state_dir) == []
    v01.delete(info.id)


def test_block_publish(v01, tmp_path, state_dir):
    info = v01.create("mesos-raw", 8 * MiB, block=True)
    target = tmp_path / "raw"
    v01.publish(info, str(target), block=True)
    payload = os.urandom(4096)
    with open(target, "r+b") as f:
        f.write(payload)
    assert mounts_below(state_dir) == []  # nothing staged for block
    v01.unpublish(info.id, str(target))
    assert not is_mount_point(target)
    v01.publish(info, str(target), block=True)
    assert target.read_bytes()[: len(payload)] == payload
    v01.unpublish(info.id, str(target))
    v01.delete(info.id)


def test_node_errors(v01, tmp_path):
    relative = pb.NodePublishVolumeRequest(version=VERSION, volume_id="x", target_path="rel", volume_capability=capability())
    assert code_of(v01.node.NodePublishVolume, relative, timeout=TIMEOUT) == grpc.StatusCode.INVALID_ARGUMENT
    no_capability = pb.NodePublishVolumeRequest(version=VERSION, volume_id="x", target_path=str(tmp_path / "t"))
    assert code_of(v01.node.NodePublishVolume, no_capability, timeout=TIMEOUT) == grpc.StatusCode.INVALID_ARGUMENT
    unknown = pb.NodePublishVolumeRequest(
        version=VERSION, volume_id="nope", target_path=str(tmp_path / "t"), volume_capability=capability()
    )
    assert code_of(v01.node.NodePublishVolume, unknown, timeout=TIMEOUT) == grpc.StatusCode.NOT_FOUND
    v01.unpublish("nope", str(tmp_path / "t"))  # nothing published: fine
    publish = pb.ControllerPublishVolumeRequest(version=VERSION, volume_id="x", volume_capability=capability())
    assert code_of(v01.controller.ControllerPublishVolume, publish, timeout=TIMEOUT) == grpc.StatusCode.UNIMPLEMENTED
