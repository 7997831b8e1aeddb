"""CSI protocol definitions and the Python modules generated from them.

``protos/v1`` is CSI spec v1.12 (``package csi.v1``).  The generated
``*_pb2*.py`` files are committed; ``python -m protos.generate`` rewrites them
and ``python -m protos.generate --check`` fails when they are stale.
"""
