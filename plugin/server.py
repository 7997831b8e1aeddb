"""The gRPC server on a Unix socket: socket safety, service registration, graceful stop."""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import select
import signal
import socket
import stat
import threading
from concurrent import futures
from dataclasses import dataclass

import grpc

from plugin.core import Core
from plugin.interceptors import interceptor_chain
from plugin.versions import resolve

log = logging.getLogger("csilvm.server")


class EndpointError(Exception):
    """The endpoint cannot be used (malformed, or another live process serves on it)."""


def socket_path_of(endpoint: str) -> str:
    """``unix:///run/csi.sock``, ``unix:/run/csi.sock`` or a plain path -> the socket path."""
    if endpoint.startswith("unix://"):
        path = endpoint[len("unix://"):]
    elif endpoint.startswith("unix:"):
        path = endpoint[len("unix:"):]
    elif "://" in endpoint:
        raise EndpointError(f"unsupported endpoint {endpoint!r}: csilvm serves on a Unix socket (unix:///path)")
    else:
        path = endpoint
    if not path.startswith("/"):
        raise EndpointError(f"the socket path in {endpoint!r} must be absolute")
    return path


def _answers(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
        return True
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
            return False
        raise
    finally:
        probe.close()


def _owner_of(path: str) -> str:
    """Who listens on the socket, for the error message (best effort)."""
    import psutil  # only on this error path

    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="unix"):
            if conn.laddr == path and conn.pid:
                proc = psutil.Process(conn.pid)
                return f" (pid {conn.pid}, {' '.join(proc.cmdline()[:4])})"
    return ""


def claim_socket_path(path: str) -> None:
    """Make ``path`` free to bind: remove a stale socket, refuse a live one or a non-socket file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise EndpointError(f"{path} exists and is not a socket: refusing to replace it")
    if _answers(path):
        raise EndpointError(f"another process is serving on {path}{_owner_of(path)}: stop it first")
    log.info("removing stale socket %s left by a dead process", path)
    os.unlink(path)


def start_on_socket(server: grpc.Server, path: str, socket_mode: int = 0o600, socket_group: str | None = None) -> None:
    """Bind ``server`` to the Unix socket ``path`` and start it; the socket is never wider than ``socket_mode``,
    not even for an instant (umask while binding)."""
    old_umask = os.umask(0o777 & ~socket_mode)
    try:
        server.add_insecure_port(f"unix://{path}")
        server.start()
    finally:
        os.umask(old_umask)
    os.chmod(path, socket_mode)
    if socket_group:
        os.chown(path, -1, grp.getgrnam(socket_group).gr_gid)
    notify_ready(f"serving on {path}")


def notify_ready(status: str) -> None:
    """Tell the supervisor listening on ``$NOTIFY_SOCKET`` that the socket serves (systemd's
    ``Type=notify`` protocol); without it, nothing.  A supervisor that went away is no error."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.sendto(f"READY=1\nSTATUS={status}\n".encode(), address)


@dataclass
class RunningServer:
    server: grpc.Server
    socket_path: str

    def stop(self, grace: float = 10.0) -> None:
        """Refuse new RPCs, let in-flight ones finish (at most ``grace`` seconds), remove the socket."""
        self.server.stop(grace).wait(grace + 1)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)


def start_server(
    core: Core,
    endpoint: str,
    *,
    socket_mode: int = 0o600,
    socket_group: str | None = None,
    max_workers: int = 32,
    api_versions: tuple[str, ...] | None = None,
) -> RunningServer:
    """Bind the socket (created with ``socket_mode``) and serve Identity, Controller and Node.

    ``api_versions`` restricts the CSI versions served (None: every version csilvm speaks).
    """
    versions = resolve(api_versions)
    path = socket_path_of(endpoint)
    claim_socket_path(path)
    validators = {method: check for v in versions for method, check in v.validators.items()}
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="rpc"),
        interceptors=interceptor_chain(validators),
        options=[("grpc.so_reuseport", 0)],
    )
    for version in versions:
        version.register(server, core)
    start_on_socket(server, path, socket_mode, socket_group)
    log.info("serving CSI %s on %s (backend %s)", ", ".join(v.name for v in versions), path, core.backend.kind)
    return RunningServer(server, path)


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT.  Install it before serving, so that no
    signal in the first instants of serving kills the process without clean-up."""
    stop = threading.Event()

    def on_signal(signum, frame):
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def serve_until(stop: threading.Event, running: RunningServer, grace: float = 10.0) -> None:
    """Block until ``stop`` is set (by SIGTERM or SIGINT), then stop gracefully.

    The kernel may hand a process's signal to any of its threads.  Python runs
    the handler in the main thread only, and a main thread asleep on a lock
    (``Event.wait``) is not woken when another thread took the signal: the
    plugin then never stopped.  So the main thread sleeps in ``select`` on the
    signal wakeup fd, which every signal writes to, whichever thread takes it.
    """
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    previous = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    try:
        while not stop.is_set():  # the handler runs before is_set() reads the flag
            select.select([wake_read], [], [])
            os.read(wake_read, 4096)
    finally:
        signal.set_wakeup_fd(previous)
        os.close(wake_read)
        os.close(wake_write)
    running.stop(grace)
    log.info("stopped")
