"""LvmBackend against real lvm2 on loop devices (root only; skipped otherwise).

Each test gets its own VG (unique name) on three loop devices of 64, 100 and
40 MiB (63, 99 and 39 extents of 1 MiB).  The finalizer removes the VG, the
PV labels and the loop devices even when the test fails.  Creating LVs needs
device-mapper; those tests skip on hosts without it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass

import pytest

from lvm.backend import SizeRange
from lvm.command import SubprocessRunner
from lvm.errors import BackendUnavailable, CommandFailed
from lvm.lvm2 import Lvm2
from lvm.profiles import Layout, Profile
from lvm.units import MiB
from lvm.volume_group import LvmBackend, device_mapper_available, raid_supported_by_kernel

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create loop devices and PVs"),
    pytest.mark.skipif(not os.path.exists("/dev/loop-control"), reason="needs loop devices (/dev/loop-control)"),
    pytest.mark.skipif(shutil.which("lvm") is None or shutil.which("losetup") is None,
                       reason="needs lvm2 and util-linux (lvm, losetup)"),
]

SIZES_MIB = (64, 100, 40)
EXTENTS = (63, 99, 39)  # lvm2 keeps the first MiB for its metadata
needs_device_mapper = pytest.mark.skipif(
    not device_mapper_available(), reason="lvcreate needs device-mapper, which this kernel lacks (/proc/misc)"
)


class RecordingRunner(SubprocessRunner):
    """A SubprocessRunner that remembers the lvm2 subcommands it ran."""

    def __init__(self):
        super().__init__()
        self.subcommands: list[str] = []

    def run(self, argv, **kwargs):
        self.subcommands.append(argv[1])
        return super().run(argv, **kwargs)


@dataclass
class Host:
    vg: str
    devices: list[str]
    runner: RecordingRunner

    def backend(self, devices: list[str] | None = None, **kwargs) -> LvmBackend:
        return LvmBackend(self.vg, Lvm2(self.runner), devices=devices, default_size=8 * MiB, **kwargs)


@pytest.fixture
def host(tmp_path):
    tools = SubprocessRunner()
    vg = f"csilvm_test_{uuid.uuid4().hex[:10]}"
    devices: list[str] = []
    try:
        for i, size in enumerate(SIZES_MIB):
            image = tmp_path / f"pv{i}.img"
            with open(image, "wb") as f:
                f.truncate(size * MiB)
            devices.append(tools.run(["losetup", "--find", "--show", str(image)]).stdout.strip())
        yield Host(vg, devices, RecordingRunner())
    finally:
        env = {"LVM_SUPPRESS_FD_WARNINGS": "1"}
        for argv in (["lvm", "vgremove", "-f", vg], ["lvm", "pvremove", "-y", *devices]):
            try:
                tools.run(argv, env=env, ok_codes=(0, 5))
            except CommandFailed:
                pass
        for device in devices:
            tools.run(["losetup", "-d", device])


def real_vg_free(vg: str) -> int:
    out = SubprocessRunner().run(
        ["lvm", "vgs", "--noheadings", "--units", "b", "--nosuffix", "-o", "vg_free", vg],
        env={"LVM_SUPPRESS_FD_WARNINGS": "1"},
    ).stdout
    return int(out.strip())


def test_ensure_creates_tagged_vg_with_exact_extents(host):
    backend = host.backend(host.devices)
    backend.ensure_volume_group()
    assert host.runner.subcommands == ["fullreport", "pvs", "pvcreate", "vgcreate"]

    report = Lvm2(host.runner).report(host.vg)
    assert report.vg.extent_size == MiB
    assert report.vg.tags == ("csilvm",)
    assert report.vg.extent_count == report.vg.free_count == sum(EXTENTS)
    assert {pv.name: (pv.extent_count, pv.free_extents, pv.allocatable) for pv in report.pvs} == {
        device: (extents, extents, True) for device, extents in zip(host.devices, EXTENTS)
    }
    assert report.lvs == ()


def test_second_ensure_leaves_the_vg_as_is(host):
    host.backend(host.devices).ensure_volume_group()
    host.runner.subcommands.clear()
    host.backend(host.devices).ensure_volume_group()
    assert host.runner.subcommands == ["fullreport"]
    host.backend().ensure_volume_group()  # without devices: an existing VG is enough


def test_mismatching_devices_are_refused(host):
    host.backend(host.devices).ensure_volume_group()
    with pytest.raises(BackendUnavailable, match="not on the configured devices"):
        host.backend(host.devices[:2]).ensure_volume_group()


def test_missing_vg_without_devices(host):
    with pytest.raises(BackendUnavailable, match="does not exist"):
        host.backend().ensure_volume_group()
    with pytest.raises(BackendUnavailable):
        host.backend().probe()


def test_capacity_matches_real_free_space(host):
    backend = host.backend(host.devices)
    backend.ensure_volume_group()
    backend.probe()
    linear = backend.capacity(Profile())
    assert linear.maximum_volume_size == linear.available == real_vg_free(host.vg) == sum(EXTENTS) * MiB
    assert linear.minimum_volume_size == MiB
    assert backend.list_volumes() == []
    raid1 = host.backend(host.devices, raid_supported=lambda: True).capacity(Profile(Layout.RAID1, mirrors=1))
    assert raid1.maximum_volume_size == (63 - 1) * MiB


@needs_device_mapper
def test_create_and_delete_for_real(host):
    backend = host.backend(host.devices)
    backend.ensure_volume_group()
    maximum = backend.capacity(Profile()).maximum_volume_size
    volume = backend.create_volume("pvc-host", SizeRange(required=maximum), Profile())
    assert backend.get_volume(volume.id) == volume
    assert os.path.exists(volume.device)
    backend.delete_volume(volume.id)
    assert backend.list_volumes() == []
    assert real_vg_free(host.vg) == maximum


@needs_device_mapper
@pytest.mark.skipif(not raid_supported_by_kernel(), reason="needs the dm-raid kernel target")
@pytest.mark.parametrize("profile", [Profile(Layout.RAID1, mirrors=1), Profile(Layout.RAID0, stripes=3)], ids=str)
def test_raid_maximum_fits_for_real(host, profile):
    backend = host.backend(host.devices)
    backend.ensure_volume_group()
    maximum = backend.capacity(profile).maximum_volume_size
    volume = backend.create_volume("pvc-raid", SizeRange(required=maximum), profile)
    assert backend.get_volume(volume.id).size == maximum
    assert backend.get_volume(volume.id).profile == profile
    backend.delete_volume(volume.id)
