"""Load for the benchmark, in its own process as a CO's would be: keep N CreateVolume calls in flight.

Each of ``--in-flight`` threads issues CreateVolume (new names, ``--size`` each)
back to back until a line arrives on stdin (or stdin closes); then the load
deletes what it created and prints how many volumes it made.  ``ready`` is
printed once the first create of every thread has returned, so the caller
measures under a load that is fully running.

    python -m bench.load SOCKET [--in-flight 16] [--size 1MiB]
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lvm.units import parse_size  # noqa: E402
from plugin.client import CsiClient  # noqa: E402


@click.command()
@click.argument("socket")
@click.option("--in-flight", default=16, show_default=True, help="CreateVolume calls kept in flight")
@click.option("--size", default="1MiB", show_default=True, help="size of each volume")
def main(socket: str, in_flight: int, size: str) -> None:
    size_bytes = parse_size(size)
    stop = threading.Event()
    started = threading.Barrier(in_flight + 1)
    created: list[str] = []
    client = CsiClient(socket, timeout=120)

    def creator(k: int) -> None:
        n = 0
        while True:
            name = f"load-{k}-{n}"
            client.create(name, size_bytes)
            created.append(name)
            if n == 0:
                started.wait()
            n += 1
            if stop.is_set():
                return

    with concurrent.futures.ThreadPoolExecutor(in_flight) as pool:
        futures = [pool.submit(creator, k) for k in range(in_flight)]
        started.wait()
        print("ready", flush=True)
        sys.stdin.readline()
        stop.set()
        for f in futures:
            f.result()
        list(pool.map(client.delete, created))
    client.close()
    print(f"created {len(created)}", flush=True)


if __name__ == "__main__":
    main()
