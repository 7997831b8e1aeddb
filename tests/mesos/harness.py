"""A stand-in for Mesos' storage local resource provider (SLRP), driving ``test-csi-plugin``.

It launches the plugin as the SLRP launches its plugin container (a fresh
endpoint directory, ``CSI_ENDPOINT`` and the plugin's ``CSI_*`` flags in an
otherwise empty environment, then waiting for the socket), and replays the
SLRP's calls over CSI v1 or v0: the handshake, GetCapacity per profile of
``examples/mesos/profiles.json``, ListVolumes for pre-existing disks, then per
profile CreateVolume (an operation UUID as the name, required == limit, whole
MiB), NodeStage/NodePublish under ``<work>/mounts/<id>/``, data written and read
back, NodeUnpublish/NodeUnstage, DeleteVolume, with capacity accounting checked
after each step and one kill -9 + relaunch between CreateVolume and
NodePublishVolume.  The backend (loop sandbox or an LVM volume group) is a
parameter: :class:`BackendSpec`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import grpc

from tests.plugin_process import REPO, ReadyNotice, detach_loops_of, unmount_everything_below

MiB = 1 << 20
EXAMPLES = REPO / "examples" / "mesos"
PROFILES_FILE = EXAMPLES / "profiles.json"
RESOURCE_PROVIDER_FILE = EXAMPLES / "resource_provider.json"
# Smallest file systems mkfs makes (xfsprogs >= 5.19 refuses below 300 MiB).
MIN_MIB = {"xfs": 300, "btrfs": 114, "ext4": 8, "ext3": 8, "": 8, None: 1}


# --- profiles ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DiskProfile:
    """One entry of a UriDiskProfileAdaptor ``profile_matrix``."""

    name: str
    block: bool
    fs_type: str
    access_mode: str
    parameters: Mapping[str, str]
    plugin_type: str

    @property
    def min_mib(self) -> int:
        return MIN_MIB[None] if self.block else MIN_MIB.get(self.fs_type, 8)

    @property
    def granularity_mib(self) -> int:
        """A raid0 LV of N stripes (1 MiB extents) is a multiple of N MiB: the SLRP's size must be one too."""
        if self.parameters.get("type") == "raid0":
            return int(self.parameters.get("stripes", "2"))
        return 1


def load_profiles(path: Path = PROFILES_FILE) -> list[DiskProfile]:
    """The profiles of a profile matrix file, in file order."""
    matrix = json.loads(path.read_text())["profile_matrix"]
    profiles = []
    for name, entry in matrix.items():
        caps = entry["volume_capabilities"]
        profiles.append(
            DiskProfile(
                name=name,
                block="block" in caps,
                fs_type=caps.get("mount", {}).get("fs_type", ""),
                access_mode=caps["access_mode"]["mode"],
                parameters=dict(entry.get("create_parameters", {})),
                plugin_type=entry["csi_plugin_type_selector"]["plugin_type"],
            )
        )
    return profiles


