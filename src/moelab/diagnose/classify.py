"""Evidence -> Verdict: the pure classifier behind `moelab launch` and `moelab diagnose`.

Reads the whole log, not its last line: SGLang and vLLM end a failed launch with generic wrapper
lines ("Received sigquit from a child process", "Engine core initialization failed. See root cause
above") and several ranks interleave their output. The earliest root-error line wins; wrapper
lines count only when no root error exists; then the exit status / signal, and the OOM evidence
read from the memory cgroup, decide between host_oom, killed_external and native_crash.
"""
from __future__ import annotations

import re
import signal as _signal

from pydantic import BaseModel, Field

from moelab.diagnose.ruleset import Rule, load_rules
from moelab.spec import Cause, Evidence, Phase, Verdict

# Prefixes stripped (repeatedly) before matching: our own server.log time stamp, SGLang's
# "[2026-01-02 10:11:12 TP3] ", vLLM's "(EngineCore_DP0 pid=123) " and "(VllmWorker TP1 pid=9) ".
_PREFIXES = [
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s"),
    re.compile(r"^\[(?P<rank>[^\]]*?\b(?:TP|DP|EP|PP|RANK)\s?\d+[^\]]*)\]\s?"),
    re.compile(r"^\[\d{4}-\d\d-\d\d[ T][\d:.,]+\]\s?"),
    re.compile(r"^\((?P<rank>[\w:.-]+(?: [\w:.-]+)* pid=\d+)\)\s?"),
    # vLLM's logger: "ERROR 11-30 20:07:21 [multiproc_executor.py:1063] " (level, time, source line)
    re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]+\] "),
]
_TRACEBACK = "Traceback (most recent call last):"
_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::.*)?$")
_SIGNAL_EXIT = {137: 9, 139: 11, 134: 6, 135: 7, 143: 15, 136: 8}
_NATIVE = {_signal.SIGSEGV, _signal.SIGABRT, _signal.SIGBUS, _signal.SIGFPE, _signal.SIGILL}


class OomEvidence(BaseModel):
    """What the memory cgroup (or the rlimit fallback, or the kernel log) says about host memory."""

    source: str  # "cgroup v1", "cgroup v2", "rlimit (RLIMIT_AS, no cgroup)", "kernel log", "none"
    limit_bytes: int | None = None
    oom_kill: int = 0  # OOM kills counted by the cgroup
    failcnt: int | None = None  # v1: times usage hit the limit; v2: memory.events "max"
    max_usage_bytes: int | None = None
    last_rss_bytes: int | None = None  # tree RSS at the last telemetry sample before death
    kernel_lines: list[str] = Field(default_factory=list)

    @property
    def found(self) -> bool:
        near_limit = bool(self.limit_bytes and self.last_rss_bytes
                          and self.last_rss_bytes >= 0.9 * self.limit_bytes)
        return self.oom_kill > 0 or bool(self.kernel_lines) or near_limit

    def facts(self) -> list[Evidence]:
        gib = lambda n: f"{n / 2**20:.0f} MiB" if n is not None else "-"  # noqa: E731
        text = (f"{self.source}: oom_kill={self.oom_kill}, failcnt={self.failcnt}, "
                f"limit={gib(self.limit_bytes)}, peak={gib(self.max_usage_bytes)}, "
                f"tree RSS at last sample={gib(self.last_rss_bytes)}")
        out = [Evidence(kind="cgroup" if "cgroup" in self.source else "oom", text=text, source=self.source)]
        out += [Evidence(kind="kernel_log", text=k, source="kernel log") for k in self.kernel_lines[:3]]
        return out


def strip_prefixes(line: str) -> tuple[str, str | None]:
    """(line without time/rank prefixes, the rank label if there was one)."""
    rank = None
    changed = True
    while changed:
        changed = False
        for rx in _PREFIXES:
            m = rx.match(line)
            if m:
                label = m.groupdict().get("rank")
                if label and rank is None:
                    tag = re.search(r"\b(?:TP|DP|EP|PP|RANK)\s?\d+", label)
                    rank = tag.group(0) if tag and not label.endswith(")") and "pid=" not in label else label
                line, changed = line[m.end():], True
    return line.rstrip("\r\n"), rank


def first_exception(lines: list[str]) -> tuple[int, str] | None:
    """(1-based line, text) of the exception that ends the first Python traceback, per rank."""
    open_tb: dict[str | None, bool] = {}
    for n, raw in enumerate(lines, 1):
        text, rank = strip_prefixes(raw)
        if text.rstrip().endswith(_TRACEBACK):
            open_tb[rank] = True
        elif open_tb.get(rank) and _EXC_LINE.match(text):
            return n, text
    return None


def _signal_of(exit_code: int | None, signal: int | None) -> int | None:
    if signal:
        return signal
    if exit_code is not None and exit_code < 0:
        return -exit_code
    return _SIGNAL_EXIT.get(exit_code) if exit_code is not None else None


