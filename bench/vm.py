"""Benchmark on real lvm2: boots the test VM (tests/vm/runner.py) to time snapshot and restore of a 1 GiB
volume holding 512 MiB of data, thick and thin, against a ``cp`` floor of the same run, and merges the
figures into bench/results.json under ``vm_snapshot_1GiB_512MiB_data``.

    python -m bench.vm [--output bench/results.json]

The VM runs under software emulation (TCG): absolute times are slow; the ratios to the floor are the figures.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent
KEY = "vm_snapshot_1GiB_512MiB_data"


def figures_from(junit: Path) -> dict:
    for prop in ElementTree.parse(junit).iter("property"):
        if prop.get("name") == "figures":
            return json.loads(prop.get("value", "{}"))
    raise click.ClickException(f"the VM run left no figures in {junit}")


def render(figures: dict) -> str:
    lines = ["| real lvm2 (VM, TCG) | CreateSnapshot | restore | cp floor | ratios |", "|---|---|---|---|---|"]
    for profile, f in figures.items():
        lines.append(
            f"| {profile}: 1 GiB holding 512 MiB | {f['snapshot_s']} s | {f['restore_s']} s | {f['cp_floor_s']} s "
            f"| x{f['snapshot_ratio']} / x{f['restore_ratio']} |"
        )
    return "\n".join(lines)


@click.command()
@click.option("--output", type=click.Path(path_type=Path), default=REPO / "bench" / "results.json", show_default=True)
def main(output: Path) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        junit = Path(scratch) / "junit.xml"
        status = subprocess.run(
            [sys.executable, "-m", "tests.vm.runner", "--junit", str(junit), "--memory", "6G", "--timeout", "1800",
             "--", "bench/guest_snapshots.py", "-q", "-s", "-p", "no:cacheprovider", "-o", "junit_family=xunit1"],
            cwd=REPO,
        ).returncode
        if status != 0:
            raise click.ClickException(f"the VM run failed (exit status {status})")
        figures = figures_from(junit)
    results = json.loads(output.read_text()) if output.exists() else {}
    results[KEY] = figures
    output.write_text(json.dumps(results, indent=2) + "\n")
    click.echo(render(figures))
    click.echo(f"\nmerged into {output}")


if __name__ == "__main__":
    main()
