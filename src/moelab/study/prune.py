"""Pruning before launch: verdicts a trial gets without starting anything, each with its reason.

Sources, in order: the flags the installed engine accepts (its flag catalogue), the support matrix
and the memory forecast (`moelab check`'s own pure function, for vLLM and SGLang), and a flag value
an earlier trial of this study already proved fatal on this machine (its own evidence named it).
The store's exact-key reuse lives in the runner, since it needs the store.
"""
from __future__ import annotations

from functools import lru_cache

from moelab.spec import Cause, Evidence, LaunchSpec, Phase, Verdict
from moelab.study.planner import Blame


@lru_cache(maxsize=8)
def engine_flags(engine: str) -> frozenset[str] | None:
    """Every option string the installed engine accepts, or None when moelab cannot know (command)."""
    from moelab.engines import ENGINES

    return ENGINES.create(engine).flag_names()


def unknown_axes(engine: str, flags: list[str]) -> list[str]:
    """Study-file check: axis/base flags the installed engine does not accept (none when unknowable)."""
    known = engine_flags(engine)
    if known is None:
        return []
    return [f for f in flags if f.split("=", 1)[0] not in known]


def launch_check(spec: LaunchSpec, hw=None) -> Verdict | None:
    """A preflight verdict that makes launching pointless, else None (the engine's adapter decides
    what it can check: flags, support matrix, memory forecast)."""
    from moelab.engines import ENGINES

    return ENGINES.create(spec.engine).check_launch(spec, hw)


def blamed(flags: dict, rules: list[Blame]) -> Verdict | None:
    """A verdict inherited from an earlier failure that was attributed to one of these flag values."""
    for b in rules:
        if flags.get(b.flag, _MISSING) == b.value:
            return Verdict(cause=Cause(b.cause), phase=Phase.preflight,
                           evidence=[Evidence(kind="study", source=f"trial {b.trial_id}",
                                              text=f"{b.flag} {b.value} already failed on this machine as "
                                                   f"{b.cause} in trial {b.trial_id} (attributed: {b.why}): "
                                                   f"{b.evidence.strip()[:300]}")],
                           advice=f"Not launched: every configuration with {b.flag} {b.value} fails the same way "
                                  f"here. Drop that value from the axis.",
                           detail={"pruned_by": "study", "trial": b.trial_id, "how": b.how})
    return None


def same_failure(key: str, failed: dict[str, dict]) -> Verdict | None:
    """This exact configuration already failed at launch in this study for a cause that does not
    depend on load: launching it again would say the same."""
    t = failed.get(key)
    if t is None:
        return None
    return Verdict(cause=Cause(t["cause"]), phase=Phase.preflight,
                   evidence=[Evidence(kind="study", source=f"trial {t['id']}",
                                      text=f"the same configuration failed as {t['cause']} at launch in trial "
                                           f"{t['id']}; a launch-time {t['cause']} does not depend on the load")],
                   advice="Not launched again.", detail={"pruned_by": "study", "trial": t["id"], "how": "same"})


_MISSING = object()
