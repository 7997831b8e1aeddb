"""The plugin process: socket safety, signals, restarts, logging."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess

from protos.v1 import csi_pb2 as pb
from plugin.client import volume_capability
from tests.e2e.test_controller import MiB


def test_socket_is_private(plugin):
    mode = stat.S_IMODE(os.stat(plugin.socket).st_mode)
    assert mode == 0o600


def test_sigterm_stops_gracefully_and_removes_the_socket(plugin):
    assert plugin.kill(signal.SIGTERM) == 0
    assert not plugin.socket.exists()


def test_kill_9_and_restart_loses_nothing(plugin):
    csi = plugin.client
    made = {csi.create(f"keep-{i}", (i + 1) * MiB).volume_id: (i + 1) * MiB for i in range(4)}
    plugin.kill(signal.SIGKILL)
    assert plugin.socket.exists(), "a killed process leaves its socket behind"
    csi = plugin.start()  # the stale socket is replaced
    assert {v.volume_id: v.capacity_bytes for v in csi.all_volumes()} == made
    assert csi.create("keep-2", 3 * MiB).volume_id == "keep-2"  # same volume, no double allocation
    assert csi.capacity({}).available_capacity == 2 * (1 << 30) - sum(made.values())


def test_a_live_socket_is_not_stolen(plugin):
    second = subprocess.run(plugin.command(), capture_output=True, text=True, timeout=60)
    assert second.returncode != 0
    assert "another process is serving" in second.stderr
    assert plugin.client.probe().ready.value


def test_a_file_that_is_not_a_socket_is_not_replaced(plugin_factory):
    p = plugin_factory()
    p.socket.write_text("precious")
    result = subprocess.run(p.command(), capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "not a socket" in result.stderr
    assert p.socket.read_text() == "precious"


def test_stale_socket_without_process_is_replaced(plugin_factory):
    p = plugin_factory()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(p.socket))
    stale.close()  # bound, never listening: what a dead process leaves
    p.start()
    assert p.client.probe().ready.value


def test_debug_log_names_rpcs_and_never_secrets(plugin_factory):
    p = plugin_factory("--log-level", "debug")
    csi = p.start()
    request = pb.CreateVolumeRequest(
        name="logged",
        capacity_range=pb.CapacityRange(required_bytes=MiB),
        volume_capabilities=[volume_capability()],
        secrets={"password": "hunter2-very-secret"},
    )
    csi.controller.CreateVolume(request, timeout=30)
    p.kill(signal.SIGTERM)
    log = p.log()
    assert "/csi.v1.Controller/CreateVolume request" in log
    assert "/csi.v1.Controller/CreateVolume -> OK" in log
    assert "hunter2-very-secret" not in log


def test_api_version_restricts_what_is_served(plugin_factory):
    import grpc

    from protos.v0 import csi_pb2 as v0
    from protos.v0 import csi_pb2_grpc as v0_grpc

    p = plugin_factory("--api-version", "v1")
    csi = p.start()
    v0_identity = v0_grpc.IdentityStub(csi.channel)
    try:
        v0_identity.GetPluginInfo(v0.GetPluginInfoRequest(), timeout=10)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    else:
        raise AssertionError("v0 must not be served with --api-version v1")
    p.kill(signal.SIGTERM)
    served = plugin_factory()  # default: every version
    served.start()
    assert v0_grpc.IdentityStub(served.client.channel).GetPluginInfo(v0.GetPluginInfoRequest(), timeout=10).name
