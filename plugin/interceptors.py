"""Cross-cutting concerns around every RPC: logging, request validation, error mapping.

They wrap the unary handlers of every CSI service, so the servicers hold only
the translation between CSI messages and :class:`plugin.core.Core`.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Mapping

import grpc
from google.protobuf.message import Message

from lvm.errors import StorageError
from plugin.errors import status_for

log = logging.getLogger("csilvm.rpc")

Handler = Callable[[Message, grpc.ServicerContext], Message]
SECRET_OPTION_NUMBER = 1059  # csi_secret in every CSI version that has it


def _is_secret(field) -> bool:
    return any(f.number == SECRET_OPTION_NUMBER and v for f, v in field.GetOptions().ListFields())


def redacted(message: Message) -> str:
    """The message on one line, with every ``csi_secret`` field and ``*secrets``/``*credentials`` map masked."""
    from google.protobuf import text_format  # only when debug logging is on

    copy = type(message)()
    copy.CopyFrom(message)
    _mask(copy)
    return text_format.MessageToString(copy, as_one_line=True)


def _mask(message: Message) -> None:
    for field, value in message.ListFields():
        # CSI 0.1 has no csi_secret option: its secrets are the *_credentials maps.
        if _is_secret(field) or field.name.endswith(("secrets", "credentials")):
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                for key in list(value):
                    value[key] = "***"
            else:
                message.ClearField(field.name)
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            if field.is_repeated:
                for item in value:
                    _mask(item)
            else:
                _mask(value)


class UnaryInterceptor(grpc.ServerInterceptor):
    """Base: wraps each unary-unary handler with :meth:`wrap`."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            self.wrap(handler_call_details.method, handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def wrap(self, method: str, inner: Handler) -> Handler:
        raise NotImplementedError


class LoggingInterceptor(UnaryInterceptor):
    """One debug line per request and per response: RPC, duration, gRPC code; secrets masked.

    A failed RPC is logged once at any level: its method, code and message (a warning for
    INTERNAL and UNKNOWN, which mean a fault, info for the codes a CO expects and retries on).
    """

    def wrap(self, method, inner):
        def handler(request, context):
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s request: %s", method, redacted(request))
            start = time.monotonic()
            try:
                response = inner(request, context)
            except BaseException:
                code = context.code() or grpc.StatusCode.UNKNOWN
                level = logging.WARNING if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN) else logging.INFO
                log.log(level, "%s failed: %s in %.1f ms: %s", method, code.name, (time.monotonic() - start) * 1e3, context.details())
                raise
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s -> OK in %.1f ms: %s", method, (time.monotonic() - start) * 1e3, redacted(response))
            return response

        return handler


class ErrorInterceptor(UnaryInterceptor):
    """Turns storage errors into gRPC statuses with their message; logs unexpected ones with a traceback."""

    def wrap(self, method, inner):
        def handler(request, context):
            try:
                return inner(request, context)
            except StorageError as exc:
                context.abort(status_for(exc), str(exc))
            except Exception as exc:  # a bug: say so, keep the traceback in the log
                if isinstance(exc, grpc.RpcError) or context.code() is not None:
                    raise
                log.exception("%s failed unexpectedly", method)
                context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")

        return handler


class ValidationInterceptor(UnaryInterceptor):
    """Runs the request validator registered for the RPC (if any) before the servicer."""

    def __init__(self, validators: Mapping[str, Callable[[Message], None]]):
        self.validators = validators

    def wrap(self, method, inner):
        validate = self.validators.get(method)
        if validate is None:
            return inner

        def handler(request, context):
            validate(request)
            return inner(request, context)

        return handler


def interceptor_chain(validators: Mapping[str, Callable[[Message], None]]) -> list[grpc.ServerInterceptor]:
    """Outermost first: logging sees the final code, errors see validation failures."""
    return [LoggingInterceptor(), ErrorInterceptor(), ValidationInterceptor(validators)]
