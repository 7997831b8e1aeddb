"""``test-csi-plugin``: csilvm as a drop-in for the CSI test plugin of Apache Mesos.

Mesos' storage local resource provider (SLRP) launches its plugin with
``CSI_ENDPOINT`` in the environment; Mesos' tests and example configs launch
``test-csi-plugin`` with Mesos-style flags (``--work_dir=DIR``,
``--available_capacity=2GB``, ``--volumes=a:1GB;b:2GB`` ...).  This command
accepts the same flags, each also read from ``CSI_<FLAG>`` (``CSI_WORK_DIR``),
and serves csilvm's CSI versions from the loop sandbox or, with
``--volume_group``, from an LVM volume group.  See docs/mesos.md.
"""

from __future__ import annotations

import json
import logging
import re
from fractions import Fraction
from pathlib import Path
from typing import Mapping

import click

from lvm.errors import InvalidParameters, StorageError
from lvm.units import MiB
from plugin import DEFAULT_PLUGIN_NAME

log = logging.getLogger("csilvm.mesos")

# stout's Bytes: a number (fractions allowed) and B, KB, MB, GB or TB, each 1024 times the last.
_MESOS_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
_MESOS_BYTES = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([A-Za-z]*)\s*$")
# Volumes provisioned once from --volumes (so a volume the CO deleted is not re-created at restart).
PREPROVISIONED_FILE = "mesos-preprovisioned.json"


def parse_bytes(text: str) -> int:
    """Mesos' byte sizes: ``2GB`` = 2 GiB, ``1.5MB``, ``512B``; a bare number is bytes."""
    match = _MESOS_BYTES.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size such as 512MB or 2GB")
    number, unit = Fraction(match.group(1)), match.group(2).upper() or "B"
    if unit not in _MESOS_UNITS:
        # Also accept csilvm's own spellings (KiB, G ...), never decimal: Mesos has none.
        from lvm.units import parse_size

        try:
            if number.denominator != 1:
                raise InvalidParameters("")
            return parse_size(text, decimal_units=False)
        except InvalidParameters:
            raise ValueError(f"unknown unit {match.group(2)!r} in {text!r}: use B, KB, MB, GB or TB") from None
    return int(number * _MESOS_UNITS[unit])


def parse_key_values(text: str) -> dict[str, str]:
    """``k1=v1;k2=v2`` (Mesos' --create_parameters and --volume_metadata) -> a dict; empty parts are skipped."""
    out: dict[str, str] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{part!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def parse_volumes(text: str) -> dict[str, int]:
    """``name1:1GB;name2:512MB`` (Mesos' --volumes) -> ``{name: bytes}``; each size is at least 1 byte."""
    out: dict[str, int] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        name, sep, size = part.rpartition(":")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"{part!r} is not name:capacity")
        if name in out:
            raise ValueError(f"volume {name!r} is named twice")
        out[name] = parse_bytes(size)
        if out[name] <= 0:
            raise ValueError(f"volume {name!r} must have a positive capacity")
    return out


def round_up_mib(size: int) -> int:
    return -(-size // MiB) * MiB


class _Parsed(click.ParamType):
    """A click type from a parse function raising ValueError."""

    def __init__(self, name: str, parse):
        self.name = name
        self._parse = parse

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _check_api_version(ctx, param, value):
    from plugin.versions import API_VERSIONS

    if value is not None and value not in API_VERSIONS:
        raise click.BadParameter(f"{value!r} is not served by this csilvm; use one of {', '.join(API_VERSIONS)}")
    return value


# --- pre-provisioned volumes ------------------------------------------------------------------


def _read_provisioned(path: Path) -> set[str]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return set()
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"{path} is unreadable ({exc}): fix or remove it") from None
    return {n for n in data.get("provisioned", []) if isinstance(n, str)}


def preprovision(backend, volumes: Mapping[str, int], state_file: Path) -> None:
    """Create each volume of ``volumes`` never provisioned before (recorded in ``state_file``).

    A pre-provisioned volume the CO deleted stays deleted across restarts,
    and its space stays free for new volumes.
    """
    from lvm.backend import SizeRange
    from lvm.profiles import LINEAR
    from lvm.images import write_atomically

    done = _read_provisioned(state_file)
    for name, size in sorted(volumes.items()):
        if name in done:
            continue
        volume = backend.create_volume(name, SizeRange(required=size), LINEAR)
        log.info("pre-provisioned volume %s (%s) of %d bytes", volume.id, name, volume.size)
        done.add(name)
        state_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(state_file, json.dumps({"provisioned": sorted(done)}, indent=2))


