"""protos/ equals the official CSI spec of each version: every message, field (number, type, label),
enum value, service and method — field types included (CSI 0.1's Version is uint32, not int32).

The fixtures tests/fixtures/protos/csi_<version>.shape.json were made from the official csi.proto of
container-storage-interface/spec at tags v0.1.0, v0.3.0 and v1.12.0 with
``python -m tests.protos_shape <csi.proto> <fixture>``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protos.v0 import csi_pb2 as v0
from protos.v0_1 import csi_pb2 as v0_1
from protos.v1 import csi_pb2 as v1
from tests.protos_shape import shape_of_module

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "protos"
VERSIONS = {"0.1.0": v0_1, "0.3.0": v0, "1.12.0": v1}


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_proto_has_the_shape_of_the_official_spec(version):
    spec = json.loads((FIXTURES / f"csi_v{version.replace('.', '_')}.shape.json").read_text())
    ours = shape_of_module(VERSIONS[version])
    assert ours["package"] == spec["package"]
    assert [m["name"] for m in ours["messages"]] == [m["name"] for m in spec["messages"]]
    for mine, theirs in zip(ours["messages"], spec["messages"]):
        assert mine == theirs, mine["name"]
    assert ours == spec


def test_csi_0_1_version_fields_are_unsigned():
    fields = {f.name: f.type for f in v0_1.Version.DESCRIPTOR.fields}
    assert fields == {name: v0_1.Version.DESCRIPTOR.fields_by_name["major"].TYPE_UINT32 for name in ("major", "minor", "patch")}


def test_v1_has_spec_1_12s_get_snapshot():
    assert "GetSnapshot" in v1.DESCRIPTOR.services_by_name["Controller"].methods_by_name
    assert v1.ControllerServiceCapability.RPC.Type.Value("GET_SNAPSHOT") == 15
