"""The version-neutral heart of the plugin: what every CSI version's servicers call.

Servicers translate protobuf messages of their CSI version to these calls and
back; nothing here knows a protobuf type.  The controller side delegates to a
:class:`lvm.backend.Backend`, the node side to :mod:`mount`.
"""

from __future__ import annotations

import contextlib
import enum
import os
import stat
import threading
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from lvm.backend import Backend, Capacity, Condition, ContentSource, SizeRange, Snapshot, Volume
from lvm.command import Runner
from lvm.errors import InvalidParameters, VolumeBusy, VolumeNotFound
from lvm.profiles import IGNORED_PREFIXES, parse_profile
from lvm.writer import MutationWriter
from mount import freeze as mount_freeze
from mount import fs as mount_fs
from mount import ops as mount_ops
from mount import resize as mount_resize
from mount import stats as mount_stats
from mount.table import MountEntry, MountTable, read_mount_table, shows_device
from plugin.errors import NotStaged, TopologyUnsatisfiable
from plugin.pagination import page
from plugin.settings import PluginSettings


class AccessMode(enum.Enum):
    """CSI access modes by their spec names (identical in v0 and v1)."""

    UNKNOWN = "UNKNOWN"
    SINGLE_NODE_WRITER = "SINGLE_NODE_WRITER"
    SINGLE_NODE_READER_ONLY = "SINGLE_NODE_READER_ONLY"
    MULTI_NODE_READER_ONLY = "MULTI_NODE_READER_ONLY"
    MULTI_NODE_SINGLE_WRITER = "MULTI_NODE_SINGLE_WRITER"
    MULTI_NODE_MULTI_WRITER = "MULTI_NODE_MULTI_WRITER"
    SINGLE_NODE_SINGLE_WRITER = "SINGLE_NODE_SINGLE_WRITER"
    SINGLE_NODE_MULTI_WRITER = "SINGLE_NODE_MULTI_WRITER"


# Local disks can be used on this node only.
SUPPORTED_ACCESS_MODES = frozenset(
    {
        AccessMode.SINGLE_NODE_WRITER,
        AccessMode.SINGLE_NODE_READER_ONLY,
        AccessMode.SINGLE_NODE_SINGLE_WRITER,
        AccessMode.SINGLE_NODE_MULTI_WRITER,
    }
)
READ_ONLY_MODES = frozenset({AccessMode.SINGLE_NODE_READER_ONLY, AccessMode.MULTI_NODE_READER_ONLY})


@dataclass(frozen=True)
class Capability:
    """A volume capability: block, or a mount with a file system type and flags."""

    block: bool
    access_mode: AccessMode
    fs_type: str = ""
    mount_flags: tuple[str, ...] = ()

    def problem(self) -> str | None:
        """Why this capability cannot be served, or None."""
        # UNKNOWN only reaches here from GetCapacity (validation rejects it elsewhere): no constraint.
        if self.access_mode not in SUPPORTED_ACCESS_MODES and self.access_mode is not AccessMode.UNKNOWN:
            return f"access mode {self.access_mode.value} is not supported: csilvm volumes are local to one node"
        if not self.block and self.fs_type and self.fs_type not in mount_fs.SUPPORTED_FS_TYPES:
            return f"fs_type {self.fs_type!r} is not supported (use one of {', '.join(sorted(mount_fs.SUPPORTED_FS_TYPES))})"
        if not self.block:
            try:
                mount_ops.validate_mount_flags(self.mount_flags)
            except Exception as exc:  # InvalidMountFlags: reported as text here
                return str(exc)
        return None


@dataclass(frozen=True)
class VolumeStats:
    bytes_total: int
    bytes_used: int | None = None
    bytes_available: int | None = None
    inodes_total: int | None = None
    inodes_used: int | None = None
    inodes_available: int | None = None
    condition: Condition = Condition()


