"""The CSI side of csilvm: the gRPC server, one module per CSI service, validation, errors, CLI."""

import os
from importlib import metadata

# gRPC's fork handlers crash children forked by ``sh`` from RPC threads (seen as
# SIGSEGV in losetup); csilvm never forks to run gRPC, so switch them off
# before grpc is imported anywhere in the process.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

DEFAULT_PLUGIN_NAME = "lvm.csi.csilvm.io"

try:
    __version__ = metadata.version("csilvm")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
