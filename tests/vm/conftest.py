"""Tests under tests/vm/ run only inside the test VM (or another real-LVM machine).

``tests/vm/guest.sh`` (and ``vagrant/provision.sh``) set ``CSILVM_IN_VM=1``;
elsewhere every test here is skipped with a pointer to the runner.  Every test
here also gets the ``vm`` marker.

Fixtures: ``lvm_runner`` (the project's ``SubprocessRunner``) and
``pv_devices`` (block devices to use as PVs: the ones named in
``CSILVM_TEST_DEVICES``, comma-separated, else three sparse loop devices of
64, 96 and 128 MiB made for the test).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

IN_VM_ENV = "CSILVM_IN_VM"
DEVICES_ENV = "CSILVM_TEST_DEVICES"
SKIP_REASON = "runs inside the VM: python -m tests.vm.runner"
HERE = Path(__file__).resolve().parent

LOOP_SIZES_MIB = (64, 96, 128)


def in_vm() -> bool:
    return os.environ.get(IN_VM_ENV) == "1"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"vm: needs a real kernel with device-mapper; set {IN_VM_ENV}=1 ({SKIP_REASON})"
    )


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if HERE not in Path(str(item.fspath)).resolve().parents:
            continue
        item.add_marker(pytest.mark.vm)
        if not in_vm():
            item.add_marker(skip)


@pytest.fixture
def lvm_runner():
    from lvm.command import SubprocessRunner

    return SubprocessRunner(default_timeout=120.0)


@pytest.fixture
def pv_devices(tmp_path, lvm_runner):
    """Block devices for PVs; wiped of LVM signatures before and after the test."""
    named = [d for d in os.environ.get(DEVICES_ENV, "").split(",") if d]
    attached: list[str] = []
    if named:
        devices = named
    else:
        for i, mib in enumerate(LOOP_SIZES_MIB, 1):
            image = tmp_path / f"pv{i}.img"
            with open(image, "wb") as f:
                f.truncate(mib * 1024 * 1024)
            dev = lvm_runner.run(["losetup", "-f", "--show", str(image)]).stdout.strip()
            attached.append(dev)
        devices = attached
    for dev in devices:
        lvm_runner.run(["wipefs", "-a", dev])
    try:
        yield devices
    finally:
        for dev in devices:
            lvm_runner.run(["wipefs", "-a", dev], ok_codes=(0, 1))
        for dev in attached:
            lvm_runner.run(["losetup", "-d", dev], ok_codes=(0, 1))