class KeyedLocks:
    """One lock per key (volume id), so operations on one volume run one at a time.

    A key's lock lives while someone holds or waits for it, so the table
    stays as small as the number of volumes being worked on.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._entries: dict[str, list] = {}  # key -> [lock, holders and waiters]

    @contextlib.contextmanager
    def __call__(self, key: str) -> Iterator[None]:
        with self._guard:
            entry = self._entries.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._entries[key]

    def __len__(self) -> int:
        with self._guard:
            return len(self._entries)


class Core:
    """Controller and node operations, independent of the CSI version on the wire."""

    def __init__(self, backend: Backend, settings: PluginSettings, runner: Runner):
        self.backend = backend
        self.settings = settings
        self.runner = runner
        self._volume_locks = KeyedLocks()
        self._writer = MutationWriter()  # creates and deletes, one at a time, at low CPU priority

    def close(self) -> None:
        """Finish the queued mutations and close the backend."""
        self._writer.close()
        self.backend.close()

    # ----------------------------------------------------------------- identity
    def probe(self) -> None:
        self.backend.probe()

    # --------------------------------------------------------------- controller
    @property
    def topology(self) -> dict[str, str]:
        return {self.settings.topology_key: self.settings.node_id}

    def topology_admits(self, segments: Sequence[Mapping[str, str]]) -> bool:
        """True when one of ``segments`` (empty: no constraint) is satisfied by this node."""
        return not segments or any(all(self.topology.get(k) == v for k, v in seg.items()) for seg in segments)

    def create_volume(
        self,
        name: str,
        size: SizeRange,
        capabilities: Sequence[Capability],
        parameters: Mapping[str, str],
        requisite_topology: Sequence[Mapping[str, str]] = (),
        mutable_parameters: Mapping[str, str] | None = None,
        content_source: ContentSource | None = None,
    ) -> Volume:
        """``mutable_parameters`` (CSI 1.11+) take precedence over ``parameters``, as the spec says.

        With ``content_source`` the volume is a restore of a snapshot or a clone
        of a volume (a mounted source is frozen while its bytes are taken).
        """
        if mutable_parameters:
            parameters = {**parameters, **mutable_parameters}
        for cap in capabilities:
            problem = cap.problem()
            if problem:
                raise InvalidParameters(problem)
        profile = parse_profile(self.profile_parameters(parameters))
        if not self.topology_admits(requisite_topology):
            raise TopologyUnsatisfiable(
                f"this plugin only provisions on node {self.settings.node_id!r} "
                f"(topology {self.topology}); none of the requisite segments match"
            )
        if content_source is None:
            return self._writer.run(self.backend.create_volume, name, size, profile)
        if content_source.kind == ContentSource.VOLUME:
            with self._volume_locks(content_source.id), self._quiesced(content_source.id):
                return self._writer.run(self.backend.create_volume, name, size, profile, content_source)
        return self._writer.run(self.backend.create_volume, name, size, profile, content_source)

    # ---------------------------------------------------------------- snapshots
    @contextlib.contextmanager
    def _quiesced(self, volume_id: str) -> Iterator[None]:
        """Hold the file system of ``volume_id`` still, where it is mounted on this node, while a copy is taken.

        Backends whose snapshots suspend the device (device-mapper) need nothing;
        for the others the file system is frozen (FIFREEZE), which writes its
        dirty data and journal out first.
        """
        device = None if self.backend.snapshots_quiesce else self.backend.device_of(volume_id)
        if not device:
            yield
            return
        # Writes through a published block device may still sit in the device's page cache.
        descriptor = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        rdev = os.stat(device).st_rdev
        # The file system's mounts (a block volume's bind mount onto a file shows the device node, not a file system).
        mounts = [m for m in read_mount_table().of_device(device) if shows_device(m, rdev) and os.path.isdir(m.mount_point)]
        if not mounts:
            yield
            return
        with mount_freeze.frozen(mounts[0].mount_point):
            yield

    def create_snapshot(self, name: str, source_volume_id: str, parameters: Mapping[str, str]) -> Snapshot:
        unknown = sorted(k for k in parameters if not k.startswith(IGNORED_PREFIXES))
        if unknown:
            raise InvalidParameters(f"unknown snapshot parameter(s) {', '.join(unknown)}: csilvm takes none")
        with self._volume_locks(source_volume_id), self._quiesced(source_volume_id):
            return self._writer.run(self.backend.create_snapshot, name, source_volume_id)

    def delete_snapshot(self, snapshot_id: str) -> None:
        self._writer.run(self.backend.delete_snapshot, snapshot_id)

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        return self.backend.get_snapshot(snapshot_id)

    def list_snapshots(
        self, max_entries: int, starting_token: str, snapshot_id: str = "", source_volume_id: str = ""
    ) -> tuple[list[Snapshot], str]:
        """A page of snapshots, filtered by id and/or source volume (no match: an empty page, as the spec says)."""
        snapshots = [
            s for s in self.backend.list_snapshots()
            if (not snapshot_id or s.id == snapshot_id) and (not source_volume_id or s.source_volume_id == source_volume_id)
        ]
        return page(snapshots, max_entries, starting_token, key=lambda s: s.id)

    def expand_volume(self, volume_id: str, size: SizeRange, capability: Capability | None) -> tuple[int, bool]:
        """Grow the volume; returns (its size, whether NodeExpandVolume must grow a file system on it)."""
        if capability is not None:
            problem = capability.problem()
            if problem:
                raise InvalidParameters(problem)
        with self._volume_locks(volume_id):
            new_size = self._writer.run(self.backend.expand_volume, volume_id, size)
        return new_size, not (capability is not None and capability.block)

    def modify_volume(self, volume_id: str, mutable_parameters: Mapping[str, str]) -> Volume:
        """Change the volume's layout in place (ControllerModifyVolume)."""
        with self._volume_locks(volume_id):
            return self._writer.run(self.backend.modify_volume, volume_id, dict(mutable_parameters))

    def volume_status(self, volume_id: str) -> tuple[Volume, Condition]:
        """The volume and its health (ControllerGetVolume, NodeGetVolumeStats).

        A volume whose storage is damaged so badly that it cannot be read (the
        sandbox's image removed by hand) is still known: it is answered as
        abnormal, with size 0, rather than as unknown.
        """
        try:
            volume = self.backend.get_volume(volume_id)
        except VolumeNotFound:
            condition = self.backend.volume_condition(volume_id)  # VolumeNotFound when it is unknown
            return Volume(id=volume_id, size=0, device=""), condition
        return volume, self.condition_of(volume)

    def delete_volume(self, volume_id: str) -> None:
        """Delete, unless the volume is still staged or published somewhere on this node."""
        with self._volume_locks(volume_id):
            self._writer.run(self._delete_unless_mounted, volume_id)

    def _delete_unless_mounted(self, volume_id: str) -> None:
        device = self.backend.device_of(volume_id)
        if device:
            in_use = read_mount_table().of_device(device)
            if in_use:
                places = ", ".join(sorted({e.mount_point for e in in_use}))
                raise VolumeBusy(f"volume {volume_id} is still published or staged at {places}: unpublish it first")
        self.backend.delete_volume(volume_id)

    def capacity(
        self,
        parameters: Mapping[str, str],
        capabilities: Sequence[Capability],
        topology: Mapping[str, str] | None = None,
    ) -> Capacity:
        """Capacity for a profile; unknown parameters or unservable capabilities give 0 (Mesos relies on it)."""
        if any(cap.problem() for cap in capabilities):
            return Capacity.none()
        if topology and not self.topology_admits([topology]):
            return Capacity.none()
        try:
            profile = parse_profile(self.profile_parameters(parameters))
        except InvalidParameters:
            return Capacity.none()
        return self.backend.capacity(profile)

    def profile_parameters(self, parameters: Mapping[str, str]) -> dict[str, str]:
        """``parameters`` less the required ones, which must all be present with their values."""
        required = self.settings.required_parameters
        missing = {k: v for k, v in required.items() if parameters.get(k) != v}
        if missing:
            wanted = ";".join(f"{k}={v}" for k, v in sorted(missing.items()))
            raise InvalidParameters(f"this plugin requires the parameters {wanted}")
        return {k: v for k, v in parameters.items() if k not in required}

    def list_volumes(self, max_entries: int, starting_token: str) -> tuple[list[Volume], str]:
        return page(self.backend.list_volumes(), max_entries, starting_token, key=lambda v: v.id)

    def condition_of(self, volume: Volume) -> Condition:
        """The volume's health: what the backend learnt while reading it, else a look of its own."""
        if volume.condition is not None:
            return volume.condition
        try:
            return self.backend.volume_condition(volume.id)
        except VolumeNotFound:
            return Condition.problem(f"volume {volume.id} disappeared while it was being listed")

    def get_volume(self, volume_id: str) -> Volume:
        return self.backend.get_volume(volume_id)

    def validate_capabilities(self, volume_id: str, capabilities: Sequence[Capability]) -> str | None:
        """None when the existing volume supports every capability, else the reason it does not."""
        self.backend.get_volume(volume_id)  # VolumeNotFound
        for cap in capabilities:
            problem = cap.problem()
            if problem:
                return problem
        return None

    def volume_context(self, volume: Volume) -> dict[str, str]:
        """What the CO gets back in ``volume_context`` and hands to NodeStage/NodePublish."""
        context = dict(self.settings.extra_context)
        context.update({f"{self.settings.context_prefix}{k}": v for k, v in volume.attributes.items()})
        if volume.profile is not None:
            context.update({f"{self.settings.context_prefix}{k}": v for k, v in volume.profile.as_parameters().items()})
        if volume.tags:
            context[f"{self.settings.context_prefix}tags"] = ",".join(volume.tags)
        if volume.name is not None:
            context[f"{self.settings.context_prefix}name"] = volume.name
        return context

    # --------------------------------------------------------------------- node
    def _device(self, volume_id: str) -> str:
        volume = self.backend.get_volume(volume_id)
        if volume.incomplete:
            raise VolumeBusy(
                f"volume {volume_id} is incomplete: its content is still being copied (or the copy was cut); "
                f"it can be used once CreateVolume has returned it"
            )
        return volume.device

    def stage(self, volume_id: str, staging_path: str, capability: Capability) -> None:
        """Make the file system if the device is blank and mount it at ``staging_path``.

        Block volumes need no staging: NodePublish binds the device node directly.
        """
        problem = capability.problem()
        if problem:
            raise InvalidParameters(problem)
        with self._volume_locks(volume_id):
            device = self._device(volume_id)
            if capability.block:
                return
            fs_type = capability.fs_type or self.settings.default_fs
            mount_ops.stage_filesystem(device, staging_path, fs_type, capability.mount_flags, self.runner)

    def unstage(self, volume_id: str, staging_path: str) -> None:
        with self._volume_locks(volume_id):
            mount_ops.unstage(staging_path, self.runner)

    def publish(
        self,
        volume_id: str,
        staging_path: str,
        target_path: str,
        capability: Capability,
        readonly: bool,
    ) -> None:
        problem = capability.problem()
        if problem:
            raise InvalidParameters(problem)
        readonly = readonly or capability.access_mode in READ_ONLY_MODES
        with self._volume_locks(volume_id):
            device = self._device(volume_id)
            if capability.block:
                mount_ops.publish_block(device, target_path, readonly, self.runner)
                return
            if not _is_mount_of(staging_path, device):
                raise NotStaged(
                    f"volume {volume_id} is not staged at {staging_path}: call NodeStageVolume first"
                )
            mount_ops.publish_bind(staging_path, target_path, readonly, capability.mount_flags, self.runner)

    def unpublish(self, volume_id: str, target_path: str, *, remove_target: bool = True) -> None:
        """Unmount the target; remove it too unless the CO owns it (CSI v0)."""
        with self._volume_locks(volume_id):
            mount_ops.unpublish(target_path, self.runner, remove_target=remove_target)

    def stats(self, volume_id: str, volume_path: str) -> VolumeStats:
        volume, condition = self.volume_status(volume_id)
        if not os.path.exists(volume_path):
            raise VolumeNotFound(f"volume path {volume_path} does not exist")
        device = volume.device  # "" when the volume cannot be read: then trust what is mounted at the path
        if os.path.isdir(volume_path):
            if _is_mount_of(volume_path, device) if device else read_mount_table().is_mount_point(os.path.realpath(volume_path)):
                usage = mount_stats.filesystem_usage(volume_path)
                return VolumeStats(
                    usage.bytes_total, usage.bytes_used, usage.bytes_available,
                    usage.inodes_total, usage.inodes_used, usage.inodes_available, condition,
                )
        else:
            node = os.stat(volume_path)
            if node.st_rdev == os.stat(device).st_rdev if device else stat.S_ISBLK(node.st_mode):
                return VolumeStats(mount_stats.block_device_size(volume_path), condition=condition)
        raise VolumeNotFound(f"volume {volume_id} is not published at {volume_path}")

    def node_expand(self, volume_id: str, volume_path: str, staging_path: str = "") -> int:
        """Grow the file system of a published (or staged) volume to its device; returns the device's size.

        A block volume has nothing to grow: its size is the device's, read afresh.
        """
        with self._volume_locks(volume_id):
            device = self._device(volume_id)
            if not os.path.exists(volume_path):
                raise VolumeNotFound(f"volume path {volume_path} does not exist")
            size = mount_stats.block_device_size(device)
            if not os.path.isdir(volume_path):
                if os.stat(volume_path).st_rdev != os.stat(device).st_rdev:
                    raise VolumeNotFound(f"volume {volume_id} is not published at {volume_path}")
                return size
            table = read_mount_table()
            for path in (staging_path, volume_path):
                entry = _mount_of(path, device, table) if path else None
                if entry is not None:
                    mount_resize.grow_filesystem(device, entry.fs_type, self.runner, mount_point=entry.mount_point)
                    return size
            raise VolumeNotFound(f"volume {volume_id} is not published at {volume_path}")


def _mount_of(path: str, device: str, table: MountTable | None = None) -> MountEntry | None:
    """The mount at ``path`` when the file system visible there is the one on ``device``, else None."""
    entry = (table or read_mount_table()).at(os.path.realpath(path))
    return entry if entry is not None and shows_device(entry, os.stat(device).st_rdev) else None


def _is_mount_of(path: str, device: str) -> bool:
    return _mount_of(path, device) is not None
