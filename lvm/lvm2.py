"""The one place that runs lvm2: argv building, timeouts, and stderr classification.

Every call is ``lvm <subcommand> [--config ...] ...`` through a Runner
(lvm/command.py), so tests substitute :class:`tests.fake_lvm2.FakeLvm`.

Reports run with ``--nolocking``: lvm2 reads the metadata without taking the
VG lock, so a read RPC never waits behind a long lvcreate, and (unlike
``--readonly``, which never asks device-mapper) it asks the kernel, so a
report shows whether each LV is active and open and how healthy its raid
legs are.  Without the lock a report sees the metadata as last committed
(lvm2 commits with one header write and checksums the text).  Reports
include the hidden sub-LVs (``-a``) so that each raid image's PVs are known.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Sequence

from lvm.command import CommandResult, Runner, SubprocessRunner
from lvm.errors import (
    BackendUnavailable,
    CommandFailed,
    CommandNotFound,
    CommandTimeout,
    OutOfRange,
    StorageError,
    VolumeBusy,
    VolumeExists,
    VolumeGroupDegraded,
    VolumeHasSnapshots,
    VolumeNotFound,
)
from lvm.report import Report, parse_fullreport

log = logging.getLogger(__name__)

REPORT_TIMEOUT = 30.0
MUTATION_TIMEOUT = 120.0
# Keeps lvm2 from complaining about descriptors inherited from the plugin (gRPC sockets).
LVM_ENV = {"LC_ALL": "C", "LVM_SUPPRESS_FD_WARNINGS": "1"}
REPORT_OPTIONS = ("--nolocking", "--reportformat", "json", "--units", "b", "--nosuffix")
# For guests without udev: ``activation{udev_sync=0 udev_rules=0}``.
NO_UDEV_CONFIG = "activation{udev_sync=0 udev_rules=0}"


class VolumeGroupNotFound(BackendUnavailable):
    """The configured volume group does not exist (yet)."""


# Order matters: the first matching rule wins.  Device-mapper trouble comes
# before "busy" because its messages contain "open failed".
_RULES: tuple[tuple[re.Pattern[str], type[StorageError]], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), error)
    for pattern, error in (
        (r"while PVs are missing|cannot change VG .* missing|missing physical volume", VolumeGroupDegraded),
        (r"insufficient (free space|suitable allocatable extents|allocatable extents)|"
         r"not enough free (space|extents)|extents needed, but only", OutOfRange),
        (r"already exists", VolumeExists),
        (r"failed to find logical volume|logical volumes? .*not found|"
         r"one or more specified logical volume\(s\) not found", VolumeNotFound),
        (r"volume group \S+ not found|cannot process volume group", VolumeGroupNotFound),
        (r"device-mapper target\(s\) not detected|failure to communicate with kernel device-mapper|"
         r"/dev/mapper/control: open failed|device-mapper driver", BackendUnavailable),
        (r"snapshot origin volumes can be resized only while inactive|has snapshots", VolumeHasSnapshots),
        (r"\bin use\b|can't remove open logical volume|\bis open\b|device or resource busy", VolumeBusy),
    )
)


def classify(stderr: str) -> type[StorageError]:
    """The domain error for an lvm2 failure, from its stderr (CommandFailed when unknown)."""
    for pattern, error in _RULES:
        if pattern.search(stderr):
            return error
    return CommandFailed


@dataclass(frozen=True)
class PhysicalVolumeEntry:
    """One line of ``lvm pvs``: a PV and the VG it belongs to ("" for none)."""

    name: str
    vg_name: str
    uuid: str


class Lvm2:
    """Runs lvm2 subcommands; raises lvm/errors.py types with lvm2's own words in them."""

    def __init__(
        self,
        runner: Runner | None = None,
        *,
        config: str | None = None,
        program: str = "lvm",
        report_timeout: float = REPORT_TIMEOUT,
        mutation_timeout: float = MUTATION_TIMEOUT,
    ):
        self.runner: Runner = runner if runner is not None else SubprocessRunner()
        self.config = config
        self.program = program
        self.report_timeout = report_timeout
        self.mutation_timeout = mutation_timeout

    # -- plumbing ---------------------------------------------------------

    def run(self, subcommand: str, args: Sequence[str], *, timeout: float) -> CommandResult:
        """Run ``lvm <subcommand> [--config C] args``; map failures to domain errors."""
        argv = [self.program, subcommand]
        if self.config:
            argv += ["--config", self.config]
        argv += list(args)
        try:
            return self.runner.run(argv, timeout=timeout, env=LVM_ENV)
        except (CommandTimeout, CommandNotFound):
            raise
        except CommandFailed as exc:
            log.warning("lvm %s failed (exit code %s): argv %s: %s", subcommand, exc.returncode, list(exc.argv) or argv,
                        exc.stderr.strip() or "(no message)")
            error = classify(exc.stderr)
            message = f"lvm {subcommand} failed (exit code {exc.returncode}): {exc.stderr.strip() or '(no message)'}"
            if error is CommandFailed:
                raise CommandFailed(message, argv=exc.argv, returncode=exc.returncode, stderr=exc.stderr) from None
            raise error(message) from None

    # -- reads ------------------------------------------------------------

    def report(self, vg_name: str) -> Report:
        """One ``lvm fullreport`` of ``vg_name``: VG, PVs, visible LVs and segments."""
        result = self.run("fullreport", [*REPORT_OPTIONS, "-a", "--", vg_name], timeout=self.report_timeout)
        try:
            return parse_fullreport(result.stdout, vg_name)
        except BackendUnavailable as exc:
            raise VolumeGroupNotFound(str(exc)) from None

    def physical_volumes(self) -> list[PhysicalVolumeEntry]:
        """Every PV lvm2 sees, with its VG (orphans have vg_name "")."""
        result = self.run(
            "pvs", [*REPORT_OPTIONS, "-o", "pv_name,vg_name,pv_uuid"], timeout=self.report_timeout
        )
        try:
            entries = json.loads(result.stdout)["report"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CommandFailed(f"lvm pvs printed unparseable output ({exc}): {result.stdout[:200]!r}") from None
        return [
            PhysicalVolumeEntry(pv["pv_name"], pv.get("vg_name", ""), pv.get("pv_uuid", ""))
            for entry in entries
            for pv in entry.get("pv", [])
        ]

    # -- mutations --------------------------------------------------------

    def pvcreate(self, devices: Sequence[str]) -> None:
        # No --yes: lvm2 then refuses devices that carry a filesystem signature
        # rather than wiping an operator's data.
        self.run("pvcreate", ["--", *devices], timeout=self.mutation_timeout)

    def vgcreate(self, vg_name: str, devices: Sequence[str], *, extent_size: str = "1m", tags: Sequence[str] = ()) -> None:
        args = ["--physicalextentsize", extent_size]
        for tag in tags:
            args += ["--addtag", tag]
        self.run("vgcreate", [*args, "--", vg_name, *devices], timeout=self.mutation_timeout)

    def lvcreate(
        self,
        vg_name: str,
        lv_name: str,
        extents: int,
        *,
        layout_args: Sequence[str] = ("--type", "linear"),
        tags: Sequence[str] = (),
        pvs: Sequence[str] = (),
    ) -> None:
        args = ["--yes", "--wipesignatures", "y", "-n", lv_name, "-l", str(extents)]
        for tag in tags:
            args += ["--addtag", tag]
        self.run("lvcreate", [*args, *layout_args, "--", vg_name, *pvs], timeout=self.mutation_timeout)

    def lvcreate_thin_pool(self, vg_name: str, pool: str, extents: int, *, tags: Sequence[str] = ()) -> None:
        """A thin pool of ``extents`` data extents; lvm2 sizes its metadata LV (and the spare) by its own rules."""
        args = ["--yes", "--type", "thin-pool", "-n", pool, "-l", str(extents)]
        for tag in tags:
            args += ["--addtag", tag]
        self.run("lvcreate", [*args, "--", vg_name], timeout=self.mutation_timeout)

    def lvcreate_thin(self, vg_name: str, lv_name: str, size: int, pool: str, *, tags: Sequence[str] = ()) -> None:
        """A thin LV of ``size`` bytes of virtual size in ``pool``."""
        args = ["--yes", "--wipesignatures", "y", "-n", lv_name, "-V", f"{size}b", "--thinpool", pool]
        for tag in tags:
            args += ["--addtag", tag]
        self.run("lvcreate", [*args, "--", vg_name], timeout=self.mutation_timeout)

    def lvcreate_snapshot(
        self,
        vg_name: str,
        lv_name: str,
        origin: str,
        *,
        cow_extents: int | None = None,
        writable: bool = False,
        tags: Sequence[str] = (),
    ) -> None:
        """A snapshot of ``vg/origin``: thin when ``cow_extents`` is None (the origin must be thin),
        else a COW snapshot with that many extents of exception store.

        A writable thin snapshot (a restore) is made without the activation-skip
        flag, so it is active like any volume; a read-only one (a CSI snapshot)
        keeps lvm2's default skip flag and stays inactive until it is read.
        """
        args = ["--yes", "-s", "-n", lv_name, "--permission", "rw" if writable else "r"]
        if cow_extents is not None:
            args += ["-l", str(cow_extents)]
        elif writable:
            args += ["--setactivationskip", "n", "--activate", "y"]
        for tag in tags:
            args += ["--addtag", tag]
        self.run("lvcreate", [*args, "--", f"{vg_name}/{origin}"], timeout=self.mutation_timeout)

    def lvchange_activate(self, vg_name: str, lv_name: str, active: bool) -> None:
        """Activate (ignoring the activation-skip flag of thin snapshots) or deactivate ``vg/lv``."""
        args = ["--activate", "y", "--ignoreactivationskip"] if active else ["--activate", "n"]
        self.run("lvchange", [*args, "--", f"{vg_name}/{lv_name}"], timeout=self.mutation_timeout)

    def lvremove(self, vg_name: str, lv_name: str) -> None:
        self.run("lvremove", ["--yes", "--", f"{vg_name}/{lv_name}"], timeout=self.mutation_timeout)

    def lvextend(self, vg_name: str, lv_name: str, extents: int, *, pvs: Sequence[str] = ()) -> None:
        """Grow ``vg/lv`` to ``extents`` logical extents, allocating only on ``pvs`` (when given)."""
        self.run(
            "lvextend", ["--yes", "-l", str(extents), "--", f"{vg_name}/{lv_name}", *pvs], timeout=self.mutation_timeout
        )

    def lvconvert_mirrors(self, vg_name: str, lv_name: str, mirrors: int, *, pvs: Sequence[str] = ()) -> None:
        """Set the number of raid1 mirrors of ``vg/lv`` (0: back to linear); new legs only on ``pvs``."""
        layout = ["--type", "raid1"] if mirrors else []
        self.run(
            "lvconvert",
            ["--yes", *layout, "-m", str(mirrors), "--", f"{vg_name}/{lv_name}", *pvs],
            timeout=self.mutation_timeout,
        )

    def lvchange_tags(self, vg_name: str, lv_name: str, *, add: Sequence[str] = (), delete: Sequence[str] = ()) -> None:
        args: list[str] = []
        for tag in delete:
            args += ["--deltag", tag]
        for tag in add:
            args += ["--addtag", tag]
        if args:
            self.run("lvchange", [*args, "--", f"{vg_name}/{lv_name}"], timeout=self.mutation_timeout)
