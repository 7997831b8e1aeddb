"""``test-csi-plugin --forward``: a proxy that relays every gRPC call, as raw bytes, to another plugin.

It knows no CSI message: any method of any service of any CSI version is
relayed unchanged (request, response, status, details, metadata), so a CO can
be pointed at a proxy socket while the real plugin listens elsewhere, as with
Mesos' test plugin.  CSI has unary methods only, and so has the proxy.
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from dataclasses import dataclass

import grpc

from plugin.server import RunningServer, claim_socket_path, socket_path_of, start_on_socket

log = logging.getLogger("csilvm.forward")

# Metadata that gRPC itself manages; everything else the client sent is relayed.
_HOP_BY_HOP = ("user-agent", "te", "content-type")


def channel_target(endpoint: str) -> str:
    """A gRPC target for ``endpoint``: ``unix://``/``unix:`` endpoints and plain paths are Unix sockets."""
    if endpoint.startswith("unix:") or endpoint.startswith("/"):
        return f"unix://{socket_path_of(endpoint)}"
    return endpoint  # dns:, ipv4:, host:port ... as gRPC understands them


def _relayed(metadata) -> list[tuple[str, str | bytes]]:
    return [
        (key, value)
        for key, value in (metadata or ())
        if not key.startswith((":", "grpc-")) and key not in _HOP_BY_HOP
    ]


class ForwardingHandler(grpc.GenericRpcHandler):
    """Answers every method by calling the same method on ``channel``, bytes in, bytes out."""

    def __init__(self, channel: grpc.Channel):
        self.channel = channel
        self._callables: dict[str, grpc.UnaryUnaryMultiCallable] = {}
        self._lock = threading.Lock()

    def _callable(self, method: str) -> grpc.UnaryUnaryMultiCallable:
        with self._lock:
            if method not in self._callables:
                # No (de)serializers: the request and response stay bytes.
                self._callables[method] = self.channel.unary_unary(method)
            return self._callables[method]

    def service(self, handler_call_details):
        method = handler_call_details.method
        return grpc.unary_unary_rpc_method_handler(lambda request, context: self._forward(method, request, context))

    def _forward(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        remaining = context.time_remaining()
        timeout = remaining if remaining is not None and remaining < 1e6 else None
        try:
            response, call = self._callable(method).with_call(
                request, timeout=timeout, metadata=_relayed(context.invocation_metadata())
            )
        except grpc.RpcError as exc:
            log.debug("forwarded %s: %s", method, exc.code())
            trailing = _relayed(exc.trailing_metadata()) if hasattr(exc, "trailing_metadata") else []
            if trailing:
                context.set_trailing_metadata(trailing)
            context.abort(exc.code(), exc.details() or "")
        log.debug("forwarded %s: OK", method)
        trailing = _relayed(call.trailing_metadata())
        if trailing:
            context.set_trailing_metadata(trailing)
        return response


@dataclass
class Forwarder(RunningServer):
    """A running proxy; :meth:`stop` also closes the channel to the target."""

    channel: grpc.Channel | None = None

    def stop(self, grace: float = 10.0) -> None:
        super().stop(grace)
        if self.channel is not None:
            self.channel.close()


def start_forwarder(endpoint: str, target: str, *, socket_mode: int = 0o600, max_workers: int = 32) -> Forwarder:
    """Serve on ``endpoint`` (a live socket there is refused) and relay every call to ``target``."""
    path = socket_path_of(endpoint)
    claim_socket_path(path)
    channel = grpc.insecure_channel(channel_target(target))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="forward"),
        options=[("grpc.so_reuseport", 0)],
    )
    server.add_generic_rpc_handlers((ForwardingHandler(channel),))
    start_on_socket(server, path, socket_mode)
    log.info("forwarding every CSI call on %s to %s", path, target)
    return Forwarder(server, path, channel)
