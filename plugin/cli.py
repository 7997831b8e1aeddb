"""The ``csilvm`` command: ``serve`` runs the plugin, ``client`` talks to a running one."""

from __future__ import annotations

import datetime
import faulthandler
import json
import logging
import socket
import sys

import click
import grpc

from lvm.errors import StorageError
from lvm.units import format_size, parse_size
from plugin import DEFAULT_PLUGIN_NAME

ENDPOINT_ENV = ["CSI_ENDPOINT", "CSILVM_ENDPOINT"]


class SizeParam(click.ParamType):
    """Bytes, or a size with a unit: 2GiB, 500M, 1048576."""

    name = "size"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except StorageError as exc:
            self.fail(str(exc), param, ctx)


class OctalParam(click.ParamType):
    name = "mode"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return int(value, 8)
        except ValueError:
            self.fail(f"{value!r} is not an octal file mode such as 0600", param, ctx)


SIZE = SizeParam()


def _key_values(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value")
        out[key] = value
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="csilvm", prog_name="csilvm")
def main() -> None:
    """csilvm: a CSI plugin for LVM volume groups, with a loop-device sandbox."""


@main.command()
@click.option("--endpoint", envvar=ENDPOINT_ENV, required=True, help="unix:///path/to/csi.sock or a plain socket path [env: CSI_ENDPOINT]")
@click.option("--backend", type=click.Choice(["loop", "lvm"]), default="loop", show_default=True, envvar="CSILVM_BACKEND", help="lvm: a volume group; loop: sparse files on loop devices (the sandbox)")
@click.option("--volume-group", envvar="CSILVM_VOLUME_GROUP", help="lvm: the volume group to serve (nothing outside it is ever touched)")
@click.option("--devices", envvar="CSILVM_DEVICES", help="lvm: comma-separated PVs; the VG is created on them (1 MiB extents) if missing")
@click.option("--lvm-config", envvar="CSILVM_LVM_CONFIG", default="", help="lvm: extra --config for every lvm2 command, e.g. 'activation{udev_sync=0 udev_rules=0}'")
@click.option("--work-dir", envvar="CSILVM_WORK_DIR", default="/var/lib/csilvm", show_default=True, help="loop: where volume images and their metadata live")
@click.option("--capacity", type=SIZE, envvar="CSILVM_CAPACITY", default="2GiB", show_default=True, help="loop: total size of all volumes")
@click.option("--thin-pool-size", envvar="CSILVM_THIN_POOL_SIZE", default="", help="lvm: size of a thin pool csilvm creates on first use of type=thin (bytes with a unit, or a percentage of the VG such as 50%); empty: only adopt existing pools")
@click.option("--thin-overprovision-ratio", type=float, envvar="CSILVM_THIN_OVERPROVISION_RATIO", default=1.0, show_default=True, help="virtual size of thin volumes allowed per byte of pool (1.0: no overcommit)")
@click.option("--thin-pool-full-percent", type=float, envvar="CSILVM_THIN_POOL_FULL_PERCENT", default=95.0, show_default=True, help="a thin pool whose data or metadata is this full takes no new volumes or snapshots")
@click.option("--node-id", envvar="CSILVM_NODE_ID", default=socket.gethostname(), show_default="host name")
@click.option("--plugin-name", envvar="CSILVM_PLUGIN_NAME", default=DEFAULT_PLUGIN_NAME, show_default=True)
@click.option("--default-fs", envvar="CSILVM_DEFAULT_FS", default="ext4", show_default=True, type=click.Choice(["ext4", "ext3", "xfs", "btrfs"]))
@click.option("--default-size", type=SIZE, envvar="CSILVM_DEFAULT_SIZE", default="1GiB", show_default=True, help="size of a volume created without capacity_range")
@click.option("--max-volumes-per-node", type=int, envvar="CSILVM_MAX_VOLUMES_PER_NODE", default=0, show_default=True)
@click.option("--socket-mode", type=OctalParam(), envvar="CSILVM_SOCKET_MODE", default="0600", show_default=True)
@click.option("--socket-group", envvar="CSILVM_SOCKET_GROUP", help="group owning the socket (with --socket-mode 0660)")
@click.option("--command-timeout", type=float, envvar="CSILVM_COMMAND_TIMEOUT", default=120.0, show_default=True, help="seconds before an lvm2/mkfs/mount command is killed")
@click.option("--api-version", "api_versions", multiple=True, type=click.Choice(["v1", "v0", "v0.1"]), envvar="CSILVM_API_VERSION", help="serve only these CSI versions (repeatable)  [default: v1, v0 (spec 0.2/0.3) and v0.1]")
@click.option("--log-format", envvar="CSILVM_LOG_FORMAT", default="text", show_default=True, type=click.Choice(["text", "json"]), help="json: one JSON object per line, for log collectors")
@click.option("--log-level", envvar="CSILVM_LOG_LEVEL", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"]))
def serve(**options) -> None:
    """Serve CSI Identity, Controller and Node on a Unix socket."""
    from plugin.backends import build_core
    from plugin.server import EndpointError, serve_until, start_server, stop_on_signals

    configure_process(options["log_level"], options["log_format"])
    stop = stop_on_signals()
    try:
        core = build_core(options)
        running = start_server(
            core,
            options["endpoint"],
            socket_mode=options["socket_mode"],
            socket_group=options["socket_group"],
            api_versions=tuple(options["api_versions"]) or None,
        )
    except (EndpointError, StorageError) as exc:  # e.g. the VG exists with other PVs
        raise click.ClickException(str(exc)) from None
    release_start_up_memory()
    serve_until(stop, running)
    core.close()


class JsonFormatter(logging.Formatter):
    """One JSON object per line (time, level, logger, message, and the traceback if any), for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_process(log_level: str, log_format: str = "text") -> None:
    """Logging to stderr, and scheduling suited to a server that runs commands from RPC threads."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    logging.basicConfig(level=log_level.upper(), handlers=[handler], force=True)
    logging.getLogger("sh").setLevel(logging.WARNING)  # sh logs every byte it reads at DEBUG
    faulthandler.enable()  # a crash or SIGABRT writes every thread's stack to stderr
    # sh runs reader threads for every command; a short GIL switch interval keeps
    # cheap RPCs (Probe, GetCapacity) fast while mutations run beside them.
    sys.setswitchinterval(0.0005)


def release_start_up_memory() -> None:
    """Give the heap that imports and start-up left free back to the OS (idle RSS), and
    exempt the start-up objects from garbage collection (latency)."""
    import ctypes
    import gc

    gc.collect()
    # Start-up objects live as long as the process: keep them out of every
    # later collection, whose full passes otherwise stall RPCs for milliseconds.
    gc.freeze()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


# ------------------------------------------------------------------- client
def _emit(ctx: click.Context, message, text: str) -> None:
    from plugin.client import as_dict

    if ctx.obj["json"]:
        click.echo(json.dumps(as_dict(message) if not isinstance(message, (dict, list)) else message, indent=2, sort_keys=True))
    else:
        click.echo(text)


@main.group()
@click.option("--endpoint", envvar=ENDPOINT_ENV, required=True, help="the plugin's socket [env: CSI_ENDPOINT]")
@click.option("--json", "as_json", is_flag=True, help="print the CSI responses as JSON")
@click.option("--timeout", type=float, default=60.0, show_default=True)
@click.pass_context
def client(ctx: click.Context, endpoint: str, as_json: bool, timeout: float) -> None:
    """Talk CSI v1 to a running plugin (like the csc tool)."""
    from plugin.client import CsiClient

    ctx.obj = {"client": ctx.with_resource(CsiClient(endpoint, timeout)), "json": as_json}


def _call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except grpc.RpcError as exc:
        raise click.ClickException(f"{exc.code().name}: {exc.details()}") from None


@client.command()
@click.pass_context
def probe(ctx):
    """Is the plugin ready?"""
    response = _call(ctx.obj["client"].probe)
    _emit(ctx, response, f"ready: {response.ready.value}")


@client.command()
@click.pass_context
def info(ctx):
    """Plugin name, version, capabilities and node."""
    c = ctx.obj["client"]
    plugin, node = _call(c.info), _call(c.node_info)
    if ctx.obj["json"]:
        from plugin.client import as_dict

        _emit(ctx, {"plugin": as_dict(plugin), "node": as_dict(node), "controller_capabilities": as_dict(_call(c.controller_capabilities)), "node_capabilities": as_dict(_call(c.node_capabilities))}, "")
        return
    click.echo(f"{plugin.name} {plugin.vendor_version} ({dict(plugin.manifest)})\nnode: {node.node_id} {dict(node.accessible_topology.segments)}")


@client.command()
@click.option("--param", "-p", multiple=True, help="profile parameter key=value (type=raid1, mirrors=1, ...)")
@click.option("--block", is_flag=True, help="ask for block capability")
@click.pass_context
def capacity(ctx, param, block):
    """Capacity for one profile."""
    response = _call(ctx.obj["client"].capacity, _key_values(param), block=block)
    _emit(
        ctx,
        response,
        f"available {format_size(response.available_capacity)}, "
        f"maximum volume {format_size(response.maximum_volume_size.value)}, "
        f"minimum volume {format_size(response.minimum_volume_size.value)}",
    )


@client.command("list")
@click.pass_context
def list_(ctx):
    """Every volume, pre-existing ones included."""
    volumes = _call(ctx.obj["client"].all_volumes)
    if ctx.obj["json"]:
        from plugin.client import as_dict

        _emit(ctx, [as_dict(v) for v in volumes], "")
        return
    for v in volumes:
        click.echo(f"{v.volume_id}\t{format_size(v.capacity_bytes)}\t{dict(v.volume_context)}")


@client.command()
@click.argument("name")
@click.option("--size", type=SIZE, default=0, help="required bytes (default: the plugin's default size)")
@click.option("--limit", type=SIZE, default=0, help="limit bytes")
@click.option("--param", "-p", multiple=True, help="profile parameter key=value")
@click.option("--block", is_flag=True)
@click.option("--from-snapshot", default="", help="restore this snapshot into the new volume")
@click.option("--from-volume", default="", help="clone this volume into the new volume")
@click.pass_context
def create(ctx, name, size, limit, param, block, from_snapshot, from_volume):
    """Create a volume (idempotent by NAME), empty or from a snapshot or a volume."""
    if from_snapshot and from_volume:
        raise click.UsageError("--from-snapshot and --from-volume exclude each other")
    volume = _call(
        ctx.obj["client"].create, name, size, limit, _key_values(param), block=block,
        from_snapshot=from_snapshot, from_volume=from_volume,
    )
    _emit(ctx, volume, f"{volume.volume_id}\t{format_size(volume.capacity_bytes)}")


def _snapshot_line(s) -> str:
    ready = "ready" if s.ready_to_use else "not ready"
    return f"{s.snapshot_id}\t{s.source_volume_id}\t{format_size(s.size_bytes)}\t{s.creation_time.ToJsonString()}\t{ready}"


@client.command()
@click.argument("name")
@click.argument("volume_id")
@click.pass_context
def snapshot(ctx, name, volume_id):
    """Snapshot a volume (idempotent by NAME)."""
    taken = _call(ctx.obj["client"].snapshot, name, volume_id)
    _emit(ctx, taken, _snapshot_line(taken))


@client.command()
@click.option("--volume", "source_volume_id", default="", help="only the snapshots of this volume")
@click.pass_context
def snapshots(ctx, source_volume_id):
    """Every snapshot: id, source volume, size, creation time, readiness."""
    response = _call(ctx.obj["client"].list_snapshots, source_volume_id=source_volume_id)
    entries = [e.snapshot for e in response.entries]
    while response.next_token:
        response = _call(ctx.obj["client"].list_snapshots, starting_token=response.next_token, source_volume_id=source_volume_id)
        entries += [e.snapshot for e in response.entries]
    if ctx.obj["json"]:
        from plugin.client import as_dict

        _emit(ctx, [as_dict(s) for s in entries], "")
        return
    for s in entries:
        click.echo(_snapshot_line(s))


@client.command("delete-snapshot")
@click.argument("snapshot_id")
@click.pass_context
def delete_snapshot(ctx, snapshot_id):
    """Delete a snapshot (an unknown id is success)."""
    _emit(ctx, _call(ctx.obj["client"].delete_snapshot, snapshot_id), f"deleted snapshot {snapshot_id}")


@client.command()
@click.argument("volume_id")
@click.pass_context
def delete(ctx, volume_id):
    """Delete a volume (an unknown id is success)."""
    _emit(ctx, _call(ctx.obj["client"].delete, volume_id), f"deleted {volume_id}")


def _staging_for(target: str) -> str:
    return target.rstrip("/") + ".staging"


@client.command()
@click.argument("volume_id")
@click.argument("target", type=click.Path())
@click.option("--staging", type=click.Path(), help="staging directory (default: TARGET.staging)")
@click.option("--block", is_flag=True, help="publish the raw block device onto TARGET (a file)")
@click.option("--fs", "fs_type", default="", help="file system (default: the plugin's)")
@click.option("--flag", "mount_flags", multiple=True, help="mount flag, e.g. noatime")
@click.option("--readonly", is_flag=True)
@click.pass_context
def publish(ctx, volume_id, target, staging, block, fs_type, mount_flags, readonly):
    """Stage and publish a volume at TARGET, as a CO would."""
    import os

    c = ctx.obj["client"]
    target = os.path.abspath(target)
    staging = os.path.abspath(staging or _staging_for(target))
    if not block:
        os.makedirs(staging, exist_ok=True)
    _call(c.stage, volume_id, staging, block=block, fs_type=fs_type, mount_flags=mount_flags)
    _call(c.publish, volume_id, staging, target, block=block, fs_type=fs_type, mount_flags=mount_flags, readonly=readonly)
    _emit(ctx, {"volume_id": volume_id, "target_path": target, "staging_target_path": staging}, f"published {volume_id} at {target}")


@client.command()
@click.argument("volume_id")
@click.argument("target", type=click.Path())
@click.option("--staging", type=click.Path(), help="staging directory (default: TARGET.staging)")
@click.pass_context
def unpublish(ctx, volume_id, target, staging):
    """Unpublish and unstage a volume."""
    import os

    c = ctx.obj["client"]
    target = os.path.abspath(target)
    staging = os.path.abspath(staging or _staging_for(target))
    _call(c.unpublish, volume_id, target)
    _call(c.unstage, volume_id, staging)
    if os.path.isdir(staging) and not os.listdir(staging):
        os.rmdir(staging)
    _emit(ctx, {"volume_id": volume_id}, f"unpublished {volume_id} from {target}")


@client.command()
@click.argument("volume_id")
@click.argument("path", type=click.Path())
@click.pass_context
def stats(ctx, volume_id, path):
    """Usage of a published volume."""
    import os

    response = _call(ctx.obj["client"].stats, volume_id, os.path.abspath(path))
    from protos.v1.csi_pb2 import VolumeUsage

    lines = [f"{VolumeUsage.Unit.Name(u.unit).lower()}: total {u.total} used {u.used} available {u.available}" for u in response.usage]
    _emit(ctx, response, "\n".join(lines))


@client.command()
@click.argument("volume_id")
@click.argument("size", type=SIZE)
@click.option("--target", type=click.Path(), help="where it is published: grow its file system there too")
@click.option("--staging", type=click.Path(), help="staging directory (default: TARGET.staging)")
@click.pass_context
def expand(ctx, volume_id, size, target, staging):
    """Grow a volume to SIZE (never shrinks); with --target, grow its published file system as well."""
    import os

    c = ctx.obj["client"]
    response = _call(c.expand, volume_id, size)
    text = f"{volume_id}\t{format_size(response.capacity_bytes)}"
    if target:
        target = os.path.abspath(target)
        staging = os.path.abspath(staging or _staging_for(target))
        _call(c.node_expand, volume_id, target, staging if os.path.isdir(target) else "")
        text += f" (grown at {target})"
    _emit(ctx, response, text)


@client.command()
@click.argument("volume_id")
@click.pass_context
def get(ctx, volume_id):
    """A volume and its health."""
    response = _call(ctx.obj["client"].get_volume, volume_id)
    condition = response.status.volume_condition
    health = f"abnormal: {condition.message}" if condition.abnormal else "healthy"
    _emit(ctx, response, f"{response.volume.volume_id}\t{format_size(response.volume.capacity_bytes)}\t{health}")


@client.command()
@click.argument("volume_id")
@click.option("--param", "-p", multiple=True, required=True, help="mutable parameter key=value (type=raid1, mirrors=2, ...)")
@click.pass_context
def modify(ctx, volume_id, param):
    """Change a volume's layout in place (raid1 mirrors, or back to linear)."""
    _emit(ctx, _call(ctx.obj["client"].modify, volume_id, _key_values(param)), f"modified {volume_id}")


if __name__ == "__main__":
    main()
