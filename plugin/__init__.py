"""The CSI side of csilvm: the gRPC server, one module per CSI service, validation, errors, CLI."""

from importlib import metadata

DEFAULT_PLUGIN_NAME = "lvm.csi.csilvm.io"

try:
    __version__ = metadata.version("csilvm")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
