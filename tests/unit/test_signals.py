"""SIGTERM stops the server even when the kernel hands it to another thread than the main one."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.plugin_process import REPO

CHILD = textwrap.dedent(
    """
    import signal, threading
    from plugin.server import serve_until, stop_on_signals

    class Running:
        def stop(self, grace):
            print("stopped gracefully", flush=True)

    stop = stop_on_signals()
    main_waits = threading.Event()

    def rpc_thread():
        main_waits.wait()
        # What the kernel may do with a SIGTERM sent to the process: deliver it to this thread.
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    threading.Thread(target=rpc_thread).start()
    main_waits.set()
    serve_until(stop, Running())
    """
)


def test_sigterm_delivered_to_another_thread_stops_serve_until():
    for _ in range(5):
        result = subprocess.run(
            [sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, timeout=20
        )
        assert result.returncode == 0, result.stderr
        assert "stopped gracefully" in result.stdout
