"""Regenerate (or check) the Python modules generated from ``protos/*/csi.proto``."""

from __future__ import annotations

import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
PROTO_FILES = sorted(p.relative_to(ROOT) for p in (ROOT / "protos").glob("*/csi.proto"))
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


def generate_into(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools, in-process) for every proto; return the files written."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    for proto in PROTO_FILES:
        args = [
            "protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise click.ClickException(f"protoc failed on {proto}")
    return sorted(p.relative_to(out_dir) for p in out_dir.rglob("*") if p.name.endswith(GENERATED_SUFFIXES))


def stale_files() -> list[str]:
    """Names of generated files that differ from what protoc makes now (empty: up to date)."""
    with tempfile.TemporaryDirectory() as tmp:
        produced = generate_into(Path(tmp))
        stale = [str(rel) for rel in produced if not (ROOT / rel).exists() or not filecmp.cmp(Path(tmp) / rel, ROOT / rel, shallow=False)]
        committed = {p.relative_to(ROOT) for d in PROTO_FILES for p in (ROOT / d.parent).iterdir() if p.name.endswith(GENERATED_SUFFIXES)}
        stale += [str(rel) for rel in committed - set(produced)]
    return stale


@click.command()
@click.option("--check", is_flag=True, help="Only report stale generated files; exit 1 if any.")
def main(check: bool) -> None:
    """Regenerate protos/*/csi_pb2*.py from the .proto files."""
    if check:
        stale = stale_files()
        if stale:
            click.echo("stale generated files: " + ", ".join(stale), err=True)
            sys.exit(1)
        click.echo("generated code is up to date")
        return
    with tempfile.TemporaryDirectory() as tmp:
        for rel in generate_into(Path(tmp)):
            shutil.copyfile(Path(tmp) / rel, ROOT / rel)
            click.echo(f"wrote {rel}")


if __name__ == "__main__":
    main()
