"""The plugin's own settings (what it tells COs about itself), apart from backend options."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from typing import Mapping

from lvm.errors import InvalidParameters

import plugin
from plugin import DEFAULT_PLUGIN_NAME


# The CSI spec's rule for GetPluginInfoResponse.name.
_PLUGIN_NAME = re.compile(r"^(?=.{1,63}$)[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class PluginSettings:
    name: str = DEFAULT_PLUGIN_NAME
    version: str = ""  # empty: the installed package's version, looked up when first asked for
    node_id: str = socket.gethostname()
    default_fs: str = "ext4"
    max_volumes_per_node: int = 0  # 0: no limit reported
    # Parameters every CreateVolume/GetCapacity must carry (Mesos' --create_parameters);
    # they are checked and removed before the profile is parsed.
    required_parameters: Mapping[str, str] = field(default_factory=dict)
    # Added to every volume's context (Mesos' --volume_metadata).
    extra_context: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _PLUGIN_NAME.match(self.name):
            raise InvalidParameters(
                f"plugin name {self.name!r} must be in domain-name notation: at most 63 characters, "
                "letters, digits, '-' and '.', beginning and ending with a letter or digit"
            )
        if not self.node_id:
            raise InvalidParameters("the node id must not be empty")

    @property
    def vendor_version(self) -> str:
        return self.version or plugin.__version__

    @property
    def topology_key(self) -> str:
        """The topology segment key, ``<plugin-name>/node`` (CSI asks for the plugin's domain as prefix)."""
        return f"{self.name}/node"

    @property
    def context_prefix(self) -> str:
        """Prefix of volume_context keys, so they never clash with the CO's own."""
        return f"{self.name}/"
