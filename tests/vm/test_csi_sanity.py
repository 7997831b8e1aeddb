"""The official CSI conformance suite (csi-sanity v5.4.0) against `csilvm serve --backend lvm` on real lvm2.

ControllerModifyVolume runs for real here: the suite's mutable parameters turn its linear test volumes
into raid1 (lvconvert) and keeps raid1 ones as they are.
"""

from __future__ import annotations

import pytest

from tests import csi_sanity
from tests.vm.test_lvm_plugin import loops, lvm_plugin, vg_name  # noqa: F401

MiB = 1 << 20


@pytest.mark.parametrize("access_type", ["mount", "block"])
def test_csi_sanity_passes_on_real_lvm2(lvm_plugin, loops, tmp_path, access_type):
    if not csi_sanity.BINARY.exists():
        pytest.skip(csi_sanity.MISSING)
    plugin = lvm_plugin(vg_name(), loops(400, 400, 400))
    result = csi_sanity.run(
        plugin.socket, tmp_path / "sanity", access_type,
        volume_size=16 * MiB, expand_size=24 * MiB, mutable_parameters={"type": "raid1", "mirrors": "1"},
        timeout=1200,
    )
    csi_sanity.check(result)
