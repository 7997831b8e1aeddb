"""Identity and Controller over the socket, against `csilvm serve --backend loop`."""

from __future__ import annotations

import concurrent.futures

import grpc
import pytest

from protos.v1 import csi_pb2 as pb
from plugin.client import volume_capability

MiB = 1 << 20
GiB = 1 << 30


def code_of(call, *args, **kwargs) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call(*args, **kwargs)
    assert err.value.details(), "every error carries a message a person can act on"
    return err.value.code()


# ------------------------------------------------------------------ identity
def test_plugin_info_and_capabilities(csi):
    info = csi.info()
    assert info.name == "lvm.csi.csilvm.io"
    assert info.vendor_version
    assert info.manifest["backend"] == "loop"
    capabilities = csi.plugin_capabilities().capabilities
    services = {c.service.type for c in capabilities if c.HasField("service")}
    assert services == {
        pb.PluginCapability.Service.CONTROLLER_SERVICE,
        pb.PluginCapability.Service.VOLUME_ACCESSIBILITY_CONSTRAINTS,
    }
    expansion = [c.volume_expansion.type for c in capabilities if c.HasField("volume_expansion")]
    assert expansion == [pb.PluginCapability.VolumeExpansion.ONLINE]
    assert csi.probe().ready.value is True


def test_controller_capabilities_never_empty(csi):
    rpc = pb.ControllerServiceCapability.RPC
    kinds = {c.rpc.type for c in csi.controller_capabilities().capabilities}
    assert {rpc.CREATE_DELETE_VOLUME, rpc.LIST_VOLUMES, rpc.GET_CAPACITY} <= kinds
    assert {rpc.EXPAND_VOLUME, rpc.GET_VOLUME, rpc.VOLUME_CONDITION, rpc.MODIFY_VOLUME} <= kinds


# -------------------------------------------------------------- create/delete
def test_create_is_idempotent_by_name(csi):
    first = csi.create("pvc-0001", 10 * MiB)
    again = csi.create("pvc-0001", 10 * MiB)
    assert first.volume_id == again.volume_id == "pvc-0001"
    assert first.capacity_bytes == again.capacity_bytes == 10 * MiB
    assert dict(first.accessible_topology[0].segments) == {"lvm.csi.csilvm.io/node": "test-node"}
    assert [v.volume_id for v in csi.all_volumes()] == ["pvc-0001"]


def test_incompatible_create_is_already_exists(csi):
    csi.create("pvc-0002", 10 * MiB)
    assert code_of(csi.create, "pvc-0002", 20 * MiB) == grpc.StatusCode.ALREADY_EXISTS


def test_capacity_range_is_honoured_exactly(csi):
    assert csi.create("a", 5 * MiB + 1).capacity_bytes == 6 * MiB
    assert csi.create("b", 0, 3 * MiB + 5).capacity_bytes == 3 * MiB  # no minimum: largest that fits the limit
    assert csi.create("c", 7 * MiB, 7 * MiB).capacity_bytes == 7 * MiB
    assert code_of(csi.create, "d", 5 * MiB + 1, 5 * MiB + 2) == grpc.StatusCode.OUT_OF_RANGE
    assert code_of(csi.create, "e", 8 * MiB, 4 * MiB) == grpc.StatusCode.OUT_OF_RANGE


def test_default_size_without_range(plugin_factory):
    csi = plugin_factory("--default-size", "12MiB").start()
    assert csi.create("dflt").capacity_bytes == 12 * MiB


def test_names_that_are_not_lv_names_map_deterministically(csi):
    name = "ns/claim with spaces ü"
    first = csi.create(name, MiB)
    assert first.volume_id != name and "/" not in first.volume_id
    assert csi.create(name, MiB).volume_id == first.volume_id
    assert first.volume_context["lvm.csi.csilvm.io/name"] == name


