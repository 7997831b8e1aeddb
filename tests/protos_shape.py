"""The shape of a CSI proto, for comparing ours with the official spec: every message's fields (name,
number, label, type, type name, oneof), nested messages and enums, enum values, services and methods.

Comments and options are left out.  ``python -m tests.protos_shape SPEC.proto OUT.json`` writes the
shape of an official csi.proto (compiled with grpcio-tools' protoc) as a fixture.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2


def _enum(enum: descriptor_pb2.EnumDescriptorProto) -> dict:
    return {"name": enum.name, "values": [[v.name, v.number] for v in enum.value]}


def _message(message: descriptor_pb2.DescriptorProto) -> dict:
    return {
        "name": message.name,
        "fields": [
            [
                f.name, f.number,
                descriptor_pb2.FieldDescriptorProto.Label.Name(f.label),
                descriptor_pb2.FieldDescriptorProto.Type.Name(f.type),
                f.type_name,
                message.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else "",
            ]
            for f in message.field
        ],
        "messages": [_message(m) for m in message.nested_type],
        "enums": [_enum(e) for e in message.enum_type],
    }


def shape(proto: descriptor_pb2.FileDescriptorProto) -> dict:
    return {
        "package": proto.package,
        "dependencies": list(proto.dependency),
        "messages": [_message(m) for m in proto.message_type],
        "enums": [_enum(e) for e in proto.enum_type],
        "extensions": [[e.name, e.number, e.extendee] for e in proto.extension],
        "services": [
            {"name": s.name, "methods": [[m.name, m.input_type, m.output_type, m.server_streaming] for m in s.method]}
            for s in proto.service
        ],
    }


def shape_of_module(module) -> dict:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return shape(proto)


def shape_of_file(path: Path) -> dict:
    import grpc_tools
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "csi.proto").write_text(Path(path).read_text())
        out = Path(tmp) / "set.pb"
        include = Path(grpc_tools.__file__).parent / "_proto"
        if protoc.main(["protoc", f"-I{tmp}", f"-I{include}", f"--descriptor_set_out={out}", "csi.proto"]) != 0:
            raise SystemExit(f"protoc failed on {path}")
        return shape(descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[-1])


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(json.dumps(shape_of_file(Path(sys.argv[1])), indent=1) + "\n")
