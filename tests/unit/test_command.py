"""The one way csilvm runs programs: argv only, complete output, a deadline that kills."""

from __future__ import annotations

import os

import pytest

from lvm.command import SubprocessRunner
from lvm.errors import CommandFailed, CommandNotFound, CommandTimeout


def test_output_input_and_environment():
    runner = SubprocessRunner()
    assert runner.run(["cat"], input=b"abc").stdout == "abc"
    result = runner.run(["sh", "-c", 'echo "$LC_ALL $EXTRA"; echo warn >&2'], env={"EXTRA": "x"})
    assert result.stdout == "C x\n" and result.stderr == "warn\n"
    assert runner.invocations == {"cat": 1, "sh": 1}


def test_arguments_are_never_interpreted_by_a_shell(tmp_path):
    marker = tmp_path / "pwned"
    out = SubprocessRunner().run(["echo", f"; touch {marker}", "$(id)"]).stdout
    assert out == f"; touch {marker} $(id)\n" and not marker.exists()


def test_failure_keeps_code_and_stderr():
    with pytest.raises(CommandFailed) as err:
        SubprocessRunner().run(["sh", "-c", "echo 'Volume group not found' >&2; exit 5"])
    assert err.value.returncode == 5 and err.value.stderr == "Volume group not found"
    assert "Volume group not found" in str(err.value)
    assert SubprocessRunner().run(["sh", "-c", "exit 2"], ok_codes=(0, 2)).stdout == ""


def test_timeout_kills_the_child(tmp_path):
    pid_file = tmp_path / "pid"
    with pytest.raises(CommandTimeout, match="killed"):
        SubprocessRunner().run(["sh", "-c", f'echo $$ > {pid_file}; exec sleep 30'], timeout=0.5)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: gone, not a zombie we left behind


def test_missing_program():
    with pytest.raises(CommandNotFound, match="not installed"):
        SubprocessRunner().run(["no-such-program-csilvm"])