def size_for(profile: DiskProfile, index: int = 0) -> int:
    """A whole number of MiB, not a multiple of 4 (unless the layout's granularity is), large enough for the file system."""
    step = profile.granularity_mib
    mib = -(-(profile.min_mib + 1 + index) // step) * step
    if step % 4:
        while mib % 4 == 0:
            mib += step
    return mib * MiB


# --- the plugin container ---------------------------------------------------------------------


def plugin_command() -> list[str]:
    """``test-csi-plugin`` when installed on PATH, else the same entry point run from this checkout."""
    installed = shutil.which("test-csi-plugin")
    return [installed] if installed else [sys.executable, "-m", "plugin.mesos"]


@dataclass(frozen=True)
class BackendSpec:
    """How the plugin stores volumes: the loop sandbox (``available``, ``volumes``) or a VG."""

    kind: str = "loop"
    available: str = "1GB"
    volumes: Mapping[str, str] = field(default_factory=dict)  # pre-provisioned name -> Mesos size
    volume_group: str = ""

    def env(self) -> dict[str, str]:
        if self.kind == "lvm":
            return {"CSI_VOLUME_GROUP": self.volume_group}
        env = {"CSI_AVAILABLE_CAPACITY": self.available}
        if self.volumes:
            env["CSI_VOLUMES"] = ";".join(f"{n}:{s}" for n, s in self.volumes.items())
        return env


class PluginContainer:
    """One ``test-csi-plugin`` process per :meth:`launch`, each on a fresh endpoint directory."""

    def __init__(self, work_dir: Path, env: Mapping[str, str], args: tuple[str, ...] = ()):
        self.work_dir = Path(work_dir)
        self.env = dict(env)
        self.args = tuple(args)
        self.proc: subprocess.Popen | None = None
        self.endpoint_dir: Path | None = None
        self.log_path: Path | None = None
        self.launches = 0
        self._dirs: list[Path] = []

    @property
    def socket_path(self) -> Path:
        assert self.endpoint_dir is not None
        return self.endpoint_dir / "endpoint.sock"

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket_path}"

    def launch(self, timeout: float = 180.0) -> str:
        """Start the plugin and wait for its socket to answer; returns the endpoint."""
        self.endpoint_dir = Path(tempfile.mkdtemp(prefix="mesos-csi-", dir="/tmp"))  # short socket path
        self._dirs.append(self.endpoint_dir)
        self.launches += 1
        self.work_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = self.work_dir.parent / f"plugin-{self.launches}.log"
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "CSI_ENDPOINT": self.endpoint,
            "CSI_WORK_DIR": str(self.work_dir),
            **self.env,
        }
        with ReadyNotice() as notice, open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [*plugin_command(), *self.args], cwd=REPO, env={**env, "NOTIFY_SOCKET": notice.address},
                stdout=log, stderr=subprocess.STDOUT,
            )
            notice.wait(self.proc, timeout, self.log)
        assert_accepts_connections(self.socket_path)
        return self.endpoint

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(60)

    def stop(self) -> int | None:
        """SIGTERM (as when the SLRP stops the container); the exit status, None if not running."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        return self.kill(signal.SIGTERM)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill(signal.SIGKILL)
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)


def assert_accepts_connections(path: Path) -> None:
    """Something accepts connections on ``path`` (what the SLRP waits for)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.connect(str(path))


# --- CSI clients, one per version ---------------------------------------------------------------


@dataclass(frozen=True)
class Disk:
    id: str
    capacity: int
    context: Mapping[str, str]


class CsiApi:
    """The calls the SLRP makes, over one CSI version; ``calls`` records the method names."""

    version = ""

    def __init__(self, endpoint: str, timeout: float = 120.0):
        self.channel = grpc.insecure_channel(endpoint)
        self.timeout = timeout
        self.calls: list[str] = []
        pb, grpc_mod = self.modules()
        self.pb = pb
        self.identity = grpc_mod.IdentityStub(self.channel)
        self.controller = grpc_mod.ControllerStub(self.channel)
        self.node = grpc_mod.NodeStub(self.channel)

    def modules(self):
        raise NotImplementedError

    def close(self) -> None:
        self.channel.close()

    def _call(self, stub, method: str, request):
        self.calls.append(method)
        return getattr(stub, method)(request, timeout=self.timeout)

    def capability(self, profile: DiskProfile):
        pb = self.pb
        mode = pb.VolumeCapability.AccessMode(mode=pb.VolumeCapability.AccessMode.Mode.Value(profile.access_mode))
        if profile.block:
            return pb.VolumeCapability(block=pb.VolumeCapability.BlockVolume(), access_mode=mode)
        return pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume(fs_type=profile.fs_type), access_mode=mode)

    # identity + capabilities, as the SLRP does when it (re)connects
    def handshake(self) -> dict:
        pb = self.pb
        info = self._call(self.identity, "GetPluginInfo", pb.GetPluginInfoRequest())
        plugin_caps = self._call(self.identity, "GetPluginCapabilities", pb.GetPluginCapabilitiesRequest())
        probe = self._call(self.identity, "Probe", pb.ProbeRequest())
        controller = self._call(self.controller, "ControllerGetCapabilities", pb.ControllerGetCapabilitiesRequest())
        node = self._call(self.node, "NodeGetCapabilities", pb.NodeGetCapabilitiesRequest())
        return {
            "name": info.name,
            "vendor_version": info.vendor_version,
            "ready": probe.ready.value if probe.HasField("ready") else True,
            "plugin_capabilities": {pb.PluginCapability.Service.Type.Name(c.service.type) for c in plugin_caps.capabilities},
            "controller_capabilities": {
                pb.ControllerServiceCapability.RPC.Type.Name(c.rpc.type) for c in controller.capabilities
            },
            "node_capabilities": {pb.NodeServiceCapability.RPC.Type.Name(c.rpc.type) for c in node.capabilities},
            "node_id": self.node_id(),
        }

    def capacity(self, profile: DiskProfile) -> int:
        request = self.pb.GetCapacityRequest(volume_capabilities=[self.capability(profile)], parameters=dict(profile.parameters))
        return self._call(self.controller, "GetCapacity", request).available_capacity

    def list_volumes(self) -> list[Disk]:
        disks, token = [], ""
        while True:
            response = self._call(self.controller, "ListVolumes", self.pb.ListVolumesRequest(max_entries=2, starting_token=token))
            disks += [self._disk(entry.volume) for entry in response.entries]
            token = response.next_token
            if not token:
                return disks

    def create(self, name: str, size: int, profile: DiskProfile) -> Disk:
        pb = self.pb
        request = pb.CreateVolumeRequest(
            name=name,
            capacity_range=pb.CapacityRange(required_bytes=size, limit_bytes=size),
            volume_capabilities=[self.capability(profile)],
            parameters=dict(profile.parameters),
        )
        return self._disk(self._call(self.controller, "CreateVolume", request).volume)

    def delete(self, volume_id: str) -> None:
        self._call(self.controller, "DeleteVolume", self.pb.DeleteVolumeRequest(volume_id=volume_id))

    def unstage(self, volume_id: str, staging: Path) -> None:
        request = self.pb.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=str(staging))
        self._call(self.node, "NodeUnstageVolume", request)

    def unpublish(self, volume_id: str, target: Path) -> None:
        request = self.pb.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target))
        self._call(self.node, "NodeUnpublishVolume", request)


