"""A real ``csilvm serve`` process and its clean-up, shared by the e2e, Mesos and VM tests."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import grpc

from plugin.client import CsiClient
from protos.v1 import csi_pb2

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Plugin:
    """One plugin process; ``start`` again after ``kill`` restarts it on the same state."""

    work_dir: Path
    socket: Path
    args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    client: CsiClient | None = None
    log_path: Path | None = None
    env: dict[str, str] | None = None  # None: this process's environment
    client_timeout: float = 30.0  # per RPC

    def command(self) -> list[str]:
        """``args`` choose the backend, e.g. ``--backend loop --work-dir DIR``."""
        return [
            sys.executable, "-m", "plugin.cli", "serve",
            "--endpoint", f"unix://{self.socket}",
            "--node-id", "test-node",
            *self.args,
        ]

    def start(self, timeout: float = 20.0) -> CsiClient:
        self.log_path = self.work_dir.parent / f"plugin-{time.monotonic_ns()}.log"
        log = open(self.log_path, "wb")
        with ReadyNotice() as notice:
            env = dict(os.environ if self.env is None else self.env, NOTIFY_SOCKET=notice.address)
            self.proc = subprocess.Popen(self.command(), cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
            log.close()
            self.client = CsiClient(str(self.socket), timeout=self.client_timeout)
            wait_until_ready(self.client, self.proc, notice, timeout, self.log_path)
        return self.client

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path and self.log_path.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> int:
        assert self.proc is not None
        self.client.close()
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            # The plugin enables faulthandler: SIGABRT writes every thread's stack to its log.
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(10)
            raise AssertionError(f"the plugin did not exit within 30 s of signal {sig}; its log:\n{self.log()[-6000:]}") from None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.kill(signal.SIGTERM)


class ReadyNotice:
    """An abstract datagram socket for ``NOTIFY_SOCKET``: the plugin sends ``READY=1`` on it
    once its socket serves (systemd's notify protocol)."""

    def __init__(self) -> None:
        name = f"csilvm-test-{uuid.uuid4().hex}"
        self.address = "@" + name
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.bind("\0" + name)

    def __enter__(self) -> "ReadyNotice":
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()

    def wait(self, proc: subprocess.Popen, timeout: float, log: Callable[[], str]) -> None:
        """Block until the plugin says it serves; fail at once if it exits first."""
        exited = os.pidfd_open(proc.pid)
        try:
            readable, _, _ = select.select([self.sock, exited], [], [], timeout)
        finally:
            os.close(exited)
        if self.sock not in readable:
            if proc.poll() is not None:
                raise AssertionError(f"plugin exited with {proc.returncode} before serving:\n{log()}")
            raise AssertionError(f"plugin not serving after {timeout}s:\n{log()}")
        message = self.sock.recv(4096).decode()
        assert "READY=1" in message.splitlines(), message


def wait_until_ready(
    client: CsiClient, proc: subprocess.Popen, notice: ReadyNotice, timeout: float, log_path: Path
) -> None:
    """Wait for the plugin to serve (its READY=1 notice), then for Probe to say it is ready."""
    deadline = time.monotonic() + timeout
    notice.wait(proc, timeout, log_path.read_text)
    # An lvm2 report can take seconds in an emulated VM: give Probe the time left.
    left = max(2.0, deadline - time.monotonic())
    try:
        ready = client.identity.Probe(csi_pb2.ProbeRequest(), timeout=left).ready.value
    except grpc.RpcError as err:
        raise AssertionError(f"Probe failed: {err.code().name}: {err.details()}\n{log_path.read_text()}") from None
    assert ready, f"the plugin serves but Probe says it is not ready:\n{log_path.read_text()}"


def unmount_everything_below(path: Path) -> None:
    """Leave no mount behind, even when a test failed half-way."""
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for mount_point in sorted((m for m in mounts if m.startswith(str(path) + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount_point], check=False)


def detach_loops_of(work_dir: Path) -> None:
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if backing.read_text().strip().startswith(str(work_dir)):
                subprocess.run(["losetup", "-d", f"/dev/{backing.parent.parent.name}"], check=False)
        except OSError:
            pass
