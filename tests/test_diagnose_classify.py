"""The classifier's decisions (tier 1) and `moelab diagnose` end to end on a log file."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from moelab.diagnose import OomEvidence, RuleError, classify, first_exception, parse_rules, strip_prefixes
from moelab.spec import Cause, Phase

INTERLEAVED = """[2026-11-30 09:14:02] server_args=ServerArgs(model_path='Qwen3-30B-A3B-NVFP4', tp_size=4)
[2026-11-30 09:14:20 TP0] Load weight begin. avail mem=93.61 GB
[2026-11-30 09:14:21 TP3] Scheduler hit an exception: Traceback (most recent call last):
[2026-11-30 09:14:21 TP1] Load weight end. avail mem=40.00 GB
[2026-11-30 09:14:21 TP3]   File "/sgl/srt/layers/moe/fused_moe_triton/layer.py", line 812, in forward
[2026-11-30 09:14:21 TP2] Load weight end. avail mem=40.00 GB
[2026-11-30 09:14:21 TP3] RuntimeError: MoE kernel requires SM 10.x (got sm_120)
[2026-11-30 09:14:22 TP0] RuntimeError: NCCL error: remote process exited or there was a network error
[2026-11-30 09:14:22 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB
[2026-11-30 09:14:23] Received sigquit from a child process. It usually means the child failed.
Killed""".splitlines()


def test_earliest_root_error_wins_over_later_errors_and_wrappers():
    v = classify(INTERLEAVED, exit_code=137)
    assert v.cause is Cause.unsupported_arch
    assert v.evidence[0].line == 7 and v.evidence[0].text.startswith("RuntimeError: MoE kernel requires SM 10.x")
    assert v.detail["rank"] == "TP3"
    assert "--moe-runner-backend" in v.advice


def test_prefixes_of_both_engines_and_of_server_log_are_stripped():
    assert strip_prefixes("[2026-11-30 09:14:21 TP3] x") == ("x", "TP3")
    assert strip_prefixes("(EngineCore_DP0 pid=4242) y")[0] == "y"
    assert strip_prefixes("2026-11-30T20:10:36.123Z (VllmWorker TP1 pid=9) z")[0] == "z"
    assert strip_prefixes("(EngineCore pid=7) ERROR 11-30 20:07:21 [core.py:1063] ValueError: v")[0] == "ValueError: v"


def test_first_exception_follows_the_rank_that_raised():
    assert first_exception(INTERLEAVED) == (7, "RuntimeError: MoE kernel requires SM 10.x (got sm_120)")


def test_unmatched_traceback_is_kept_as_evidence_of_unknown():
    lines = ["Traceback (most recent call last):", '  File "x.py", line 1', "ZeroDivisionError: division by zero"]
    v = classify(lines, exit_code=1)
    assert v.cause is Cause.unknown
    assert (v.evidence[0].line, v.evidence[0].text) == (3, "ZeroDivisionError: division by zero")


@pytest.mark.parametrize("oom,cause", [
    (OomEvidence(source="cgroup v1", limit_bytes=1 << 30, oom_kill=1), Cause.host_oom),
    (OomEvidence(source="cgroup v2", limit_bytes=1 << 30, oom_kill=0, last_rss_bytes=(1 << 30) - (1 << 20)), Cause.host_oom),
    (OomEvidence(source="cgroup v1", limit_bytes=1 << 30, oom_kill=0, last_rss_bytes=1 << 20), Cause.killed_external),
    (None, Cause.killed_external),
])
def test_sigkill_is_host_oom_only_with_oom_evidence(oom, cause):
    lines = ["[2026-11-30 09:14:20 TP0] Load weight begin. avail mem=78.50 GB"]
    for kw in ({"exit_code": 137}, {"exit_code": -9}, {"signal": 9}):
        v = classify(lines, oom=oom, **kw)
        assert v.cause is cause
        assert any(e.kind == "exit" and "SIGKILL" in e.text for e in v.evidence)
    if oom is not None:
        assert any(e.kind == "cgroup" for e in v.evidence)


def test_cgroup_oom_kill_overrides_a_log_line():
    v = classify(["RuntimeError: CUDA error: an illegal memory access was encountered"], exit_code=-9,
                 oom=OomEvidence(source="cgroup v1", oom_kill=2))
    assert v.cause is Cause.host_oom


@pytest.mark.parametrize("code", [-11, 139, -6, 134])
def test_native_signals_without_a_log_signature(code):
    assert classify(["Capturing cuda graph bs [1, 2, 4]"], exit_code=code).cause is Cause.native_crash


@pytest.mark.parametrize("code,cause", [(143, Cause.killed_external), (-15, Cause.killed_external),
                                        (124, Cause.hang), (0, Cause.unknown)])
def test_other_exit_statuses_without_a_signature(code, cause):
    assert classify(["INFO starting"], exit_code=code).cause is cause


def test_phase_hint():
    assert classify(["x"], exit_code=1, phase_hint="load").phase is Phase.load
    assert classify(["x"], exit_code=1, phase_hint="loading_weights").phase is Phase.launch


@pytest.mark.parametrize("text,msg", [
    ("rules:\n  - id: a\n    pattern: 'x'\n    cause: exploded\n", "use a value from moelab.spec"),
    ("rules:\n  - id: a\n    pattern: '('\n    cause: hang\n", "bad regex"),
    ("rules:\n  - id: a\n    pattern: 'x'\n  - id: a\n    pattern: 'y'\n", "duplicate id"),
    ("rules:\n  - pattern: 'x'\n", "needs an `id`"),
    ("rules:\n  - id: a\n    pattern: 'x'\n    kind: fatal\n", "kind 'fatal'"),
])
def test_bad_rule_files_are_refused_with_the_reason(text, msg):
    with pytest.raises(RuleError, match=msg):
        parse_rules(text, "mine.yaml")


def _moelab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moelab.cli", *args], capture_output=True, text=True, timeout=60)


def test_diagnose_cli_json_and_exit_codes(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("\n".join(INTERLEAVED) + "\n")
    r = _moelab("diagnose", str(log), "--exit-code", "137", "--engine", "sglang", "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert list(doc)[:4] == ["cause", "phase", "evidence", "advice"]
    assert doc["cause"] == "unsupported_arch" and doc["evidence"][0]["line"] == 7
    r = _moelab("diagnose", str(log))
    assert r.returncode == 1 and "unsupported_arch" in r.stdout and "server.log:7" in r.stdout
    bad = _moelab("diagnose", str(tmp_path / "missing.log"))
    assert bad.returncode == 2 and "no such log file" in bad.stderr
    bad = _moelab("diagnose", str(log), "--engine", "nosuch")
    assert bad.returncode == 2 and "no rules for engine" in bad.stderr


def test_embedded_cuda_graph_capture_failure_names_the_inner_error():
    """The embedded engine reports a failed capture in SGLang's words (a wrapper rule); the error
    inside it is the cause."""
    log = ["moelab.engine phase=warmup MoE runner at 8 token counts (1,2,4,8,16,32,64,128) in 3.1s",
           "Traceback (most recent call last):",
           '  File "/x/moelab/engine/graphs.py", line 50, in __init__',
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
           "moelab.engine error: Capture cuda graph failed: OutOfMemoryError: CUDA out of memory."]
    v = classify(log, exit_code=1)
    assert v.cause is Cause.gpu_oom and v.evidence[0].line == 4


def test_a_real_ctrl_c_is_a_person_stopping_it_and_says_how_to_see_a_hang():
    """A real Python process stopped with SIGINT (what Ctrl-C sends) writes a real KeyboardInterrupt traceback."""
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-c", "import time\nprint('serving', flush=True)\ntime.sleep(60)"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.stdout.readline().strip() == "serving"
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    lines = ["serving", *p.communicate(timeout=10)[0].splitlines()]
    assert lines[-1] == "KeyboardInterrupt"
    v = classify(lines, exit_code=p.returncode)
    assert v.cause is Cause.killed_external and "Ctrl-C" in v.advice
    assert Cause.hang in [a.cause for a in v.alternatives]


STARTS_AND_WAITS = """import subprocess, sys
helper = subprocess.Popen(["sleep", "60"])  # a helper that never returns, started before the line is said
try:
    print(sys.argv[1], flush=True)
    helper.wait()
finally:
    helper.kill()
"""


@pytest.mark.parametrize("said,cause", [("Loading chat adapter", Cause.hang),
                                        ("INFO:     Uvicorn running on http://127.0.0.1:8000", Cause.killed_external)])
def test_a_real_ctrl_c_that_finds_startup_blocked_in_a_wait_is_a_hang(said, cause):
    """A real process stopped with SIGINT while it waits on a child that never returns: before it said it was up,
    the Ctrl-C found it stuck (a hang, the wait named); once a server said it was up, a Ctrl-C is a person ending it."""
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-c", STARTS_AND_WAITS, said], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert p.stdout.readline().strip() == said
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    lines = [said, *p.communicate(timeout=10)[0].splitlines()]
    assert "KeyboardInterrupt" in lines
    v = classify(lines, exit_code=p.returncode)
    assert v.cause is cause, v
    if cause is Cause.hang:
        assert "blocked in" in v.evidence[0].source and v.evidence[0].text.lstrip().startswith("File ")
        assert Cause.killed_external in [a.cause for a in v.alternatives]