def build_core(options: Mapping):
    """The Core for ``options``: the loop sandbox sized ``available_capacity`` + pre-provisioned volumes, or a VG."""
    from plugin.backends import build_backend
    from lvm.command import SubprocessRunner
    from plugin.core import Core
    from plugin.settings import PluginSettings

    volumes = options["volumes"] or {}
    work_dir = Path(options["work_dir"])
    available = options["available_capacity"] // MiB * MiB  # Mesos counts capacity in whole MiB
    backend_options = {
        "backend": "lvm" if options["volume_group"] else "loop",
        "work_dir": str(work_dir),
        "capacity": available + sum(round_up_mib(s) for s in volumes.values()),
        "default_size": options["default_size"],
        "volume_group": options["volume_group"],
        "devices": options["devices"],
        "lvm_config": options["lvm_config"],
    }
    runner = SubprocessRunner(default_timeout=options["command_timeout"])
    settings = PluginSettings(
        name=options["plugin_name"],
        node_id=options["node_id"],
        required_parameters=options["create_parameters"] or {},
        extra_context=options["volume_metadata"] or {},
    )
    backend = build_backend(backend_options, runner)
    try:
        preprovision(backend, volumes, work_dir / PREPROVISIONED_FILE)
    except Exception:
        backend.close()
        raise
    return Core(backend, settings, runner)


SIZE = _Parsed("size", parse_bytes)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100, "show_default": True})
@click.option("--endpoint", envvar="CSI_ENDPOINT", required=True, help="unix:///path/endpoint.sock (the SLRP sets CSI_ENDPOINT)")
@click.option("--work_dir", envvar="CSI_WORK_DIR", type=click.Path(file_okay=False), help="volumes of the loop sandbox, and the record of pre-provisioned volumes  [required unless --forward]")
@click.option("--available_capacity", envvar="CSI_AVAILABLE_CAPACITY", type=SIZE, default="2GB", help="loop sandbox: free space for new volumes, beyond --volumes (rounded down to whole MiB)")
@click.option("--volumes", envvar="CSI_VOLUMES", type=_Parsed("name:capacity;...", parse_volumes), default="", help="pre-provisioned volumes 'name:capacity;...', created once at the first start")
@click.option("--create_parameters", envvar="CSI_CREATE_PARAMETERS", type=_Parsed("k=v;...", parse_key_values), default="", help="parameters every CreateVolume and GetCapacity must carry 'k=v;...'")
@click.option("--volume_metadata", envvar="CSI_VOLUME_METADATA", type=_Parsed("k=v;...", parse_key_values), default="", help="added to every volume's context 'k=v;...'")
@click.option("--api_version", envvar="CSI_API_VERSION", callback=_check_api_version, help="serve only this CSI version (v1, v0 or v0.1)  [default: all]")
@click.option("--volume_id_path", envvar="CSI_VOLUME_ID_PATH", type=click.BOOL, is_flag=False, flag_value=True, default=None, help="accepted for Mesos compatibility, no effect: volume ids always derive from names")
@click.option("--forward", envvar="CSI_FORWARD", help="relay every call to the plugin at this endpoint instead of serving")
@click.option("--volume_group", envvar="CSI_VOLUME_GROUP", help="serve this LVM volume group instead of the loop sandbox")
@click.option("--devices", envvar="CSI_DEVICES", help="with --volume_group: comma-separated PVs to create it on if missing")
@click.option("--lvm_config", envvar="CSI_LVM_CONFIG", default="", help="with --volume_group: --config for every lvm2 command")
@click.option("--node_id", envvar="CSI_NODE_ID", default="localhost")
@click.option("--plugin_name", envvar="CSI_PLUGIN_NAME", default=DEFAULT_PLUGIN_NAME)
@click.option("--default_size", envvar="CSI_DEFAULT_SIZE", type=SIZE, default="1GB", help="size of a volume created without capacity_range")
@click.option("--command_timeout", envvar="CSI_COMMAND_TIMEOUT", type=float, default=120.0, help="seconds before an lvm2/mkfs/mount command is killed")
@click.option("--log_level", envvar="CSI_LOG_LEVEL", default="info", type=click.Choice(["debug", "info", "warning", "error"]))
@click.version_option(package_name="csilvm", prog_name="test-csi-plugin")
@click.pass_context
def main(ctx: click.Context, **options) -> None:
    """csilvm with the flags of Mesos' test-csi-plugin; each flag is also read from CSI_<FLAG>."""
    from plugin.cli import configure_process, release_start_up_memory
    from plugin.server import EndpointError, serve_until, start_server, stop_on_signals

    configure_process(options["log_level"])
    if options["volume_id_path"]:
        log.info("--volume_id_path=true has no effect: csilvm volume ids are derived from volume names")
    if options["volume_group"] and ctx.get_parameter_source("available_capacity") is not click.core.ParameterSource.DEFAULT:
        log.warning("--available_capacity is ignored with --volume_group: the VG's free space is the capacity")
    stop = stop_on_signals()
    if options["forward"]:
        from plugin.forward import start_forwarder

        try:
            running = start_forwarder(options["endpoint"], options["forward"])
        except EndpointError as exc:
            raise click.ClickException(str(exc)) from None
        serve_until(stop, running)
        return
    if not options["work_dir"]:
        raise click.UsageError("--work_dir (or CSI_WORK_DIR) is required")
    api_versions = (options["api_version"],) if options["api_version"] else None
    try:
        core = build_core(options)
    except StorageError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        running = start_server(core, options["endpoint"], api_versions=api_versions)
    except EndpointError as exc:
        core.close()
        raise click.ClickException(str(exc)) from None
    release_start_up_memory()
    serve_until(stop, running)
    core.close()


if __name__ == "__main__":
    main()