class CsiV1(CsiApi):
    version = "v1"
    co_creates_target = False  # v1: the plugin creates the target path

    def modules(self):
        from protos.v1 import csi_pb2, csi_pb2_grpc

        return csi_pb2, csi_pb2_grpc

    def node_id(self) -> str:
        return self._call(self.node, "NodeGetInfo", self.pb.NodeGetInfoRequest()).node_id

    def _disk(self, volume) -> Disk:
        return Disk(volume.volume_id, volume.capacity_bytes, dict(volume.volume_context))

    def validate(self, disk: Disk, profile: DiskProfile) -> bool:
        request = self.pb.ValidateVolumeCapabilitiesRequest(
            volume_id=disk.id, volume_context=dict(disk.context), volume_capabilities=[self.capability(profile)]
        )
        return self._call(self.controller, "ValidateVolumeCapabilities", request).HasField("confirmed")

    def stage(self, disk: Disk, staging: Path, profile: DiskProfile) -> None:
        request = self.pb.NodeStageVolumeRequest(
            volume_id=disk.id, staging_target_path=str(staging),
            volume_capability=self.capability(profile), volume_context=dict(disk.context),
        )
        self._call(self.node, "NodeStageVolume", request)

    def publish(self, disk: Disk, staging: Path, target: Path, profile: DiskProfile) -> None:
        request = self.pb.NodePublishVolumeRequest(
            volume_id=disk.id, staging_target_path=str(staging), target_path=str(target),
            volume_capability=self.capability(profile), volume_context=dict(disk.context),
        )
        self._call(self.node, "NodePublishVolume", request)


class CsiV0(CsiApi):
    """CSI 0.3 (package ``csi.v0``): ``Volume.id``/``attributes``, ``NodeGetId``, the CO owns the target."""

    version = "v0"
    co_creates_target = True

    def modules(self):
        from protos.v0 import csi_pb2, csi_pb2_grpc

        return csi_pb2, csi_pb2_grpc

    def node_id(self) -> str:
        return self._call(self.node, "NodeGetId", self.pb.NodeGetIdRequest()).node_id

    def _disk(self, volume) -> Disk:
        return Disk(volume.id, volume.capacity_bytes, dict(volume.attributes))

    def validate(self, disk: Disk, profile: DiskProfile) -> bool:
        request = self.pb.ValidateVolumeCapabilitiesRequest(
            volume_id=disk.id, volume_attributes=dict(disk.context), volume_capabilities=[self.capability(profile)]
        )
        return self._call(self.controller, "ValidateVolumeCapabilities", request).supported

    def stage(self, disk: Disk, staging: Path, profile: DiskProfile) -> None:
        request = self.pb.NodeStageVolumeRequest(
            volume_id=disk.id, staging_target_path=str(staging),
            volume_capability=self.capability(profile), volume_attributes=dict(disk.context),
        )
        self._call(self.node, "NodeStageVolume", request)

    def publish(self, disk: Disk, staging: Path, target: Path, profile: DiskProfile) -> None:
        request = self.pb.NodePublishVolumeRequest(
            volume_id=disk.id, staging_target_path=str(staging), target_path=str(target),
            volume_capability=self.capability(profile), volume_attributes=dict(disk.context),
        )
        self._call(self.node, "NodePublishVolume", request)


