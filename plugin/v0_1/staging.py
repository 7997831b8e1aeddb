"""The staging directories CSI 0.1 needs but has no RPC for.

0.1 has no NodeStageVolume, so NodePublishVolume of a mount volume stages it
(mkfs if blank, mount) in a directory of the plugin's own, then bind-mounts
that onto the target, as Core does for v0/v1.  The directory is
``<state dir>/csi-0.1-staging/<major>-<minor>``, named after the device
number of the volume's block device: unique on the host at any time (even for
several plugins sharing the state dir), found again from the volume id alone,
and independent of the CO's directory layout.  The state dir is ``/run/csilvm``
(tmpfs: gone at a reboot, like the mounts) unless ``CSILVM_STATE_DIR`` says
otherwise.
"""

from __future__ import annotations

import contextlib
import os

from lvm.errors import VolumeNotFound
from mount.table import read_mount_table
from plugin.core import Core

STATE_DIR_ENV = "CSILVM_STATE_DIR"
DEFAULT_STATE_DIR = "/run/csilvm"


class PrivateStaging:
    def __init__(self, core: Core, state_dir: str | None = None):
        self.core = core
        state_dir = state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
        self.root = os.path.join(os.path.abspath(state_dir), "csi-0.1-staging")

    def _path_of_device(self, device: str) -> str:
        rdev = os.stat(device).st_rdev
        return os.path.join(self.root, f"{os.major(rdev)}-{os.minor(rdev)}")

    def path_for(self, volume_id: str) -> str:
        """Where the volume is (to be) staged; the root is created private (0700) so only root reaches the mounts."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        return self._path_of_device(self.core.get_volume(volume_id).device)

    def release(self, volume_id: str) -> None:
        """Unstage the volume once its staging mount is the last place that shows its device, and remove the directory.

        A volume that no longer exists has nothing staged (Core refuses to delete a mounted volume).
        """
        try:
            device = self.core.get_volume(volume_id).device
            path = self._path_of_device(device)
            real = os.path.realpath(path)
            in_use = [e for e in read_mount_table().of_device(device) if e.mount_point != real]
        except (VolumeNotFound, FileNotFoundError):
            return
        if in_use:  # published at another target too: keep the staging mount it binds from
            return
        self.core.unstage(volume_id, path)
        with contextlib.suppress(OSError):
            os.rmdir(path)
