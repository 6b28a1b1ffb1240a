"""After teardown: is the port free again, and is GPU memory back to its pre-launch baseline?

Both checks poll for a short while, because a port leaves the LISTEN state and a CUDA context is
released a moment after the process is gone.
"""
from __future__ import annotations

import time

from moelab.launch.machine import port_free
from moelab.launch.telemetry import gpu_used_total


def wait_port_free(host: str, port: int, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while not port_free(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def gpu_back(baseline: list[int] | None, tolerance: int = 256 << 20, timeout: float = 10.0) -> tuple[bool | None, str]:
    """(True/False, note) per GPU against the used bytes before launch; (None, why) without NVML."""
    if baseline is None:
        return None, "no NVML: GPU memory not checked"
    deadline = time.monotonic() + timeout
    while True:
        now = gpu_used_total() or baseline
        over = [(i, n - b) for i, (n, b) in enumerate(zip(now, baseline)) if n - b > tolerance]
        if not over or time.monotonic() > deadline:
            return not over, "; ".join(f"GPU {i}: +{d / 2**20:.0f} MiB over its baseline" for i, d in over)
        time.sleep(0.2)


def run_probe_gate(url: str, model: str | None, reference, notes: list[str], weight_format: str | None = None,
                   api_key: str | None = None):
    """The probe's verdict after readiness (None when it passes or is not installed yet).

    Imported lazily: moelab.probe is its own part of moelab and may be absent in a partial install.
    """
    try:
        from moelab.probe import run_probe
    except ImportError as e:
        notes.append(f"probe skipped: moelab.probe.run_probe is not available ({e})")
        return None
    # The quantization decides the probe's tolerance against the reference (fp8/nvfp4 drift more).
    rep = run_probe(url, model=model, reference=reference, timeout_s=60.0, weight_format=weight_format,
                    api_key=api_key)
    notes.append(f"probe: {rep.verdict.cause.value}")
    return None if rep.verdict.ok else rep.verdict