def test_delete_is_idempotent_and_unknown_ids_succeed(csi):
    vol = csi.create("gone", MiB)
    csi.delete(vol.volume_id)
    csi.delete(vol.volume_id)
    for weird in ("does-not-exist", "../../etc/passwd", "a/b", "-rf", ".."):
        csi.delete(weird)
    assert csi.all_volumes() == []


def test_get_capacity_is_exact_for_linear(plugin_factory):
    csi = plugin_factory(capacity="64MiB").start()
    cap = csi.capacity({"type": "linear"})
    assert cap.available_capacity == 64 * MiB
    assert cap.maximum_volume_size.value == 64 * MiB
    assert cap.minimum_volume_size.value == MiB
    csi.create("x", 10 * MiB)
    cap = csi.capacity({})
    assert cap.available_capacity == 54 * MiB
    maximum = cap.maximum_volume_size.value
    assert code_of(csi.create, "too-big", maximum + MiB) == grpc.StatusCode.OUT_OF_RANGE
    assert csi.create("exact", maximum).capacity_bytes == maximum
    assert csi.capacity({}).available_capacity == 0
    csi.delete("x")
    assert csi.capacity({}).available_capacity == 10 * MiB


def test_get_capacity_is_zero_for_what_cannot_be_served(csi):
    assert csi.capacity({"type": "raid1"}).available_capacity == 0  # the sandbox is linear only
    assert csi.capacity({"colour": "blue"}).available_capacity == 0
    response = csi.controller.GetCapacity(
        csi_request_capacity_multi_node(), timeout=10
    )
    assert response.available_capacity == 0
    other_node = csi.controller.GetCapacity(
        pb.GetCapacityRequest(accessible_topology=pb.Topology(segments={"lvm.csi.csilvm.io/node": "elsewhere"})),
        timeout=10,
    )
    assert other_node.available_capacity == 0


def csi_request_capacity_multi_node():
    return pb.GetCapacityRequest(volume_capabilities=[volume_capability(mode="MULTI_NODE_MULTI_WRITER")])


def test_create_rejects_what_cannot_be_served(csi):
    assert code_of(csi.create, "r1", MiB, parameters={"type": "raid1"}) == grpc.StatusCode.OUT_OF_RANGE
    assert code_of(csi.create, "p", MiB, parameters={"colour": "blue"}) == grpc.StatusCode.INVALID_ARGUMENT
    request = pb.CreateVolumeRequest(
        name="multi",
        volume_capabilities=[volume_capability(mode="MULTI_NODE_MULTI_WRITER")],
    )
    assert code_of(csi.controller.CreateVolume, request) == grpc.StatusCode.INVALID_ARGUMENT
    elsewhere = pb.CreateVolumeRequest(
        name="elsewhere",
        volume_capabilities=[volume_capability()],
        accessibility_requirements=pb.TopologyRequirement(
            requisite=[pb.Topology(segments={"lvm.csi.csilvm.io/node": "other-node"})]
        ),
    )
    assert code_of(csi.controller.CreateVolume, elsewhere) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert csi.all_volumes() == []


def test_kubernetes_extra_create_metadata_is_ignored(csi):
    vol = csi.create("pvc-k8s", MiB, parameters={"csi.storage.k8s.io/pvc/name": "data", "type": "linear"})
    assert vol.volume_id == "pvc-k8s"


@pytest.mark.parametrize(
    "request_",
    [
        pb.CreateVolumeRequest(volume_capabilities=[volume_capability()]),
        pb.CreateVolumeRequest(name="no-caps"),
        pb.CreateVolumeRequest(name="no-mode", volume_capabilities=[pb.VolumeCapability(block=pb.VolumeCapability.BlockVolume())]),
        pb.CreateVolumeRequest(
            name="clone",
            volume_capabilities=[volume_capability()],
            volume_content_source=pb.VolumeContentSource(volume=pb.VolumeContentSource.VolumeSource(volume_id="")),
        ),
        pb.CreateVolumeRequest(
            name="restore", volume_capabilities=[volume_capability()], volume_content_source=pb.VolumeContentSource(),
        ),
    ],
    ids=["no-name", "no-capabilities", "no-access-mode", "content-source-without-id", "content-source-empty"],
)
def test_malformed_create_is_invalid_argument(csi, request_):
    assert code_of(csi.controller.CreateVolume, request_) == grpc.StatusCode.INVALID_ARGUMENT


