"""The `csilvm client` command against a running plugin: what the README demo shows an operator."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.e2e.conftest import REPO


def client(plugin, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "plugin.cli", "client", "--endpoint", f"unix://{plugin.socket}", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_a_volume_life_through_the_cli(plugin, tmp_path):
    assert "ready: True" in client(plugin, "probe").stdout
    info = json.loads(client(plugin, "--json", "info").stdout)
    assert info["plugin"]["name"] == "lvm.csi.csilvm.io" and info["node"]["node_id"] == "test-node"
    cap = json.loads(client(plugin, "--json", "capacity", "-p", "type=linear").stdout)
    assert int(cap["available_capacity"]) == 2 << 30
    created = json.loads(client(plugin, "--json", "create", "cli-vol", "--size", "24MiB").stdout)
    assert created["volume_id"] == "cli-vol" and int(created["capacity_bytes"]) == 24 << 20
    target = tmp_path / "mnt"
    client(plugin, "publish", "cli-vol", str(target))
    (target / "f.txt").write_text("through the cli")
    stats = client(plugin, "stats", "cli-vol", str(target)).stdout
    assert "bytes: total" in stats and "inodes: total" in stats
    listed = json.loads(client(plugin, "--json", "list").stdout)
    assert [v["volume_id"] for v in listed] == ["cli-vol"]
    client(plugin, "unpublish", "cli-vol", str(target))
    assert not target.exists()
    client(plugin, "delete", "cli-vol")
    assert json.loads(client(plugin, "--json", "list").stdout) == []


def test_cli_errors_name_the_code(plugin):
    result = client(plugin, "create", "bad", "--size", "1MiB", "-p", "type=raid7", check=False)
    assert result.returncode != 0 and "INVALID_ARGUMENT" in result.stderr and "raid7" in result.stderr
    result = client(plugin, "create", "bad", "--size", "lots", check=False)
    assert result.returncode != 0 and "not a size" in result.stderr
