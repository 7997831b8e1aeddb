"""Run pytest inside a QEMU guest with a real kernel, so LVM can create volumes.

    python -m tests.vm.runner [--junit FILE] [--timeout S] [--memory 2G] -- <pytest args>

The host kernel here has no device-mapper; this boots a stock Debian kernel
(/boot/vmlinuz-*) with virtme-ng (``vng``) under software emulation (TCG),
with the host's root file system visible read-only in the guest, and runs
``tests/vm/guest.sh`` there as root.  The guest loads dm-mod/dm-raid/raid1,
makes LVM work without udev, sets ``CSILVM_IN_VM=1`` and runs
``<this python> -m pytest <pytest args>`` from the current directory.

Exit status: the guest's pytest exit status; 2 when the VM cannot be run at
all (no kernel, no qemu, no vng); 124 when the wall-clock timeout killed
the VM; 125 when the guest never reported a status; 128+N when signal N
(SIGTERM, SIGHUP) stopped the runner, which kills the VM first.

Install what it needs with ``bash tests/vm/install.sh <venv python>``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import click

HERE = Path(__file__).resolve().parent
GUEST_SCRIPT = HERE / "guest.sh"

EXIT_CANNOT_RUN = 2
EXIT_TIMEOUT = 124
EXIT_NO_STATUS = 125

# Terminal control sequences the guest console emits (cursor moves, colour,
# "clear line"): noise in a CI log.
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\x1b[=>c]")


class CannotRun(Exception):
    """The VM cannot be started on this machine."""


class Terminated(BaseException):
    """SIGTERM/SIGHUP reached the runner (e.g. a cancelled CI job): the VM is killed."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def _version_key(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def find_kernel(explicit: str | None = None) -> Path:
    """The newest /boot/vmlinuz-<ver> whose /lib/modules/<ver> exists."""
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise CannotRun(f"kernel {explicit} does not exist")
        return path
    candidates = []
    for path in Path("/boot").glob("vmlinuz-*"):
        version = path.name[len("vmlinuz-"):]
        if (Path("/lib/modules") / version / "kernel").is_dir():
            candidates.append(path)
    if not candidates:
        raise CannotRun(
            "no kernel: no /boot/vmlinuz-<ver> with /lib/modules/<ver> "
            "(install one with: bash tests/vm/install.sh)"
        )
    for path in candidates:
        if not os.access(path, os.R_OK):
            raise CannotRun(f"kernel {path} is not readable (run as root)")
    return max(candidates, key=lambda p: _version_key(p.name))


# Host paths the guest does not see: virtme mounts fresh file systems there.
HIDDEN_IN_GUEST = ("/var/tmp", "/var/log", "/var/cache", "/var/lib/apt", "/var/lib/private",
                   "/run", "/dev", "/proc", "/sys")


def check_visible(what: str, path: str) -> None:
    real = os.path.realpath(path)
    for prefix in HIDDEN_IN_GUEST:
        if real == prefix or real.startswith(prefix + "/"):
            raise CannotRun(f"{what} {path} is under {prefix}, which the guest does not see; move it")


def find_tools(python: str) -> tuple[str, str]:
    """Paths of vng and qemu-system-x86_64; vng is looked up beside ``python`` first."""
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        raise CannotRun("qemu-system-x86_64 is not installed (bash tests/vm/install.sh)")
    beside = Path(python).parent / "vng"
    vng = str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which("vng")
    if vng is None:
        raise CannotRun("vng (virtme-ng) is not installed in this venv (bash tests/vm/install.sh)")
    return vng, qemu


