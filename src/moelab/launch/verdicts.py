"""Verdicts the supervisor itself decides (no log signature involved): timeouts, hangs, leaks.

Pure functions over what the supervisor observed, so their wording is tested without processes.
"""
from __future__ import annotations

from moelab.diagnose import OomEvidence, classify
from moelab.launch.proctree import TeardownReport
from moelab.spec import Cause, Evidence, Phase, Verdict


NOT_FOUND_ADVICE = ("The server's executable was not found: check the first word of the command line and PATH "
                    "(for vLLM/SGLang in their own virtual environment, give the full path).")


def died(lines: list[str], rc: int | None, engine: str, oom: OomEvidence, segv: list[str], phase: Phase) -> Verdict:
    """The verdict of a server that ended by itself: the classifier, plus kernel-log segfault lines."""
    v = classify(lines, exit_code=rc, engine=engine, oom=oom, phase_hint=phase.value)
    v.evidence.extend(Evidence(kind="kernel_log", text=ln, source="dmesg") for ln in segv[:2])
    if rc == 0 and v.cause is Cause.unknown:
        v.evidence.insert(0, Evidence(kind="exit", text="the server exited with status 0 before it was told to stop"))
    return v


def ready(phase: Phase, notes: list[str]) -> Verdict:
    return Verdict(cause=Cause.ok, phase=phase, evidence=[Evidence(kind="readiness", text=n) for n in notes
                                                           if n.startswith(("POST", "probe:"))])


def not_judged(phase: Phase) -> Verdict:
    return Verdict(cause=Cause.unknown, phase=phase, advice="Stopped before it was ready; nothing was judged.")


def startup_timeout(timeout_s: float, log_phase: str, phase_line: int | None, last_line: tuple[int, str] | None,
                    stalled_s: float, port_ever_open: bool, notes: list[str],
                    stall_after_s: float = 60.0) -> Verdict:
    ev = [Evidence(kind="timeout", text=f"not ready after {timeout_s:.0f} s while the process stayed alive")]
    ev.append(Evidence(kind="log", text=f"last phase in the log: {log_phase}", line=phase_line))
    if last_line:
        ev.append(Evidence(kind="log", text=last_line[1][:300], line=last_line[0], source="last log line"))
    if not port_ever_open:
        ev.append(Evidence(kind="port", text="the server never opened its port"))
    ev += [Evidence(kind="readiness", text=n) for n in notes[-2:]]
    if stalled_s >= stall_after_s:
        ev.append(Evidence(kind="telemetry", text=f"stalled: no new log line and no memory growth for {stalled_s:.0f} s"))
        advice = (f"The server stopped making progress in phase {log_phase!r}. A hung kernel build or collective "
                  "is likely: try NCCL_P2P_DISABLE=1 / --disable-custom-all-reduce on multi-GPU, or another "
                  "--moe-runner-backend; otherwise raise --timeout.")
    elif not port_ever_open:
        advice = ("The process was alive and busy but never opened its port: check that the server is told the "
                  "port moelab probes ({port} for --engine command) or raise --timeout if loading is slow.")
    else:
        advice = "Loading was still progressing: raise --timeout (large MoE checkpoints can take many minutes)."
    return Verdict(cause=Cause.startup_timeout, phase=Phase.launch, evidence=ev, advice=advice,
                   detail={"log_phase": log_phase, "stalled_s": round(stalled_s, 1)})


def hang(phase: Phase, notes: list[str], stalled_s: float, last_line: tuple[int, str] | None) -> Verdict:
    ev = [Evidence(kind="readiness", text=n) for n in notes]
    ev.append(Evidence(kind="telemetry", text=f"no new log line and no memory growth for {stalled_s:.0f} s"))
    if last_line:
        ev.append(Evidence(kind="log", text=last_line[1][:300], line=last_line[0], source="last log line"))
    return Verdict(cause=Cause.hang, phase=phase, evidence=ev,
                   advice="The server was ready, then stopped answering while its process stayed alive. On "
                          "multi-GPU try NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce; otherwise switch "
                          "--moe-runner-backend or disable CUDA graphs (--disable-cuda-graph / --enforce-eager).",
                   detail={"stalled_s": round(stalled_s, 1)})


def auth_refused(note: str, key_given: bool) -> Verdict:
    """The server answers, but refuses moelab's readiness request (401/403): it wants an API key."""
    if key_given:
        advice = ("The server refused the API key moelab sent (--api-key / MOELAB_API_KEY): check that it is the "
                  "one the server was started with (its --api-key).")
    else:
        advice = ("The server wants an API key: give moelab the key the server was started with, "
                  "`--api-key KEY` or MOELAB_API_KEY=KEY (sent as a bearer token, never written anywhere).")
    return Verdict(cause=Cause.bad_args, phase=Phase.launch, advice=advice,
                   evidence=[Evidence(kind="readiness", text=note[:300]),
                             Evidence(kind="readiness", text="the server wants an API key" if not key_given
                                      else "the server refused the API key")])


def foreign_listener(port: int, holders: list[tuple[int, str]]) -> Verdict:
    who = ", ".join(f"pid {p} ({c})" for p, c in holders)
    return Verdict(cause=Cause.port_in_use, phase=Phase.launch,
                   evidence=[Evidence(kind="port", text=f"port {port} was taken during startup by {who}, "
                                                        "which is not part of this server")],
                   advice="Another process took the port while the server started: choose another --port, "
                          "or leave --port out so moelab picks a free one.")


def leak_evidence(rep: TeardownReport, port: int | None) -> list[Evidence]:
    ev = [Evidence(kind="teardown", text=f"{e}; ended by moelab") for e in rep.escaped]
    ev += [Evidence(kind="teardown", text=f"{s} survived SIGKILL") for s in rep.survivors]
    if not rep.port_free:
        ev.append(Evidence(kind="teardown", text=f"port {port} still in use after teardown"))
    if rep.gpu_back is False:
        ev.append(Evidence(kind="teardown", text=f"GPU memory not back to its baseline: {rep.gpu_note}"))
    return ev


def with_teardown(v: Verdict, rep: TeardownReport, port: int | None) -> Verdict:
    """The final verdict: an otherwise-ok trial that leaked is orphan_leak; a failed one keeps its
    cause and carries the leak as extra evidence."""
    detail = {**v.detail, "teardown": {"escaped": rep.escaped, "survivors": rep.survivors, "termed": rep.termed,
                                       "killed": rep.killed, "port_free": rep.port_free, "gpu_back": rep.gpu_back,
                                       "seconds": round(rep.seconds, 3)}}
    if not rep.leak:
        return v.model_copy(update={"detail": detail})
    ev = leak_evidence(rep, port)
    if v.ok:
        return Verdict(cause=Cause.orphan_leak, phase=Phase.teardown, evidence=ev, detail=detail,
                       advice="The server left processes (or its port / GPU memory) behind after it was told to "
                              "stop; moelab ended them. Report it upstream with repro.sh: a server should end its "
                              "whole tree on SIGTERM.")
    return v.model_copy(update={"evidence": v.evidence + ev, "detail": {**detail, "orphan_leak": True}})
