"""The CSI versions this plugin speaks, each a set of servicers and validators over one Core.

Every version has its own protobuf package (``csi.v1``, ``csi.v0``, ``csi``),
so their service names differ and one gRPC server registers all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import grpc

from plugin.core import Core

Validators = Mapping[str, Callable[[object], None]]


@dataclass(frozen=True)
class ApiVersion:
    name: str  # as --api_version spells it: "v1", "v0", "v0.1"
    register: Callable[[grpc.Server, Core], None]
    validators: Validators


def _register_v1(server: grpc.Server, core: Core) -> None:
    from plugin.controller import ControllerServicer
    from plugin.identity import IdentityServicer
    from plugin.node import NodeServicer
    from protos.v1 import csi_pb2_grpc

    csi_pb2_grpc.add_IdentityServicer_to_server(IdentityServicer(core), server)
    csi_pb2_grpc.add_ControllerServicer_to_server(ControllerServicer(core), server)
    csi_pb2_grpc.add_NodeServicer_to_server(NodeServicer(core), server)


def _v1() -> ApiVersion:
    from plugin.validation import VALIDATORS

    return ApiVersion("v1", _register_v1, VALIDATORS)


def _v0() -> ApiVersion:
    from plugin.v0 import register
    from plugin.v0.validation import VALIDATORS

    return ApiVersion("v0", register, VALIDATORS)


def _v0_1() -> ApiVersion:
    from plugin.v0_1 import register
    from plugin.v0_1.validation import VALIDATORS

    return ApiVersion("v0.1", register, VALIDATORS)


# name -> factory (imports stay lazy: a plugin serving one version loads only that one)
API_VERSIONS: dict[str, Callable[[], ApiVersion]] = {"v1": _v1, "v0": _v0, "v0.1": _v0_1}
ALL_VERSIONS = tuple(API_VERSIONS)


def resolve(names: tuple[str, ...] | None) -> list[ApiVersion]:
    """The versions to serve (None: all); unknown names are a ValueError naming the known ones."""
    chosen = names or ALL_VERSIONS
    unknown = [n for n in chosen if n not in API_VERSIONS]
    if unknown:
        raise ValueError(f"unknown CSI API version(s) {', '.join(unknown)}; known: {', '.join(API_VERSIONS)}")
    return [API_VERSIONS[n]() for n in chosen]