def _relay(stream, out, log_file) -> None:
    """Copy the guest console to our stdout, live, minus control sequences."""
    for line in iter(stream.readline, b""):
        clean = _ANSI.sub(b"", line).replace(b"\r", b"")
        out.write(clean)
        out.flush()
        log_file.write(clean)
    stream.close()


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop vng and the virtme-run/QEMU it started: they share the process group we created.

    SIGTERM first (QEMU exits at once), then SIGKILL to whatever of the group
    is left (virtme-run lingers after its QEMU is gone).
    """
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def precompile(repo: Path, python: str) -> None:
    """Write the repo's bytecode on the host: the guest sees the checkout read-only, and
    compiling every module again in each plugin process costs seconds under emulation."""
    subprocess.run(
        [python, "-m", "compileall", "-q", *(str(repo / d) for d in ("plugin", "lvm", "mount", "protos", "tests"))],
        check=False,
    )


def run_in_vm(
    pytest_args: list[str],
    *,
    junit: str | None,
    timeout: float,
    memory: str,
    cpus: int,
    kernel: str | None,
    pv_sizes: str,
    python: str,
    cwd: str,
    keep: bool,
) -> int:
    kernel_path = find_kernel(kernel)
    vng, qemu = find_tools(python)
    check_visible("the working directory", cwd)
    check_visible("the repository", str(HERE.parent.parent))
    check_visible("python", python)
    if not GUEST_SCRIPT.is_file():
        raise CannotRun(f"{GUEST_SCRIPT} is missing")

    precompile(HERE.parent.parent, python)
    run_dir = Path(tempfile.mkdtemp(prefix="csilvm-vm-"))
    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous_handlers[sig] = signal.signal(sig, _raise_terminated)
    try:
        (run_dir / "env").write_text(f"PYTHON={python}\nCWD={cwd}\nPV_SIZES={pv_sizes}\n")
        (run_dir / "pytest-args").write_bytes(b"".join(a.encode() + b"\0" for a in pytest_args))

        guest_command = shlex.join(["bash", str(GUEST_SCRIPT), str(run_dir)])
        argv = [
            vng,
            "--disable-kvm",
            "--run", str(kernel_path),
            "--user", "root",
            "--memory", memory,
            "--cpus", str(cpus),
            "--qemu", qemu,
            "--cwd", cwd,
            f"--rwdir={run_dir}",
            "--exec", guest_command,
        ]
        env = dict(os.environ)
        # vng starts virtme-run & co. by name: they live beside it in the venv.
        env["PATH"] = os.pathsep.join([str(Path(vng).parent), env.get("PATH", "/usr/bin:/bin")])
        click.echo(f"vm: booting {kernel_path} with {memory} RAM, {cpus} cpu(s), TCG; timeout {timeout:g}s", err=True)
        started = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        with open(run_dir / "console.log", "wb") as log_file:
            relay = threading.Thread(
                target=_relay, args=(proc.stdout, sys.stdout.buffer, log_file), daemon=True
            )
            relay.start()
            timed_out = False
            try:
                vng_rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                vng_rc = proc.returncode
            except BaseException:
                _kill_group(proc)
                raise
            relay.join(timeout=10)
        elapsed = time.monotonic() - started

        junit_src = run_dir / "junit.xml"
        if junit and junit_src.is_file():
            Path(junit).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(junit_src, junit)

        if timed_out:
            click.echo(
                f"vm: timeout: the VM did not finish within {timeout:g}s and was killed", err=True
            )
            return EXIT_TIMEOUT
        setup_error = run_dir / "setup-error"
        if setup_error.is_file():
            click.echo(f"vm: guest setup failed: {setup_error.read_text().strip()}", err=True)
        status_file = run_dir / "status"
        try:
            status = int(status_file.read_text().strip())
        except (OSError, ValueError):
            click.echo(
                f"vm: the guest never reported a status (vng exited with {vng_rc} "
                f"after {elapsed:.0f}s); console log above",
                err=True,
            )
            return EXIT_NO_STATUS
        click.echo(f"vm: guest pytest exit status {status}; VM ran {elapsed:.1f}s (boot + tests)", err=True)
        if junit:
            if junit_src.is_file():
                click.echo(f"vm: JUnit XML in {junit}", err=True)
            else:
                click.echo("vm: the guest wrote no JUnit XML", err=True)
        return status
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        if keep:
            click.echo(f"vm: kept {run_dir}", err=True)
        else:
            shutil.rmtree(run_dir, ignore_errors=True)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--junit", type=click.Path(dir_okay=False), help="Copy the guest's JUnit XML here.")
@click.option("--timeout", type=float, default=900.0, show_default=True,
              help="Hard wall-clock limit in seconds for boot + tests; QEMU is killed after it.")
@click.option("--memory", default="2G", show_default=True, help="Guest RAM (qemu -m).")
@click.option("--cpus", type=int, default=2, show_default=True, help="Guest vCPUs.")
@click.option("--kernel", type=click.Path(dir_okay=False), default=None,
              help="Kernel image to boot [default: newest /boot/vmlinuz-* with modules].")
@click.option("--pv-sizes", default="", metavar="SIZES",
              help="Comma-separated sizes (e.g. 64M,96M,128M): loop devices the guest creates "
                   "and names in CSILVM_TEST_DEVICES.")
@click.option("--keep", is_flag=True, help="Keep the shared run directory (console.log, junit.xml).")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def main(junit, timeout, memory, cpus, kernel, pv_sizes, keep, pytest_args):
    """Boot a real kernel under QEMU and run pytest inside it as root."""
    try:
        rc = run_in_vm(
            list(pytest_args),
            junit=os.path.abspath(junit) if junit else None,
            timeout=timeout,
            memory=memory,
            cpus=cpus,
            kernel=kernel,
            pv_sizes=pv_sizes,
            python=sys.executable,
            cwd=os.getcwd(),
            keep=keep,
        )
    except CannotRun as exc:
        click.echo(f"cannot run the VM: {exc}", err=True)
        sys.exit(EXIT_CANNOT_RUN)
    except Terminated as exc:
        click.echo(f"vm: terminated by signal {exc.signum}; the VM was killed", err=True)
        sys.exit(128 + exc.signum)
    sys.exit(rc)


if __name__ == "__main__":
    main()
