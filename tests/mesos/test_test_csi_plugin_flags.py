"""``test-csi-plugin``'s flags: parsing (no root), and their effect on a running plugin (root)."""

from __future__ import annotations

import json
import uuid

import click
import grpc
import pytest

from plugin.mesos import main, parse_bytes, parse_key_values, parse_volumes
from tests.mesos.conftest import needs_root
from tests.mesos.harness import PROFILES_FILE, RESOURCE_PROVIDER_FILE, MiB, CsiV1, load_profiles, size_for

GiB = 1 << 30


def parse(args, env=None, monkeypatch=None):
    """The options ``main`` would run with, without running it."""
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    with main.make_context("test-csi-plugin", list(args)) as ctx:
        return ctx.params


# --- parsing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2GB", 2 * GiB),  # Mesos: GB is 2^30
        ("512MB", 512 * MiB),
        ("1.5MB", 3 * MiB // 2),
        ("4KB", 4096),
        ("1TB", 1 << 40),
        ("100B", 100),
        ("100", 100),
        ("2gb", 2 * GiB),
        ("3GiB", 3 * GiB),
        ("0B", 0),
    ],
)
def test_sizes_follow_mesos(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GB", "2XB", "-1GB", "1.5GiB", "2 G B"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_volumes_flag():
    assert parse_volumes("a:1GB;b:512MB") == {"a": GiB, "b": 512 * MiB}
    assert parse_volumes("a:1GB;") == {"a": GiB}
    assert parse_volumes("") == {}
    for bad in ("a", "a:", ":1GB", "a:1GB;a:2GB", "a:0B", "a:xx"):
        with pytest.raises(ValueError):
            parse_volumes(bad)


def test_key_value_flags():
    assert parse_key_values("foo=bar;baz=") == {"foo": "bar", "baz": ""}
    assert parse_key_values("a=b=c") == {"a": "b=c"}
    assert parse_key_values("") == {}
    for bad in ("foo", "=bar", "a=b;c"):
        with pytest.raises(ValueError):
            parse_key_values(bad)


def test_flags_mesos_style_and_defaults():
    params = parse(["--endpoint=unix:///tmp/x.sock", "--work_dir=/w", "--available_capacity=2GB",
                    "--volumes=v1:1MB;v2:2MB", "--create_parameters=a=b", "--volume_metadata=c=d"])
    assert params["endpoint"] == "unix:///tmp/x.sock"
    assert params["available_capacity"] == 2 * GiB
    assert params["volumes"] == {"v1": MiB, "v2": 2 * MiB}
    assert params["create_parameters"] == {"a": "b"}
    assert params["volume_metadata"] == {"c": "d"}
    assert params["node_id"] == "localhost"
    assert params["api_version"] is None  # every registered version
    assert params["forward"] is None and params["volume_group"] is None


def test_every_flag_reads_its_csi_environment_variable(monkeypatch):
    env = {
        "CSI_ENDPOINT": "unix:///tmp/e.sock", "CSI_WORK_DIR": "/w", "CSI_AVAILABLE_CAPACITY": "3MB",
        "CSI_VOLUMES": "x:1MB", "CSI_CREATE_PARAMETERS": "k=v", "CSI_VOLUME_METADATA": "m=n",
        "CSI_API_VERSION": "v1", "CSI_VOLUME_ID_PATH": "false", "CSI_FORWARD": "unix:///tmp/f.sock",
        "CSI_VOLUME_GROUP": "vg0", "CSI_NODE_ID": "agent-7",
    }
    params = parse([], env, monkeypatch)
    assert params["endpoint"] == "unix:///tmp/e.sock"
    assert params["work_dir"] == "/w"
    assert params["available_capacity"] == 3 * MiB
    assert params["volumes"] == {"x": MiB}
    assert params["create_parameters"] == {"k": "v"}
    assert params["volume_metadata"] == {"m": "n"}
    assert params["api_version"] == "v1"
    assert params["volume_id_path"] is False
    assert params["forward"] == "unix:///tmp/f.sock"
    assert params["volume_group"] == "vg0"
    assert params["node_id"] == "agent-7"
    # The command line wins over the environment.
    assert parse(["--node_id=n2"], {"CSI_NODE_ID": "n1"}, monkeypatch)["node_id"] == "n2"


@pytest.mark.parametrize("args, expected", [(["--volume_id_path"], True), (["--volume_id_path=false"], False),
                                            (["--volume_id_path=true"], True), ([], None)])
def test_volume_id_path_is_accepted(args, expected):
    assert parse(["--endpoint=/tmp/e.sock", *args])["volume_id_path"] is expected


@pytest.mark.parametrize("args", [["--api_version=v9"], ["--available_capacity=lots"], ["--volumes=nocolon"],
                                  ["--create_parameters=novalue"], ["--volume_id_path=maybe"]])
def test_bad_flags_are_usage_errors(args):
    with pytest.raises(click.BadParameter):
        parse(["--endpoint=/tmp/e.sock", *args])


def test_example_resource_provider_config_launches_test_csi_plugin():
    config = json.loads(RESOURCE_PROVIDER_FILE.read_text())
    assert config["type"] == "org.apache.mesos.rp.local.storage"
    plugin = config["storage"]["plugin"]
    (container,) = plugin["containers"]
    assert set(container["services"]) == {"CONTROLLER_SERVICE", "NODE_SERVICE"}
    command = container["command"]
    assert command["shell"] is False and command["value"].endswith("/test-csi-plugin")
    assert command["arguments"][0] == "test-csi-plugin"  # argv[0] when shell is false
    params = parse(["--endpoint=/tmp/e.sock", *command["arguments"][1:]])  # the SLRP sets CSI_ENDPOINT
    assert params["volume_group"] and params["work_dir"]
    # Every profile of the example matrix selects this plugin type.
    assert {p.plugin_type for p in load_profiles()} == {plugin["type"]}


def test_example_profile_matrix_maps_to_lvm_layouts():
    from lvm.profiles import Layout, parse_profile

    profiles = {p.name: p for p in load_profiles(PROFILES_FILE)}
    assert list(profiles) == ["raid0", "raid1", "fast", "block"]
    layouts = {name: parse_profile(p.parameters) for name, p in profiles.items()}
    assert layouts["raid0"].layout is Layout.RAID0 and layouts["raid0"].stripes == 2
    assert layouts["raid1"].layout is Layout.RAID1 and layouts["raid1"].mirrors == 1
    assert layouts["fast"].layout is Layout.LINEAR and profiles["fast"].fs_type == "xfs"
    assert layouts["block"].layout is Layout.LINEAR and profiles["block"].block
    assert all(p.access_mode == "SINGLE_NODE_WRITER" for p in profiles.values())


# --- a running plugin -------------------------------------------------------------------------------


def _launch(containers, env, *args):
    container = containers(env, *args)
    container.launch()
    return container, CsiV1(container.endpoint)


@needs_root
def test_preprovisioned_volumes_are_listed_and_not_counted(containers):
    container, api = _launch(containers, {"CSI_AVAILABLE_CAPACITY": "10MB", "CSI_VOLUMES": "pre1:3MB;pre2:1.5MB"})
    linear = next(p for p in load_profiles() if p.name == "fast")
    try:
        listed = {d.id: d for d in api.list_volumes()}
        assert {i: d.capacity for i, d in listed.items()} == {"pre1": 3 * MiB, "pre2": 2 * MiB}  # whole MiB
        assert api.capacity(linear) == 10 * MiB
        # Deleting a pre-provisioned volume frees its space; it is not re-created at restart.
        api.delete("pre2")
        assert api.capacity(linear) == 12 * MiB
        api.close()
        assert container.stop() == 0
        container.launch()
        api = CsiV1(container.endpoint)
        assert [d.id for d in api.list_volumes()] == ["pre1"]
        assert api.capacity(linear) == 12 * MiB
    finally:
        api.close()


@needs_root
def test_create_parameters_are_required(containers):
    container, api = _launch(containers, {"CSI_AVAILABLE_CAPACITY": "16MB", "CSI_CREATE_PARAMETERS": "tier=gold;zone=a"})
    block = next(p for p in load_profiles() if p.block)
    with_params = type(block)(**{**block.__dict__, "parameters": {**block.parameters, "tier": "gold", "zone": "a"}})
    wrong = type(block)(**{**block.__dict__, "parameters": {**block.parameters, "tier": "silver", "zone": "a"}})
    try:
        assert api.capacity(block) == 0
        assert api.capacity(wrong) == 0
        assert api.capacity(with_params) == 16 * MiB
        for profile in (block, wrong):
            with pytest.raises(grpc.RpcError) as err:
                api.create(str(uuid.uuid4()), size_for(block), profile)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        disk = api.create(str(uuid.uuid4()), size_for(block), with_params)
        assert disk.capacity == size_for(block)
        api.delete(disk.id)
    finally:
        api.close()


@needs_root
def test_volume_metadata_is_in_every_volume_context(containers):
    container, api = _launch(containers, {"CSI_AVAILABLE_CAPACITY": "16MB", "CSI_VOLUMES": "pre:1MB",
                                          "CSI_VOLUME_METADATA": "rack=r1;owner=mesos"})
    block = next(p for p in load_profiles() if p.block)
    try:
        disk = api.create(str(uuid.uuid4()), size_for(block), block)
        assert {"rack": "r1", "owner": "mesos"}.items() <= disk.context.items()
        for listed in api.list_volumes():
            assert {"rack": "r1", "owner": "mesos"}.items() <= listed.context.items()
        api.delete(disk.id)
    finally:
        api.close()


@needs_root
def test_forward_proxies_every_call_to_another_plugin(containers):
    backend, direct = _launch(containers, {"CSI_AVAILABLE_CAPACITY": "16MB", "CSI_NODE_ID": "backend-node"})
    proxy, api = _launch(containers, {"CSI_FORWARD": backend.endpoint, "CSI_NODE_ID": "proxy-node"})
    block = next(p for p in load_profiles() if p.block)
    try:
        info = api.handshake()
        assert info["node_id"] == "backend-node"  # answered by the backend
        disk = api.create(str(uuid.uuid4()), size_for(block), block)
        assert disk.id in {d.id for d in direct.list_volumes()}
        assert direct.capacity(block) == api.capacity(block) == 16 * MiB - size_for(block)
        # Errors come back with the backend's code and message.
        with pytest.raises(grpc.RpcError) as err:
            api.create(str(uuid.uuid4()), 32 * MiB, block)
        assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE and "free" in err.value.details()
        # Any method, even one no plugin has, is relayed (and answered UNIMPLEMENTED by the backend).
        with pytest.raises(grpc.RpcError) as err:
            api.channel.unary_unary("/csi.v9.Nothing/Nope")(b"", timeout=30)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        api.delete(disk.id)
        assert direct.list_volumes() == []
        # The proxy keeps no state: the work dir is never created.
        assert not proxy.work_dir.exists()
    finally:
        api.close()
        direct.close()
