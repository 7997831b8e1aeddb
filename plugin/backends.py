"""Building the backend and the Core from the command-line options."""

from __future__ import annotations

from typing import Any, Mapping

import click

from lvm.command import SubprocessRunner
from lvm.errors import InvalidParameters
from lvm.thin import PoolSize, ThinPolicy
from plugin.core import Core
from plugin.settings import PluginSettings


def thin_policy(options: Mapping[str, Any]) -> ThinPolicy:
    try:
        pool_size = options.get("thin_pool_size") or ""
        return ThinPolicy(
            overprovision_ratio=options.get("thin_overprovision_ratio", 1.0),
            full_percent=options.get("thin_pool_full_percent", 95.0),
            pool_size=PoolSize.parse(pool_size) if pool_size else None,
        )
    except InvalidParameters as exc:
        raise click.UsageError(str(exc)) from None


def build_backend(options: Mapping[str, Any], runner: SubprocessRunner):
    thin = thin_policy(options)
    if options["backend"] == "loop":
        from lvm.sandbox import LoopBackend

        return LoopBackend(options["work_dir"], options["capacity"], options["default_size"], thin=thin)
    if not options.get("volume_group"):
        raise click.UsageError("--backend lvm needs --volume-group")
    from lvm.lvm2 import Lvm2
    from lvm.volume_group import LvmBackend

    devices = [d for d in (options.get("devices") or "").split(",") if d]
    lvm2 = Lvm2(runner, config=options.get("lvm_config") or None)
    backend = LvmBackend(
        options["volume_group"], lvm2, devices=devices or None, default_size=options["default_size"], thin=thin
    )
    backend.ensure_volume_group()
    return backend


def build_core(options: Mapping[str, Any]) -> Core:
    runner = SubprocessRunner(default_timeout=options["command_timeout"])
    settings = PluginSettings(
        name=options["plugin_name"],
        node_id=options["node_id"],
        default_fs=options["default_fs"],
        max_volumes_per_node=options["max_volumes_per_node"],
    )
    return Core(build_backend(options, runner), settings, runner)
