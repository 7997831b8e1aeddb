"""The CSI layer on the lvm backend, over a real gRPC socket, with lvm2 simulated by FakeLvm.

No root and no device-mapper needed: this proves the translation (profiles,
exact capacity, pre-existing LVs, pagination, error codes) and counts the lvm2
commands each RPC costs.  Real lvm2 runs in the VM suite (tests/vm).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import grpc
import pytest

from lvm.command import SubprocessRunner
from tests.fake_lvm2 import FakeLvm
from lvm.lvm2 import Lvm2
from lvm.volume_group import LvmBackend
from plugin.client import CsiClient
from plugin.core import Core
from plugin.server import start_server
from plugin.settings import PluginSettings

MiB = 1 << 20
VG = "vgtest"
# Three PVs of different sizes: 100, 200 and 300 extents of 1 MiB.
DEVICES = {"/dev/fake-a": 101 * MiB, "/dev/fake-b": 201 * MiB, "/dev/fake-c": 301 * MiB}


@pytest.fixture
def fake() -> FakeLvm:
    return FakeLvm(dict(DEVICES))


@pytest.fixture
def csi(fake):
    backend = LvmBackend(
        VG, Lvm2(fake), devices=list(DEVICES), default_size=16 * MiB, wipe=lambda path: None, raid_supported=lambda: True
    )
    backend.ensure_volume_group()
    core = Core(backend, PluginSettings(node_id="lvm-node"), SubprocessRunner())
    sock_dir = tempfile.mkdtemp(prefix="csi-", dir="/tmp")
    running = start_server(core, f"unix://{sock_dir}/csi.sock", api_versions=("v1",))
    client = CsiClient(f"{sock_dir}/csi.sock", timeout=30)
    yield client
    client.close()
    running.stop(grace=1)
    Path(sock_dir).rmdir()


def code_of(call, *args, **kwargs) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call(*args, **kwargs)
    assert err.value.details()
    return err.value.code()


def free_extents(fake: FakeLvm) -> int:
    return sum(fake.free_extents(VG).values())


PROFILES = [
    {"type": "linear"},
    {"type": "raid0", "stripes": "2"},
    {"type": "raid0", "stripes": "3"},
    {"type": "raid0"},
    {"type": "raid1"},
    {"type": "raid1", "mirrors": "2"},
]


@pytest.mark.parametrize("params", PROFILES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_maximum_volume_size_is_exact_for_every_profile(csi, fake, params):
    cap = csi.capacity(params)
    maximum = cap.maximum_volume_size.value
    assert maximum > 0 and cap.available_capacity >= maximum
    granularity = cap.minimum_volume_size.value
    assert code_of(csi.create, "too-big", maximum + granularity, parameters=params) == grpc.StatusCode.OUT_OF_RANGE
    assert fake.lv_names(VG) == [], "a refused create leaves nothing behind"
    volume = csi.create("biggest", maximum, parameters=params)
    assert volume.capacity_bytes == maximum
    assert volume.volume_context["lvm.csi.csilvm.io/type"] == params["type"]


def test_raid1_needs_distinct_pvs(csi):
    assert csi.capacity({"type": "raid1", "mirrors": "3"}).available_capacity == 0  # 4 legs, 3 PVs
    assert code_of(csi.create, "r", MiB, parameters={"type": "raid1", "mirrors": "3"}) == grpc.StatusCode.OUT_OF_RANGE
    assert code_of(csi.create, "s", 4 * MiB, parameters={"type": "raid0", "stripes": "4"}) == grpc.StatusCode.OUT_OF_RANGE


def test_raid1_capacity_is_half_and_falls_by_what_creation_took(csi, fake):
    # 100/200/300 extents; raid1 keeps two copies: at most 300 extents of data, less metadata.
    before = csi.capacity({"type": "raid1"})
    assert before.maximum_volume_size.value == 199 * MiB  # legs on the 300 and 200 PVs, 1 extent rmeta each
    free_before = free_extents(fake)
    csi.create("mirror", 50 * MiB, parameters={"type": "raid1"})
    assert free_before - free_extents(fake) == 2 * (50 + 1)
    csi.delete("mirror")
    assert csi.capacity({"type": "raid1"}) == before


def test_pre_existing_lvs_are_listed_and_paginated(csi, fake):
    fake.add_lv(VG, "operator-made", 10)
    fake.add_lv(VG, "striped-by-hand", 8, segtype="striped", stripes=2)
    for i in range(5):
        csi.create(f"pvc-{i}", 2 * MiB)
    seen, token = [], ""
    while True:
        page = csi.list_volumes(max_entries=2, starting_token=token)
        assert len(page.entries) <= 2
        seen += [e.volume for e in page.entries]
        token = page.next_token
        if not token:
            break
    ids = [v.volume_id for v in seen]
    assert ids == sorted(["operator-made", "striped-by-hand"] + [f"pvc-{i}" for i in range(5)])
    by_id = {v.volume_id: v for v in seen}
    assert by_id["operator-made"].capacity_bytes == 10 * MiB
    assert "lvm.csi.csilvm.io/name" not in by_id["operator-made"].volume_context
    assert by_id["striped-by-hand"].volume_context["lvm.csi.csilvm.io/type"] == "raid0"
    # A CO cannot take over a hand-made LV by creating a volume of the same name.
    assert code_of(csi.create, "operator-made", 10 * MiB) == grpc.StatusCode.ALREADY_EXISTS


def test_lvm2_invocations_per_rpc_are_bounded(csi, fake):
    for i in range(50):
        fake.add_lv(VG, f"many-{i}", 1)

    def cost(call) -> dict:
        before = dict(fake.invocations)
        call()
        return {k: v - before.get(k, 0) for k, v in fake.invocations.items() if v != before.get(k, 0)}

    assert cost(lambda: csi.create("counted", 4 * MiB)) == {"fullreport": 1, "lvcreate": 1}
    assert cost(lambda: csi.create("counted", 4 * MiB)) == {"fullreport": 1}
    assert cost(lambda: csi.capacity({"type": "raid1"})) == {"fullreport": 1}
    assert cost(lambda: csi.all_volumes(page_size=1000)) == {"fullreport": 1}
    assert cost(csi.probe) == {"fullreport": 1}
    assert cost(lambda: csi.delete("counted")) == {"fullreport": 1, "lvremove": 1}
    assert cost(lambda: csi.delete("counted")) == {"fullreport": 1}
    assert cost(lambda: csi.delete("../../etc")) == {}


def test_lvm2_failures_map_to_codes_with_the_lvm_message(csi, fake):
    fake.fail_next("lvcreate", '  Volume group "vgtest" has insufficient free space (10 extents): 20 required.')
    assert code_of(csi.create, "unlucky", 4 * MiB) == grpc.StatusCode.OUT_OF_RANGE
    fake.fail_next("lvcreate", "  Internal error: something odd happened.")
    with pytest.raises(grpc.RpcError) as err:
        csi.create("odd", 4 * MiB)
    assert err.value.code() == grpc.StatusCode.INTERNAL and "something odd" in err.value.details()


def test_probe_fails_when_the_volume_group_is_gone(csi, fake):
    assert csi.probe().ready.value
    fake.remove_volume_group(VG)
    with pytest.raises(grpc.RpcError) as err:
        csi.probe()
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and VG in err.value.details()


def test_raid_capacity_is_zero_without_kernel_support(fake):
    backend = LvmBackend(VG, Lvm2(fake), devices=list(DEVICES), wipe=lambda p: None, raid_supported=lambda: False)
    backend.ensure_volume_group()
    core = Core(backend, PluginSettings(node_id="n"), SubprocessRunner())
    assert core.capacity({"type": "raid1"}, []).available == 0
    assert core.capacity({"type": "linear"}, []).available == 600 * MiB
