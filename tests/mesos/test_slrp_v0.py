"""The SLRP over CSI v0 (0.3, ``csi.v0``), ``--api_version`` isolation, and a short CSI 0.1 sequence.

Skipped, with the reason, until protos/v0 (protos/v0_1) exist and plugin/versions.py registers "v0" ("v0.1").
"""

from __future__ import annotations

import importlib
import os
import uuid

import grpc
import pytest

from tests.mesos.conftest import needs_root
from tests.mesos.harness import MiB, BackendSpec, CsiV0, CsiV1, mount_fs_type

pytestmark = needs_root

HANDSHAKE_V0 = ["GetPluginInfo", "GetPluginCapabilities", "Probe", "ControllerGetCapabilities", "NodeGetCapabilities", "NodeGetId"]


def require(version: str, package: str):
    """The ``csi_pb2``, ``csi_pb2_grpc`` modules of ``protos.<package>``, or skip saying what is missing."""
    try:
        pb = importlib.import_module(f"protos.{package}.csi_pb2")
        pb_grpc = importlib.import_module(f"protos.{package}.csi_pb2_grpc")
    except ImportError as exc:
        pytest.skip(f"CSI {version} not available yet: protos.{package} is not importable ({exc})")
    from plugin.versions import API_VERSIONS

    if version not in API_VERSIONS:
        pytest.skip(f"CSI {version} not available yet: plugin/versions.py does not register {version!r}")
    return pb, pb_grpc


def test_slrp_life_cycle_over_v0(slrp):
    require("v0", "v0")
    report = slrp("v0", BackendSpec("loop", available="1GB", volumes={"pre": "3MB"})).run()
    assert report.calls[: len(HANDSHAKE_V0)] == HANDSHAKE_V0
    assert report.handshake["node_id"] == "localhost"
    assert {d.id: d.capacity for d in report.pre_existing} == {"pre": 3 * MiB}
    assert report.initial_capacity == {"raid0": 0, "raid1": 0, "fast": 1 << 30, "block": 1 << 30}
    assert report.exercised == ["fast", "block"] and report.killed_during == "fast"


def _unimplemented(call) -> bool:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code() == grpc.StatusCode.UNIMPLEMENTED
    return False


@pytest.mark.parametrize("served, hidden", [("v0", "v1"), ("v1", "v0")])
def test_api_version_serves_only_that_version(containers, served, hidden):
    require("v0", "v0")
    container = containers({"CSI_AVAILABLE_CAPACITY": "8MB"}, f"--api_version={served}")
    container.launch()
    apis = {"v0": CsiV0(container.endpoint), "v1": CsiV1(container.endpoint)}
    try:
        assert apis[served].handshake()["ready"]
        hide = apis[hidden]
        assert _unimplemented(lambda: hide.identity.Probe(hide.pb.ProbeRequest(), timeout=30))
        assert _unimplemented(lambda: hide.controller.ListVolumes(hide.pb.ListVolumesRequest(), timeout=30))
    finally:
        for api in apis.values():
            api.close()


def test_all_versions_by_default(containers):
    require("v0", "v0")
    container = containers({"CSI_AVAILABLE_CAPACITY": "8MB", "CSI_VOLUMES": "pre:1MB"})
    container.launch()
    v0, v1 = CsiV0(container.endpoint), CsiV1(container.endpoint)
    try:
        assert [d.id for d in v0.list_volumes()] == [d.id for d in v1.list_volumes()] == ["pre"]
    finally:
        v0.close()
        v1.close()


def test_csi_0_1_sequence(containers):
    pb, pb_grpc = require("v0.1", "v0_1")
    # CSILVM_STATE_DIR: the plugin's private 0.1 staging mounts stay under this test's directory.
    container = containers({"CSI_AVAILABLE_CAPACITY": "64MB"}, "--api_version=v0.1")
    container.env["CSILVM_STATE_DIR"] = str(container.work_dir.parent / "state")
    container.launch()
    channel = grpc.insecure_channel(container.endpoint)
    identity, controller, node = (pb_grpc.IdentityStub(channel), pb_grpc.ControllerStub(channel), pb_grpc.NodeStub(channel))
    version = pb.Version(major=0, minor=1, patch=0)
    capability = pb.VolumeCapability(
        mount=pb.VolumeCapability.MountVolume(fs_type="ext4"),
        access_mode=pb.VolumeCapability.AccessMode(mode=pb.VolumeCapability.AccessMode.Mode.Value("SINGLE_NODE_WRITER")),
    )
    target = container.work_dir.parent / "mounts" / "target"
    try:
        supported = identity.GetSupportedVersions(pb.GetSupportedVersionsRequest(), timeout=30).supported_versions
        assert (0, 1, 0) in {(v.major, v.minor, v.patch) for v in supported}
        controller.ControllerProbe(pb.ControllerProbeRequest(version=version), timeout=30)
        with pytest.raises(grpc.RpcError) as err:  # 0.1: every request carries its version
            controller.ControllerProbe(pb.ControllerProbeRequest(), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        def capacity():
            request = pb.GetCapacityRequest(version=version, volume_capabilities=[capability])
            return controller.GetCapacity(request, timeout=30).available_capacity

        assert capacity() == 64 * MiB
        name, size = str(uuid.uuid4()), 13 * MiB
        info = controller.CreateVolume(pb.CreateVolumeRequest(
            version=version, name=name, volume_capabilities=[capability],
            capacity_range=pb.CapacityRange(required_bytes=size, limit_bytes=size),
        ), timeout=120).volume_info
        assert info.capacity_bytes == size and capacity() == 64 * MiB - size
        target.mkdir(parents=True)  # 0.1: the CO makes the target
        node.NodePublishVolume(pb.NodePublishVolumeRequest(
            version=version, volume_id=info.id, target_path=str(target),
            volume_capability=capability, volume_attributes=dict(info.attributes),
        ), timeout=120)
        assert mount_fs_type(target) == "ext4"
        data = os.urandom(4096)
        (target / "data").write_bytes(data)
        assert (target / "data").read_bytes() == data
        node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(version=version, volume_id=info.id, target_path=str(target)), timeout=120)
        assert mount_fs_type(target) is None
        if target.exists():
            target.rmdir()
        controller.DeleteVolume(pb.DeleteVolumeRequest(version=version, volume_id=info.id), timeout=120)
        assert capacity() == 64 * MiB
    finally:
        channel.close()

