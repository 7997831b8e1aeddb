"""The official CSI conformance suite (csi-sanity v5.4.0) against `csilvm serve` on the loop sandbox."""

from __future__ import annotations

import pytest

from tests import csi_sanity

MiB = 1 << 20


@pytest.mark.parametrize("access_type", ["mount", "block"])
def test_csi_sanity_passes_on_the_sandbox(plugin_factory, tmp_path, access_type):
    if not csi_sanity.BINARY.exists():
        pytest.skip(csi_sanity.MISSING)
    plugin = plugin_factory(capacity="8GiB")
    plugin.start()
    result = csi_sanity.run(
        plugin.socket, tmp_path / "sanity", access_type,
        volume_size=64 * MiB, expand_size=96 * MiB, mutable_parameters={"type": "linear"}, timeout=600,
    )
    csi_sanity.check(result)
