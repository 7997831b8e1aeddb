"""What an operator's log collector gets at the default level: JSON lines, every failed RPC once, every
volume created or deleted with its id, size and profile."""

from __future__ import annotations

import json
import logging
import sys

import grpc
import pytest

from plugin.cli import JsonFormatter
from protos.v1 import csi_pb2 as pb

MiB = 1 << 20


def test_json_lines_carry_the_failures_and_the_volumes(plugin_factory):
    plugin = plugin_factory("--log-format", "json")
    csi = plugin.start()
    volume = csi.create("logged", 8 * MiB, parameters={"type": "thin"}).volume_id
    csi.delete(volume)
    with pytest.raises(grpc.RpcError):
        csi.controller.DeleteVolume(pb.DeleteVolumeRequest(volume_id=""), timeout=30)
    with pytest.raises(grpc.RpcError):
        csi.get_snapshot("snapshot-nope")
    plugin.stop()
    lines = [line for line in plugin.log().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(e) for e in entries)
    messages = [e["message"] for e in entries]

    def one(*words: str) -> dict:
        found = [e for e in entries if all(w in e["message"] for w in words)]
        assert len(found) == 1, f"{words} in {messages}"
        return found[0]

    one("created volume", volume, str(8 * MiB), "type=thin")
    one("deleted volume", volume, str(8 * MiB), "type=thin")
    failed = one("/csi.v1.Controller/DeleteVolume failed", "INVALID_ARGUMENT", "volume_id missing")
    assert failed["level"] == "info"
    one("/csi.v1.Controller/GetSnapshot failed", "NOT_FOUND", "snapshot-nope")


def test_json_formatter_keeps_the_traceback():
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("csilvm", logging.ERROR, __file__, 1, "failed %s", ("here",), sys.exc_info())
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "failed here" and entry["level"] == "error"
    assert "ValueError: boom" in entry["traceback"]