def test_missing_ids_are_invalid_argument(csi):
    assert code_of(csi.controller.DeleteVolume, pb.DeleteVolumeRequest()) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(csi.controller.ValidateVolumeCapabilities, pb.ValidateVolumeCapabilitiesRequest()) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(csi.controller.ListVolumes, pb.ListVolumesRequest(max_entries=-1)) == grpc.StatusCode.INVALID_ARGUMENT


def test_unimplemented_rpcs_say_so(csi):
    request = pb.ControllerPublishVolumeRequest(volume_id="x", node_id="n")
    assert code_of(csi.controller.ControllerPublishVolume, request) == grpc.StatusCode.UNIMPLEMENTED


# ---------------------------------------------------------------- validation
def test_validate_volume_capabilities(csi):
    vol = csi.create("vvc", MiB)
    ok = csi.controller.ValidateVolumeCapabilities(
        pb.ValidateVolumeCapabilitiesRequest(volume_id=vol.volume_id, volume_capabilities=[volume_capability(block=True)]),
        timeout=10,
    )
    assert ok.HasField("confirmed") and len(ok.confirmed.volume_capabilities) == 1
    refused = csi.controller.ValidateVolumeCapabilities(
        pb.ValidateVolumeCapabilitiesRequest(
            volume_id=vol.volume_id, volume_capabilities=[volume_capability(mode="MULTI_NODE_MULTI_WRITER")]
        ),
        timeout=10,
    )
    assert not refused.HasField("confirmed") and "MULTI_NODE_MULTI_WRITER" in refused.message
    missing = pb.ValidateVolumeCapabilitiesRequest(volume_id="nope", volume_capabilities=[volume_capability()])
    assert code_of(csi.controller.ValidateVolumeCapabilities, missing) == grpc.StatusCode.NOT_FOUND


# --------------------------------------------------------------- list/paging
def test_list_volumes_paginates_stably_while_volumes_change(csi):
    for i in range(7):
        csi.create(f"vol-{i}", MiB)
    first = csi.list_volumes(max_entries=3)
    assert [e.volume.volume_id for e in first.entries] == ["vol-0", "vol-1", "vol-2"]
    assert first.next_token
    csi.delete("vol-1")  # behind the cursor
    csi.delete("vol-3")  # ahead of the cursor
    csi.create("vol-25", MiB)  # sorts after vol-2
    second = csi.list_volumes(max_entries=3, starting_token=first.next_token)
    assert [e.volume.volume_id for e in second.entries] == ["vol-25", "vol-4", "vol-5"]
    third = csi.list_volumes(max_entries=3, starting_token=second.next_token)
    assert [e.volume.volume_id for e in third.entries] == ["vol-6"]
    assert third.next_token == ""
    entry = third.entries[0].volume
    assert entry.capacity_bytes == MiB
    assert entry.volume_context["lvm.csi.csilvm.io/type"] == "linear"


def test_bad_token_is_aborted(csi):
    assert code_of(csi.list_volumes, 2, "not-a-token") == grpc.StatusCode.ABORTED


# ----------------------------------------------------------------- concurrency
def test_parallel_creates_with_repeated_names_make_one_volume_per_name(csi):
    names = [f"par-{i % 8}" for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        volumes = list(pool.map(lambda n: csi.create(n, 2 * MiB), names))
    assert {v.volume_id for v in volumes} == {f"par-{i}" for i in range(8)}
    assert sorted(v.volume_id for v in csi.all_volumes()) == sorted({f"par-{i}" for i in range(8)})
    assert csi.capacity({}).available_capacity == 2 * GiB - 16 * MiB
