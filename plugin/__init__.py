"""The CSI side of csilvm: the gRPC server, one module per CSI service, validation, errors, CLI."""

import os

# gRPC's fork handlers crash children forked by ``sh`` from RPC threads (seen as
# SIGSEGV in losetup); csilvm never forks to run gRPC, so switch them off
# before grpc is imported anywhere in the process.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

DEFAULT_PLUGIN_NAME = "lvm.csi.csilvm.io"



def __getattr__(name: str) -> str:
    """``plugin.__version__``, read from the installed package metadata when first asked for."""
    if name != "__version__":
        raise AttributeError(name)
    from importlib import metadata  # slow to import: not on the start-up path

    try:
        return metadata.version("csilvm")
    except metadata.PackageNotFoundError:  # a source tree that is not installed
        return "0.0.0+source"
