"""Running external programs: argv lists only (never a shell), a deadline that kills the child.

Every tool csilvm runs (lvm2, losetup, blkid, mkfs, mount) goes through a
:class:`Runner`, the seam where tests inject faults and count invocations.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from lvm.errors import CommandFailed, CommandNotFound, CommandTimeout

DEFAULT_TIMEOUT = 60.0


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    stdout: str
    stderr: str


class Runner(Protocol):
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        input: bytes | None = None,
        ok_codes: Sequence[int] = (0,),
    ) -> CommandResult: ...


class SubprocessRunner:
    """Runs commands with ``sh``: no tty, no shell, SIGKILL at the deadline.

    ``env`` entries are added to a minimal, locale-neutral environment
    (``LC_ALL=C``), so output is parseable whatever the operator's locale.
    ``invocations`` counts the programs started, per program name.
    """

    def __init__(self, default_timeout: float = DEFAULT_TIMEOUT):
        self.default_timeout = default_timeout
        self.invocations: dict[str, int] = {}
        self._lock = threading.Lock()

    def run(self, argv, *, timeout=None, env=None, input=None, ok_codes=(0,)) -> CommandResult:
        argv = tuple(str(a) for a in argv)
        with self._lock:
            name = os.path.basename(argv[0])
            self.invocations[name] = self.invocations.get(name, 0) + 1
        full_env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LC_ALL": "C", "LANG": "C"}
        full_env.update(env or {})
        deadline = self.default_timeout if timeout is None else timeout
        # Imported on the first command, not at start: the loop sandbox serves
        # Probe, creates and deletes without one, and sh costs 3 MB of memory.
        import sh

        try:
            program = sh.Command(argv[0])
        except sh.CommandNotFound:
            raise CommandNotFound(f"{argv[0]} is not installed (not found on PATH)", argv=argv) from None
        # Our own timer instead of sh's _timeout, whose watcher thread polls every
        # 100 ms and so added 100 ms to every command; wait() without a timeout
        # also waits for the output readers, so stdout and stderr are complete.
        proc = program(
            *argv[1:],
            _env=full_env,
            _in=input,
            _tty_out=False,
            _return_cmd=True,
            _ok_code=list(ok_codes),
            _bg=True,
            _bg_exc=False,
            _truncate_exc=False,
        )
        expired = threading.Event()

        def kill() -> None:
            expired.set()
            with contextlib.suppress(Exception):
                proc.signal(signal.SIGKILL)

        timer = threading.Timer(deadline, kill)
        timer.daemon = True
        timer.start()
        try:
            proc.wait()
        except sh.ErrorReturnCode as exc:
            if expired.is_set():
                raise CommandTimeout(f"{' '.join(argv)} did not finish within {deadline:g}s and was killed", argv=argv) from None
            stderr = exc.stderr.decode("utf-8", "replace").strip()
            raise CommandFailed(
                f"{' '.join(argv)} failed with exit code {exc.exit_code}: {stderr or '(no message)'}",
                argv=argv,
                returncode=exc.exit_code,
                stderr=stderr,
            ) from None
        finally:
            timer.cancel()
        return CommandResult(argv, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"))
