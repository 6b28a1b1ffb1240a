"""`launch()`: the one-call supervised launch behind `moelab launch`.

Start, wait for readiness (and the probe), then either tear down at once or, with keep_running,
watch the server until it dies, hangs, or moelab is interrupted. SIGTERM and SIGHUP (the terminal
closed) to moelab are turned into KeyboardInterrupt here, so every interrupt takes the same
teardown path; a SIGKILL, which cannot be caught, is the guardian's to clean up.
"""
from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from moelab.launch.supervisor import Supervisor
from moelab.launch.folder import LaunchResult
from moelab.spec import LaunchSpec


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def launch(spec: LaunchSpec, out_dir: Path | None = None, *, adapter=None, reference: Path | None = None,
           probe: bool = True, force: bool = False, keep_running: bool = False, watch_interval_s: float = 5.0,
           on_progress=None, on_ready=None, **supervisor_kw) -> LaunchResult:
    """Launch `spec` under supervision and return its LaunchResult (the trial folder is written).

    `on_progress(dict)` is called several times a second while starting (phase, elapsed_s,
    rss_bytes, gpu_bytes); `on_ready(supervisor)` once when the server is ready.
    """
    main = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)} if main else {}
    srv = Supervisor(spec, out_dir, adapter=adapter, reference=reference, probe=probe, force=force,
                     on_progress=on_progress, **supervisor_kw)
    try:
        with srv:
            v = srv.wait_ready()
            if v is None and on_ready is not None:
                on_ready(srv)
            while v is None and keep_running:
                time.sleep(watch_interval_s)
                v = srv.alive_verdict()
    except KeyboardInterrupt:
        pass  # the with-block already tore down and recorded the interrupt
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return srv.result