def classify(lines: list[str], *, exit_code: int | None = None, signal: int | None = None,
             engine: str | None = None, oom: OomEvidence | None = None,
             phase_hint: str | None = None, rules: tuple[Rule, ...] | None = None) -> Verdict:
    """The verdict for a dead (or never-ready) server from its log and exit evidence.

    `exit_code` is the process's status (negative = killed by that signal, as subprocess reports),
    `signal` a signal number if known separately, `phase_hint` a spec.Phase value (where the
    supervisor saw it die) or an engine log phase such as "loading_weights" (kept in detail).
    """
    rules = rules if rules is not None else load_rules(engine)
    root = wrapper = None  # (line no, text, rank, rule): the first root line, the first wrapper with a cause
    wrappers: list[Evidence] = []
    for n, raw in enumerate(lines, 1):
        text, rank = strip_prefixes(raw)
        rule = next((r for r in rules if r.regex.search(text)), None)  # engine rules come first
        if rule is None or rule.kind == "ignore":
            continue
        if rule.kind == "root":
            root = (n, text, rank, rule)
            break  # the earliest root error wins; everything after it is consequence
        if rule.cause is not Cause.unknown and wrapper is None:
            wrapper = (n, text, rank, rule)
        if len(wrappers) < 3:
            wrappers.append(Evidence(kind="log", text=text.strip(), line=n, source=f"{rule.id} (wrapper)"))
    sig = _signal_of(exit_code, signal)
    exit_ev = [Evidence(kind="exit", text=_exit_text(exit_code, sig))] if exit_code is not None or sig else []
    phase = _phase(phase_hint)
    detail = {"exit_code": exit_code, "signal": sig, "log_phase": phase_hint, "rule": None}
    oom_found = oom is not None and oom.found
    oom_ev = oom.facts() if oom is not None else []
    ev: list[Evidence] = []

    if sig == 9 and oom_found:
        # The cgroup says its OOM killer fired (or RSS sat at the limit): that decides the cause
        # even if some other error line made it into the log first.
        cause, advice = Cause.host_oom, _advice_for(rules, "kernel-oom-killer")
    elif root is not None:
        n, text, rank, rule = root
        cause, advice = rule.cause, rule.advice
        phase = rule.phase or phase
        detail.update(rule=rule.id, rank=rank)
        ev = [Evidence(kind="log", text=text.strip(), line=n, source=f"{rule.id}: {rule.source}")]
    elif sig == 9 or (wrapper and wrapper[3].cause is Cause.killed_external):
        cause = Cause.host_oom if oom_found else Cause.killed_external
        advice = _advice_for(rules, "kernel-oom-killer" if oom_found else "shell-killed")
        if wrapper is not None and wrapper[3].cause is Cause.killed_external:
            n, text, rank, rule = wrapper  # e.g. "Worker proc ... died unexpectedly (exit code: -9)"
            advice = advice if oom_found else (rule.advice or advice)
            detail.update(rule=rule.id, rank=rank)
            ev = [Evidence(kind="log", text=text.strip(), line=n, source=f"{rule.id} (wrapper)")]
    elif sig in _NATIVE:
        cause = Cause.native_crash
        advice = ("The server died of a native signal with no Python error in the log. Rerun with "
                  "CUDA_LAUNCH_BLOCKING=1 (and without CUDA graphs: --disable-cuda-graph / --enforce-eager), "
                  "or get a backtrace with `gdb -batch -ex bt --args ...` / faulthandler.")
    elif wrapper is not None:
        n, text, rank, rule = wrapper
        cause, advice = rule.cause, rule.advice
        detail.update(rule=rule.id, rank=rank)
    elif sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        cause = Cause.killed_external
        advice = "Something outside the server stopped it (SIGTERM/SIGINT/SIGHUP): a scheduler, a timeout or a user."
    elif exit_code == 124:
        cause = Cause.hang
        advice = "`timeout` ended it (status 124): it made no progress in time. Look at the last phase in the log."
    else:
        cause, advice = Cause.unknown, ("No known signature in the log; the first Python exception "
                                        "and the exit status are kept as evidence.")
    if cause is not Cause.host_oom and not ev:
        exc = first_exception(lines)
        if exc:
            ev.append(Evidence(kind="log", text=exc[1].strip(), line=exc[0], source="first traceback"))
    evidence = ev + [w for w in wrappers if w not in ev] + exit_ev
    if cause in (Cause.host_oom, Cause.killed_external) or oom_found:
        evidence += oom_ev
    return Verdict(cause=cause, phase=phase, evidence=evidence, advice=advice, detail=detail)


def _exit_text(exit_code: int | None, sig: int | None) -> str:
    try:
        name = f" ({_signal.Signals(sig).name})" if sig else ""
    except ValueError:
        name = ""
    if exit_code is None or exit_code < 0:
        return f"killed by signal {sig}{name}"
    return f"exit status {exit_code}{name}"


def _phase(hint: str | None) -> Phase:
    try:
        return Phase(hint) if hint else Phase.launch
    except ValueError:
        return Phase.launch  # an engine log phase ("loading_weights") is still the launch phase


def _advice_for(rules: tuple[Rule, ...], rule_id: str) -> str:
    return next((r.advice for r in rules if r.id == rule_id), "")