APIS = {"v1": CsiV1, "v0": CsiV0}


# --- checks on the node ---------------------------------------------------------------------------


def mount_fs_type(path: Path) -> str | None:
    """The file system type mounted at ``path`` (the last mount there), or None."""
    found = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(path):
            found = fields[fields.index("-") + 1]
    return found


def write_and_read_back(target: Path, profile: DiskProfile, size: int) -> None:
    """Write data through the published target and read it back (for a block disk, at its last MiB)."""
    data = os.urandom(64 * 1024)
    if profile.block:
        fd = os.open(target, os.O_RDWR | os.O_CLOEXEC)
        try:
            assert os.lseek(fd, 0, os.SEEK_END) == size, "the block device does not have the requested size"
            os.pwrite(fd, data, size - MiB)
            os.fsync(fd)
            assert os.pread(fd, len(data), size - MiB) == data
        finally:
            os.close(fd)
        return
    assert mount_fs_type(target) == (profile.fs_type or mount_fs_type(target)), f"{target} is not {profile.fs_type}"
    check = target / "written-by-the-slrp-harness"
    with open(check, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    assert check.read_bytes() == data


# --- the replay -----------------------------------------------------------------------------------


@dataclass
class Report:
    """What a replay did, for the test to assert on and print."""

    handshake: dict = field(default_factory=dict)
    initial_capacity: dict[str, int] = field(default_factory=dict)
    pre_existing: list[Disk] = field(default_factory=list)
    exercised: list[str] = field(default_factory=list)  # profiles whose disk went through the whole life cycle
    skipped: dict[str, str] = field(default_factory=dict)  # profile -> why (capacity 0, too small)
    killed_during: str = ""
    calls: list[str] = field(default_factory=list)


class SlrpReplay:
    """Replay the SLRP's call sequence against a plugin container.

    ``base`` holds the plugin's work dir (``base/plugin``) and the SLRP's mounts
    (``base/mounts/<id>/{staging,target}``); :meth:`cleanup` unmounts and
    detaches whatever a failed run left.
    """

    def __init__(self, base: Path, api_version: str = "v1", backend: BackendSpec = BackendSpec(),
                 profiles: list[DiskProfile] | None = None, extra_env: Mapping[str, str] | None = None,
                 args: tuple[str, ...] = ()):
        self.base = Path(base)
        self.api_class = APIS[api_version]
        self.backend = backend
        self.profiles = profiles if profiles is not None else load_profiles()
        self.work_dir = self.base / "plugin"
        self.mounts = self.base / "mounts"
        env = {**backend.env(), **(extra_env or {})}
        if "CSI_API_VERSION" not in env and not any(a.startswith("--api_version") for a in args):
            env["CSI_API_VERSION"] = api_version
        self.container = PluginContainer(self.work_dir, env, args)
        self.api: CsiApi | None = None
        self.report = Report()

    # -- plumbing
    def connect(self) -> CsiApi:
        if self.api is not None:
            self.report.calls += self.api.calls
            self.api.close()
        self.api = self.api_class(self.container.endpoint)
        return self.api

    def relaunch_after_kill(self) -> None:
        """kill -9 the plugin, as a crash or an agent restart would, and launch it again."""
        self.container.kill(signal.SIGKILL)
        self.container.launch()
        self.connect()
        self.handshake()

    def cleanup(self) -> None:
        if self.api is not None:
            self.api.close()
        self.container.close()
        unmount_everything_below(self.base)
        if self.backend.kind == "loop":
            detach_loops_of(self.work_dir)

    def capacities(self) -> dict[str, int]:
        return {p.name: self.api.capacity(p) for p in self.profiles}

    # -- the sequence
    def handshake(self) -> dict:
        info = self.api.handshake()
        assert info["ready"], "Probe says not ready"
        assert "CONTROLLER_SERVICE" in info["plugin_capabilities"]
        assert {"CREATE_DELETE_VOLUME", "GET_CAPACITY", "LIST_VOLUMES"} <= info["controller_capabilities"]
        assert "STAGE_UNSTAGE_VOLUME" in info["node_capabilities"]
        return info

    def run(self, *, kill_between_create_and_publish: bool = True) -> Report:
        self.container.launch()
        self.connect()
        self.report.handshake = self.handshake()
        initial = self.capacities()
        self.report.initial_capacity = dict(initial)
        for name, cap in initial.items():
            assert cap >= 0 and cap % MiB == 0, f"capacity of {name} is not a whole number of MiB: {cap}"
        self.report.pre_existing = self.api.list_volumes()
        known = {d.id for d in self.report.pre_existing}
        killed = not kill_between_create_and_publish
        for profile in self.profiles:
            size = size_for(profile, len(self.report.exercised))
            available = self.capacities()[profile.name]
            if available == 0:
                self.report.skipped[profile.name] = "capacity 0: the SLRP offers no disk of this profile"
                self._expect_create_refused(profile, size)
                continue
            if size > available:
                self.report.skipped[profile.name] = f"needs {size // MiB} MiB, {available // MiB} MiB available"
                continue
            self._life_cycle(profile, size, known, kill=not killed)
            killed = True
            self.report.exercised.append(profile.name)
            assert self.capacities() == initial, "capacity not given back after DeleteVolume"
        assert {d.id for d in self.api.list_volumes()} == known, "ListVolumes differs from the start"
        self.report.calls += self.api.calls
        self.api.calls = []
        assert self.container.stop() == 0, f"plugin did not stop cleanly:\n{self.container.log()}"
        return self.report

    def _expect_create_refused(self, profile: DiskProfile, size: int) -> None:
        try:
            disk = self.api.create(str(uuid.uuid4()), size, profile)
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.RESOURCE_EXHAUSTED), exc
            return
        self.api.delete(disk.id)
        raise AssertionError(f"CreateVolume succeeded for profile {profile.name} whose capacity is 0")

    def _check_after_create(self, before: dict[str, int], profile: DiskProfile, size: int) -> dict[str, int]:
        after = self.capacities()
        exact = self.backend.kind == "loop"
        for name, cap in after.items():
            assert cap <= before[name], f"capacity of {name} grew after CreateVolume: {before[name]} -> {cap}"
        if exact:
            assert after[profile.name] == before[profile.name] - size, (profile.name, before, after)
        else:
            assert after[profile.name] <= before[profile.name] - size, (profile.name, before, after)
        return after

    def _life_cycle(self, profile: DiskProfile, size: int, known: set[str], *, kill: bool) -> None:
        api = self.api
        before = self.capacities()
        name = str(uuid.uuid4())  # the SLRP names a volume after its operation's UUID
        disk = api.create(name, size, profile)
        assert disk.capacity == size, f"required == limit == {size}, got {disk.capacity}"
        assert disk.id not in known
        after_create = self._check_after_create(before, profile, size)
        listed = {d.id: d for d in api.list_volumes()}
        assert listed[disk.id].capacity == size
        staging, target = self.mounts / disk.id / "staging", self.mounts / disk.id / "target"
        staging.mkdir(parents=True)
        api.stage(disk, staging, profile)
        if kill:
            self.report.killed_during = profile.name
            self.relaunch_after_kill()
            api = self.api
            replayed = api.create(name, size, profile)  # the SLRP retries the pending operation
            assert replayed.id == disk.id and replayed.capacity == size, (disk, replayed)
            assert self.capacities() == after_create, "replayed CreateVolume allocated again"
            assert [d.id for d in api.list_volumes()].count(disk.id) == 1
            api.stage(disk, staging, profile)  # idempotent: already staged
        assert api.validate(disk, profile)
        if api.co_creates_target and not profile.block:
            target.mkdir()
        elif api.co_creates_target:
            target.touch()
        api.publish(disk, staging, target, profile)
        write_and_read_back(target, profile, size)
        if not profile.block:
            # the same file system is visible at the staging path
            assert (staging / "written-by-the-slrp-harness").exists()
        api.unpublish(disk.id, target)
        assert mount_fs_type(target) is None
        if api.co_creates_target:
            target.unlink() if profile.block else target.rmdir()
        assert not target.exists(), "the target is left behind"
        api.unstage(disk.id, staging)
        assert mount_fs_type(staging) is None
        staging.rmdir()
        (self.mounts / disk.id).rmdir()
        api.delete(disk.id)
        api.delete(disk.id)  # idempotent
        assert disk.id not in {d.id for d in api.list_volumes()}
