"""Evidence -> Verdict: the pure, layered classifier behind `moelab launch` and `moelab diagnose`.

It reads the whole log, not its last line: SGLang and vLLM end a failed launch with generic wrapper
lines ("Received sigquit from a child process", "Engine core initialization failed. See root cause
above") and several ranks interleave. Four layers, each used where the one above says nothing:
  1. signature rules (data with sources, rules/*.yaml; the engine's own first);
  2. the structure of the log (structure.py): the first exception of each traceback and the
     package that raised it, native crash reports, kills and OOM evidence, leftovers, degenerate
     output, stalled throughput;
  3. cause words scored over the whole log (words.py);
  4. `unknown`, which then says what was looked for.
The earliest strong finding is the root cause; everything after it is consequence. The exit status
and the OOM evidence read from the trial's memory cgroup decide between host_oom, killed_external
and native_crash. Every verdict carries its deciding evidence, a confidence, and the ranked
alternatives, so a borderline call shows its second reading.

    >>> classify(["RuntimeError: CUDA error: an illegal memory access was encountered"]).cause.value
    'illegal_memory_access'
"""
from __future__ import annotations

import re
import signal as _signal

from pydantic import BaseModel, Field

from moelab.diagnose import structure, words
from moelab.diagnose.lines import strip_prefixes
from moelab.diagnose.ruleset import Rule, load_rules
from moelab.diagnose.structure import STRONG, Finding
from moelab.spec import Alternative, Cause, Evidence, Phase, Verdict

_TRACEBACK = "Traceback (most recent call last):"
# A log that spans several server lifetimes (restarts, a clean stop then a new start) is judged on
# the last lifetime that has a failure: these lines begin one, or end one cleanly.
# causes that say how a server ended, not what went wrong in it
_ENDINGS = (Cause.startup_timeout, Cause.killed_external, Cause.hang, Cause.unknown)
_LIFETIME = re.compile(r"Starting vLLM (?:API )?server|server_args=ServerArgs\(|moelab\.engine phase=start\b|"
                       r"Started server process|Application shutdown complete|moelab\.engine phase=shutdown|"
                       r"^Shutdown complete")
_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::.*)?$")
_CHAINED = re.compile(r"^During handling of the above exception, another exception occurred:|"
                      r"^The above exception was the direct cause of the following exception:")
_SIGNAL_EXIT = {137: 9, 139: 11, 134: 6, 135: 7, 143: 15, 136: 8, 132: 4}
# a line that reports a failure (not a setting, a timeout's value or a warning)
_FAILED = re.compile(r"\b(?:error|fail\w*|fatal|cannot|can't|unable|not (?:yet )?supported|unsupported|invalid|refused|"
                     r"denied|abort\w*|exceed\w*|out of memory)\b", re.I)
_CONSEQUENCE = {Cause.native_crash, Cause.killed_external}  # words of how a process ended, not why


def _memory_tie(scores: list[tuple[Cause, float, int]]) -> bool:
    """Memory ran out, said as much of the device as of the host: one event told line by line (the
    host buffer that failed, then the KV cache it was for). The first line that placed it decides."""
    return len(scores) >= 2 and {scores[0][0], scores[1][0]} == {Cause.gpu_oom, Cause.host_oom} \
        and scores[0][1] == scores[1][1] and (len(scores) == 2 or scores[2][1] * 1.25 <= scores[1][1])
_NATIVE = {_signal.SIGSEGV, _signal.SIGABRT, _signal.SIGBUS, _signal.SIGFPE, _signal.SIGILL}

# What to do next when a cause was found by structure or words rather than by a rule with advice.
ADVICE: dict[Cause, str] = {
    Cause.bad_args: "The engine refused its configuration; the evidence names the setting. Fix it (check the flag "
                    "against this engine version's --help; `moelab check` validates a command line).",
    Cause.unsupported_arch: "This backend or build has no kernels for this GPU architecture: choose another backend, "
                            "or a build made for this arch (`moelab check --gpu sm_XX` says which backends fit).",
    Cause.kernel_resource_limit: "A kernel needs more shared memory or registers than this GPU has: use another "
                                 "backend, or smaller tiles / fewer stages (num_stages, block sizes).",
    Cause.host_oom: "Host RAM ran out (the kernel's or the container's OOM killer). Give the process more memory, "
                    "load fewer shards at once, or rerun under `moelab launch --memory-limit` to measure it.",
    Cause.gpu_oom: "GPU memory ran out: lower the memory fraction (--mem-fraction-static, --gpu-memory-utilization), "
                   "the batch or context size, or use more GPUs / a smaller weight format.",
    Cause.illegal_memory_access: "A kernel faulted on the GPU. Rerun with CUDA_LAUNCH_BLOCKING=1 to find it, disable "
                                 "CUDA graphs (--disable-cuda-graph / --enforce-eager), and switch the backend named.",
    Cause.jit_compile_error: "A kernel failed to build at run time: check the compiler, CUDA toolkit and linker "
                             "(nvcc/ninja on PATH, libcuda.so visible to ld, a toolkit that knows this arch).",
    Cause.collective_error: "A collective between ranks failed: rerun with NCCL_DEBUG=INFO; check the network between "
                            "nodes, /dev/shm in containers (--shm-size, --ipc=host), NCCL_P2P_DISABLE=1 on PCIe.",
    Cause.numerical_nan: "The model produced NaN/Inf: try another dtype (bfloat16 rather than float16), another "
                         "quantization or backend.",
    Cause.garbage_output: "The server answered, but with degenerate text: compare it with a known-good configuration "
                          "(`moelab probe --against REF.json`) and switch the backend, quantization or dtype.",
    Cause.model_load_error: "The model could not be loaded: check the path and the files (format, complete shards), "
                            "and that this engine version knows the architecture (or needs --trust-remote-code).",
    Cause.port_in_use: "Another process holds the port: stop it, or choose another port (leave --port out under "
                       "`moelab launch` to get a free one).",
    Cause.startup_timeout: "The server was alive but not ready in time: raise the launcher's timeout if loading was "
                           "still progressing (big checkpoints, slow disks), otherwise look at the last phase in the log.",
    Cause.hang: "The server stopped making progress: a stuck collective or kernel is likely. On multi-GPU try "
                "NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce, and disable CUDA graphs to localise it.",
    Cause.killed_external: "Something outside the server stopped it (a user, an orchestrator, a time limit). Check "
                           "who: the scheduler's events (kubectl describe pod, sacct), or `journalctl`.",
    Cause.native_crash: "The process died of a native crash. Get a backtrace (faulthandler, `gdb -batch -ex bt`), rerun "
                        "with CUDA_LAUNCH_BLOCKING=1, and report it upstream with the command line.",
    Cause.orphan_leak: "Processes (or GPU memory, or the port) outlived the server: end them (moelab doctor "
                       "--end-leftovers for moelab's own) and report it upstream; `moelab launch` checks this.",
    Cause.unknown: "",
}
_HOW_TO_TELL = ("To tell a host OOM from an outside kill: `dmesg -T | grep -i 'killed process'` or `journalctl -k`, "
                "`docker inspect -f '{{.State.OOMKilled}}' CONTAINER`, the cgroup's memory.events oom_kill count; "
                "`moelab launch --memory-limit` records this evidence itself.")
LOOKED_FOR = ("signature rules (engine and generic)", "Python exceptions and the package that raised them",
              "native crash reports (C++ terminate, faulthandler, signals)", "Go and Rust panics", "kills and OOM-killer lines",
              "process listings of leftovers", "degenerate output", "stalled throughput", "cause words")


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

    @property
    def counts_kills(self) -> bool:
        """A memory cgroup counts every OOM kill in it: a SIGKILL it did not count was not an OOM."""
        return self.source.startswith("cgroup")

    def facts(self) -> list[Evidence]:
        mib = lambda n: f"{n / 2**20:.0f} MiB" if n is not None else "-"  # noqa: E731
        text = (f"{self.source}: oom_kill={self.oom_kill}, failcnt={self.failcnt}, "
                f"limit={mib(self.limit_bytes)}, peak={mib(self.max_usage_bytes)}, "
                f"tree RSS at last sample={mib(self.last_rss_bytes)}")
        out = [Evidence(kind="cgroup" if "cgroup" in self.source else "oom", text=text, source=self.source)]
        out += [Evidence(kind="kernel_log", text=k, source="kernel log") for k in self.kernel_lines[:3]]
        return out


def first_exception(lines: list[str], stripped: list[tuple[str, str | None]] | None = None) -> tuple[int, str] | None:
    """(1-based line, text) of the exception that ends the first Python traceback, per rank."""
    open_tb: dict[str | None, bool] = {}
    for n, (text, rank) in enumerate(stripped or (strip_prefixes(raw) for raw in lines), 1):
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


class _Matcher:
    """The rules of one classification. Each rule's required literals (ruleset.required_literals)
    are looked for in the lower-cased line, and only the rules they point to (and those without
    literals) are tried: most lines of a long log touch none."""

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        self.rules = rules
        self.always = [i for i, r in enumerate(rules) if r.literals is None]
        self.by_literal: dict[str, list[int]] = {}
        for i, r in enumerate(rules):
            for lit in r.literals or ():
                self.by_literal.setdefault(lit, []).append(i)
        # literals by their first three characters: a line is looked up by its own trigrams
        self.by_head: dict[str, list[tuple[str, list[int]]]] = {}
        for lit, idx in self.by_literal.items():
            self.by_head.setdefault(lit[:3], []).append((lit, idx))
        # a long log repeats its lines (a warning per request, the server's arguments at each start): a
        # line is matched once, and what is remembered stays under 16 M characters
        self._seen: dict[str, Rule | None] = {}
        self._seen_chars = 0

    def match(self, text: str) -> Rule | None:
        if text in self._seen:
            return self._seen[text]
        if self._seen_chars + len(text) > 16_000_000:
            self._seen.clear()
            self._seen_chars = 0
        found = self._seen[text] = self._match(text)
        self._seen_chars += len(text)
        return found

    def _match(self, text: str) -> Rule | None:
        cand = set(self.always)
        low = text.lower()
        heads = self.by_head
        for head in {low[i:i + 3] for i in range(len(low) - 2)} & heads.keys():
            for lit, idx in heads[head]:
                if lit in low:
                    cand.update(idx)
        for i in sorted(cand):
            if self.rules[i].regex.search(text):
                return self.rules[i]
        return None

    def root_cause(self, text: str) -> Cause | None:
        r = self.match(text)
        return r.cause if r is not None and r.kind == "root" else None


def _matcher(rules: tuple[Rule, ...]) -> _Matcher:
    cached = _MATCHERS.get(id(rules))
    if cached is None or cached.rules is not rules:
        cached = _MATCHERS[id(rules)] = _Matcher(rules)
    return cached


_MATCHERS: dict[int, _Matcher] = {}


def unquote(lines: list[str]) -> list[str]:
    """A log pasted as a quotation (every line behind `> `, as a reply quotes it), the quotation marks off;
    a chat transcript, where only the user's turns carry `>`, is left as it is.

    >>> unquote(["> Traceback (most recent call last):", ">   File 'x.py', line 1", "> ", "> MemoryError"])[-1]
    'MemoryError'
    """
    told = [t for t in lines if t.strip()]
    if not told or not all(t.startswith(">") and not t.startswith(">>>") for t in told):
        return list(lines)
    return [t.removeprefix(">").removeprefix(" ") if t.strip() else t for t in lines]


# A command typed at a shell prompt: `$ vllm serve ...`, `(venv) user@host:~/dir$ ./main ...`, `# ./run.sh`.
_SHELL_COMMAND = re.compile(r"^\s*(?:\(\S+\)\s*)?(?:[\w.-]+@[\w.-]+(?::\S*)?\s*)?[$#%]\s+\S")


def unwrap(lines: list[str]) -> list[str]:
    """A log hard-wrapped at a terminal's width, lines joined again: when the longest lines all have one
    length (at least 60, at least twice, or once in a paste of up to four lines), each of them continues
    on the next line. The continuation's
    place is left blank, so line numbers still point into the log as given.

    >>> log = ["loading " + "." * 47 + "RuntimeError: CUDA out of", " memory", "=" * 80, "done"]
    >>> unwrap(log)[:2]
    ['loading ...............................................RuntimeError: CUDA out of memory', '']
    >>> unwrap(["$ vllm bench latency --input-len 256 --output-len 256 --model Qwen3/Qwen3-8B --batch-size 1",
    ...         "terminate called after throwing an instance of 'std::bad_alloc'"])[1]
    "terminate called after throwing an instance of 'std::bad_alloc'"
    """
    lens = [len(t.rstrip("\r\n")) for t in lines]
    width = max(lens, default=0)
    once = lens.count(width) == 1 and len(lines) <= 4  # a short paste may be one long line wrapped once,
    if width < 60 or lens.count(width) > 0.8 * len(lines) or (lens.count(width) < 2 and not once):
        return list(lines)
    if once:  # ... then the break falls inside a sentence: what follows is no new capitalised statement
        k = lens.index(width)
        if k == len(lines) - 1 or not re.match(r"[a-z\s(,;:/._-]", lines[k + 1][:1] or "A") \
                or re.match(r"[\w./-]+: \S", lines[k + 1]) \
                or _SHELL_COMMAND.match(lines[k]) \
                or re.search(r'", line \d+, in \S+$|[\s\]%|]Killed$', lines[k].rstrip()):  # "zsh: segmentation fault", "prog: error: ...": a record;
            return list(lines)  # a command typed at a prompt ends where its user pressed Enter, a frame at its
            # function, a shell's `Killed` (after a progress bar as wide as the terminal) at the end of its line
    out, i = list(lines), 0
    while i < len(out) - 1:
        j = i
        while j < len(out) - 1 and lens[j] == width and not out[j].rstrip().endswith((".", "!", "?")) \
                and not _record_start(out[j + 1], out[i]):
            j += 1  # a line wrapped more than once continues on several
        if j > i:
            out[i] = "".join(t.rstrip("\r\n") for t in out[i:j + 1])
            for k in range(i + 1, j + 1):
                out[k] = ""
        i = j + 1
    return out


def _record_start(line: str, record: str) -> bool:
    """A line that begins a record of its own (a log prefix, the record's own first characters, a traceback),
    not the rest of a wrapped one: periodic log lines are often of one length."""
    t = line.strip()
    return (not t or strip_prefixes(line)[0] != t or line[:12] == record[:12]
            or t.startswith(("Traceback", "File \"")))


def classify(lines: list[str], *, exit_code: int | None = None, signal: int | None = None,
             engine: str | None = None, oom: OomEvidence | None = None,
             phase_hint: str | None = None, rules: tuple[Rule, ...] | None = None) -> Verdict:
    """The verdict for a dead (or never-ready) server from its log and exit evidence.

    `exit_code` is the process's status (negative = killed by that signal, as subprocess reports),
    `signal` a signal number if known separately, `phase_hint` a spec.Phase value (where the
    supervisor saw it die) or an engine log phase such as "loading_weights" (kept in detail).
    """
    rules = rules if rules is not None else load_rules(engine)
    m = _matcher(rules)
    texts, ranks = [], []
    for raw in unwrap(unquote(lines)):
        t, r = strip_prefixes(raw)
        texts.append(t)
        ranks.append(r)

    # layer 1: signature rules
    roots, wrappers, matched, ignored, own = [], [], set(), set(), set()
    for n, text in enumerate(texts, 1):
        rule = m.match(text)
        if rule is None:
            continue
        matched.add(n)
        if rule.engine != "generic":
            own.add(n)
        if rule.kind == "ignore":
            ignored.add(n)
            continue
        f = Finding(cause=rule.cause, line=n, text=text, layer="rule", confidence=0.9, rank=ranks[n - 1],
                    source=f"{rule.id}: {rule.source}", advice=rule.advice, rule_id=rule.id,
                    kind="root" if rule.kind == "root" else "wrapper")
        (roots if rule.kind == "root" else wrappers).append(f)
    # layer 2: structure
    sig = _signal_of(exit_code, signal)
    sigkills, ooms, externals = structure.kills(texts)
    sigkills = [f for f in sigkills if f.line not in own]  # the engine's own rule for a kill says more
    strong = [*roots,
              *(f for f in structure.exceptions(texts, ranks, m.root_cause) if f.line not in matched),
              *(f for f in ooms if f.line not in matched),
              *(f for f in structure.native_reports(texts, m.root_cause) if f.line not in matched),
              *(f for f in structure.panics(texts, m.root_cause) if f.line not in matched),
              *(f for f in structure.no_progress(texts) if f.line not in matched),
              *(f for f in externals if f.line not in matched)]
    bounds = [n for n, t in enumerate(texts, 1) if _LIFETIME.search(t)]
    if bounds and strong:
        last = max(f.line or 0 for f in strong)  # the lifetime of the last failure
        start = max((b for b in bounds if b <= last), default=0)
        strong = [f for f in strong if (f.line or 0) >= start]
    known = [f for f in strong if f.cause is not Cause.unknown]
    bugs = [f for f in strong if f.cause is Cause.unknown]
    # weak readings (degenerate text, leftovers) and cause words decide only when nothing strong
    # does, so a long log with a real error never pays for them
    weak = [] if strong else [*(f for f in structure.degenerate(texts) if f.line not in matched),
                              *(f for f in structure.leftovers(texts) if f.line not in matched)]
    oom_found = (oom is not None and oom.found) or bool(ooms) or any(f.cause is Cause.host_oom for f in roots)
    killed9 = sig == 9 or bool(sigkills)
    heard = [t if n not in ignored else "" for n, t in enumerate(texts, 1)]  # known-harmless lines say nothing
    scores = words.score(heard) if not strong or len(texts) <= 400 else []
    if scores:
        # a crash or a kill said after (or with) another cause's words is how that cause ended the process: the
        # table's native_crash is "with no more specific cause above"
        named = [(c, n) for c, s, n in scores if c not in _CONSEQUENCE and s >= 2]
        scores = [x for x in scores if x[0] not in _CONSEQUENCE or not any(n <= x[2] for _, n in named)] or scores

    decided: Finding | None = None
    alts: dict[Cause, float] = {}
    extra_advice = ""
    # a rule that names a kill, or a stop from outside (a scheduler's CANCELLED, a SIGTERM): with OOM
    # evidence in the same log the stop was how the memory ran out ("Detected 1 oom_kill event")
    killed_any = killed9 or any(w.cause is Cause.killed_external for w in wrappers) or bool(externals)
    errors = [f for f in known if f.kind != "kill"]
    if killed_any and oom_found and (oom is not None and oom.found or not errors
                                  or min(f.line for f in errors) >= min([f.line for f in ooms] or [10**9])):
        # the OOM killer (the cgroup's count, the kernel's line) decides, even over an earlier error line
        src = next((f for f in roots + ooms if f.cause is Cause.host_oom), None) or \
            next((f for f in wrappers + sigkills if f.cause is Cause.killed_external), None)  # the line naming the kill
        decided = Finding(Cause.host_oom, src.line, src.text, src.layer, 0.95, source=src.source, rank=src.rank,
                          rule_id=src.rule_id) if src else \
            Finding(Cause.host_oom, None, "the memory cgroup counted an OOM kill", "oom", 0.95)
        decided.confidence = 0.95
    elif known or bugs:
        decided = min(known + bugs, key=lambda f: (f.line or 0, f.strength != STRONG))
        earlier = [w for w in wrappers if w.cause is not Cause.unknown and (w.line or 0) < (decided.line or 0)]
        if decided.cause is Cause.unknown and earlier:
            # a wrapper that named a cause (a worker killed, a peer gone) came before an exception
            # that names none: the exception is the consequence
            decided = earlier[0]
            decided.confidence = 0.65
        elif decided.cause is Cause.unknown and known:  # a plain bug first, a known cause right behind: say both
            nxt = min(known, key=lambda f: f.line or 0)
            chained = any(_CHAINED.search(t) for t in texts[(decided.line or 0):(nxt.line or 0) - 1])
            if chained:
                # Python chained the second exception to the first ("During handling of the above
                # exception ..."): the one that names a cause says what the first meant
                alts[Cause.unknown] = 0.3
                decided = nxt
            else:
                alts[nxt.cause] = 0.45
        env = structure.setting_named(texts, decided.line) if decided.cause is Cause.unknown and decided.line else None
        if env:
            # a plain error that names the setting an environment variable on the command line gave
            alts[Cause.unknown] = 0.4
            decided = Finding(Cause.bad_args, decided.line, decided.text, "structure", 0.6,
                              source=f"structure: the error names {env[1]}, set on the command line (line {env[0]}): "
                                     "its value was refused")
        # the crash read from its report, or by a generic rule, which only says that a process crashed
        crash = decided.cause is Cause.native_crash and all(f.cause in (Cause.native_crash, Cause.unknown) for f in known) \
            and (decided.layer == "structure" or any(r.id == decided.rule_id and r.engine == "generic" for r in rules))
        if (decided.cause is Cause.unknown and not known or crash) and (decided.line or 0) > 1:
            # a plain bug's exception after a line that said a cause in so many words ("Model type mllama
            # not supported.", then the ModuleNotFoundError it led to): the words say what went wrong first.
            # One line that says it by itself and reports a failure, never the sum of a config's chatter
            # ("collectives gloo with --dist-timeout 60s")
            # A crash's cause is said just before it (a kernel's assert, then the abort it raised)
            lo = max(0, (decided.line or 1) - 1 - 30) if crash else 0
            said = next(((n, sc[0]) for n, t in enumerate(heard[lo:(decided.line or 1) - 1], lo + 1)
                         if t and _FAILED.search(t) and (sc := words.score([t])) and sc[0][1] >= 3
                         and (len(sc) == 1 or sc[0][1] > sc[1][1]) and sc[0][0] not in _CONSEQUENCE), None)
            if said:
                n, (cause, s, _) = said
                alts[decided.cause] = 0.4
                decided = Finding(cause, n, texts[n - 1], "words", 0.5,
                                  source=f"cause words before the {'crash' if crash else 'exception'} (score {s:g}); "
                                         f"the {'crash is how it ended' if crash else 'exception names no cause'}")
    elif killed9:
        decided, extra_advice = _sigkill(sig, sigkills, externals, oom, phase_hint, alts)
    elif weak:
        decided = max(weak, key=lambda f: (f.confidence, -(f.line or 0)))
    elif sig in _NATIVE:
        decided = Finding(Cause.native_crash, None, _exit_text(exit_code, sig), "exit", 0.7,
                          advice="The server died of a native signal with no Python error in the log. Rerun with "
                                 "CUDA_LAUNCH_BLOCKING=1 (and without CUDA graphs: --disable-cuda-graph / "
                                 "--enforce-eager), or get a backtrace with `gdb -batch -ex bt --args ...` / faulthandler.")
    elif wrappers and any(w.cause is not Cause.unknown for w in wrappers):
        decided = next(w for w in wrappers if w.cause is not Cause.unknown)
        decided.confidence = 0.6
    elif sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        decided = Finding(Cause.killed_external, None, _exit_text(exit_code, sig), "exit", 0.7,
                          advice="Something outside the server stopped it (SIGTERM/SIGINT/SIGHUP): a scheduler, "
                                 "a timeout or a user.")
    elif exit_code == 124:
        decided = Finding(Cause.hang, None, _exit_text(exit_code, sig), "exit", 0.6,
                          advice="`timeout` ended it (status 124): it made no progress in time. Look at the last "
                                 "phase in the log.")
    elif scores and scores[0][1] >= 2 and (len(scores) == 1 or scores[0][1] >= 1.25 * scores[1][1]
                                            or _memory_tie(scores)):
        cause, s, n = scores[0]  # best first, and of equals the earlier
        total = sum(x[1] for x in scores)
        decided = Finding(cause, n, texts[n - 1], "words", round(min(0.6, 0.3 + 0.3 * s / total), 2),
                          source=f"cause words: score {s:g} of {total:g} over the log")

    left = structure.left_behind(texts) if decided is not None and decided.cause in _ENDINGS else None
    if left is not None and (left.line or 0) > (decided.line or 0):
        # how the server ended (a startup timeout, a kill), then the workers it left running, listed: the
        # leak is what the log reports; the ending is its second reading
        alts[decided.cause] = 0.45
        decided = left
    if decided is not None and decided.extra.get("type") == "KeyboardInterrupt":
        hung = next(((n, sc) for c, sc, n in scores if c is Cause.hang and sc >= 2), None)
        waited = _interrupted_wait(texts, decided.line or 0)
        if hung:  # stopped by hand because it had stopped making progress: the hang is the cause
            alts[Cause.killed_external] = 0.5
            decided = Finding(Cause.hang, hung[0], texts[hung[0] - 1], "words", 0.6,
                              source=f"cause words: a hang (score {hung[1]:g}) before a Ctrl-C (KeyboardInterrupt)")
        elif waited:  # Ctrl-C while it still started, blocked in a wait: it was stuck there
            alts[Cause.killed_external] = 0.45
            decided = Finding(Cause.hang, waited[0], texts[waited[0] - 1], "structure", 0.55,
                              source=f"structure: Ctrl-C (KeyboardInterrupt) reached it blocked in {waited[1]}() "
                                     "before it said it was ready")
            extra_advice = ("It was waiting in the frame above when someone pressed Ctrl-C, before the server was ready: "
                            "find what that call waits on (a subprocess, a lock, a peer); rerun and take "
                            "`py-spy dump --pid PID` while it waits.")
        else:
            alts[Cause.hang] = 0.35
            extra_advice = ("Someone pressed Ctrl-C (KeyboardInterrupt). If it was stuck, the traceback above shows where "
                            "it waited; rerun and take `py-spy dump --pid PID` while it hangs.")
    if decided is not None and decided.cause is Cause.gpu_oom and _BARE_CUDA_OOM.search(decided.text) \
            and not any(_DEVICE_FIGURES.search(t) for t in texts):
        # the CUDA runtime's error 2 is also what a failed pinned host allocation (cudaMallocHost)
        # returns: without a device's figures the log cannot say which memory it was
        alts[Cause.host_oom] = max(alts.get(Cause.host_oom, 0), 0.3)
        extra_advice = ("CUDA's bare `out of memory` (error 2, cudaErrorMemoryAllocation) is also a failed pinned "
                        "host allocation (cudaMallocHost: WSL and containers limit page-locked memory): if the "
                        "failing call allocates host memory, it is host RAM; `nvidia-smi` while it loads tells.")
    for f in [*strong, *weak, *wrappers]:
        if f.cause is not Cause.unknown and (decided is None or f.cause is not decided.cause):
            alts[f.cause] = max(alts.get(f.cause, 0), round(f.confidence * 0.6, 2))
    total = sum(s for _, s, _ in scores) or 1
    for cause, s, _ in scores[:4]:
        if decided is None or cause is not decided.cause:
            alts[cause] = max(alts.get(cause, 0), round(0.4 * s / total, 2))
    return _verdict(decided, lines, texts, ranks, exit_code, sig, oom, oom_found, phase_hint, rules, wrappers,
                    alts, extra_advice)


# CUDA's out-of-memory status without a word of the device (`CUDA error 2 at ggml-cuda.cu:359: out of memory`),
# and the figures that place an allocation on a device (PyTorch's "Tried to allocate", a capacity, a free count)
_BARE_CUDA_OOM = re.compile(r"CUDA error:? 2\b|CUDA error \d+ at \S+: out of memory|cudaErrorMemoryAllocation|"
                            r"CUDA error: out of memory")
_DEVICE_FIGURES = re.compile(r"Tried to allocate|total capacity|GPU \d+ has|device memory|VRAM|free memory on device|"
                             r"cudaMalloc(?!Host)|CUDA\d* buffer|KV cache|kv_cache", re.I)

# calls that block until something else happens: a Ctrl-C that lands in one found the process waiting
_WAIT_FUNCS = {"select", "poll", "epoll", "wait", "_wait", "_try_wait", "wait_for", "_wait_for_tstate_lock", "communicate",
               "_communicate", "acquire", "join", "recv", "recv_into", "accept", "read", "readline", "readinto", "sleep",
               "get", "result", "barrier", "synchronize"}
# a server that said it was up: a Ctrl-C after this is a person ending a working server
_UP = re.compile(r"Uvicorn running on|Application startup complete|server is listening|listening on|Running on http|"
                 r"\bready\b.*\b(?:serve|serving|requests|roll)|The server is fired up", re.I)


def _interrupted_wait(texts: list[str], line: int) -> tuple[int, str] | None:
    """(line, function) of a blocking wait among the three innermost frames of the traceback a
    KeyboardInterrupt ended, when nothing before it said the server was up; else None."""
    if line <= 1 or any(_UP.search(t) for t in texts[:line - 1]):
        return None
    frames = []
    for n in range(line - 1, max(0, line - 60), -1):
        t = texts[n - 1]
        if t.startswith("Traceback"):
            break
        m = structure.FRAME.match(t.lstrip())
        if m and m.group("func"):
            frames.append((n, m.group("func")))
    return next(((n, f) for n, f in frames[:3] if f in _WAIT_FUNCS), None)


def _sigkill(sig, sigkills: list[Finding], externals: list[Finding], oom: OomEvidence | None, phase_hint: str | None,
             alts: dict[Cause, float]) -> tuple[Finding, str]:
    """A SIGKILL with no OOM evidence: who is more likely to have sent it, and how to tell."""
    line = sigkills[0] if sigkills else None
    if externals:
        f = externals[0]
        alts[Cause.host_oom] = 0.25
        return Finding(Cause.killed_external, f.line, f.text, "structure", 0.7, source=f.source), ""
    if oom is not None and oom.counts_kills:
        alts[Cause.host_oom] = 0.15
        return Finding(Cause.killed_external, line.line if line else None, line.text if line else "SIGKILL",
                       "structure", 0.8, source="the memory cgroup counted no OOM kill: the SIGKILL came from "
                                                "outside"), ""
    if line is not None:
        # A shell or container reporting `Killed`/137 in a pasted log: on the machines users report
        # from, the kernel's OOM killer is far more often the sender than a person.
        alts[Cause.killed_external] = 0.4
        return Finding(Cause.host_oom, line.line, line.text, "structure", 0.55,
                       source="structure: a SIGKILL with no sign of who sent it; the kernel's OOM killer is the "
                              "usual sender (not confirmed: no cgroup or kernel log came with the log)"), _HOW_TO_TELL
    alts[Cause.host_oom] = 0.4
    return Finding(Cause.killed_external, None, _exit_text(None, sig), "exit", 0.5,
                   source="exit status only"), _HOW_TO_TELL


def _verdict(d: Finding | None, lines, texts, ranks, exit_code, sig, oom, oom_found, phase_hint, rules, wrappers,
             alts, extra_advice) -> Verdict:
    phase = _phase(phase_hint)
    detail = {"exit_code": exit_code, "signal": sig, "log_phase": phase_hint, "rule": None}
    ev: list[Evidence] = []
    if d is None:
        cause, advice = Cause.unknown, ("No evidence of a known cause in the log or the exit status. Looked for: "
                                        + "; ".join(LOOKED_FOR) + ". The first error-like line is kept as evidence.")
        detail.update(layer="none", looked_for=list(LOOKED_FOR))
        exc = first_exception(lines, list(zip(texts, ranks)))
        if exc:
            ev.append(Evidence(kind="log", text=exc[1].strip(), line=exc[0], source="first traceback"))
        elif not wrappers:
            first = next(((n, t) for n, t in enumerate(texts, 1) if re.search(r"error|fail|fatal", t, re.I)), None)
            if first:
                ev.append(Evidence(kind="log", text=first[1][:400], line=first[0], source="first error-like line"))
    else:
        cause = d.cause
        advice = d.advice or (_advice_for(rules, "kernel-oom-killer") if cause is Cause.host_oom else "") \
            or ADVICE.get(cause, "")
        if extra_advice:
            advice = f"{advice} {extra_advice}".strip()
        # weak: read from the shape of the text (degenerate output, leftovers), no error line
        detail.update(rule=d.rule_id, rank=d.rank, layer=d.layer, confidence=d.confidence, weak=d.strength != STRONG)
        if d.line is not None:
            ev.append(Evidence(kind="log", text=_clip(d.text.strip(), 600), line=d.line, source=d.source or d.layer))
        if cause is not Cause.host_oom and d.layer != "structure" or cause is Cause.unknown:
            exc = first_exception(lines, list(zip(texts, ranks)))
            if exc and exc[0] != d.line and cause is Cause.unknown:
                ev.append(Evidence(kind="log", text=exc[1].strip(), line=exc[0], source="first traceback"))
    for w in wrappers[:3]:
        e = Evidence(kind="log", text=w.text.strip()[:300], line=w.line, source=f"{w.rule_id} (wrapper)")
        if all(x.line != e.line for x in ev):
            ev.append(e)
    if exit_code is not None or sig:
        ev.append(Evidence(kind="exit", text=_exit_text(exit_code, sig)))
    if oom is not None and (cause in (Cause.host_oom, Cause.killed_external) or oom_found):
        ev += oom.facts()
    ranked = sorted(((c, p) for c, p in alts.items() if c is not cause and p > 0), key=lambda x: -x[1])[:3]
    alternatives = [Alternative(cause=c, confidence=round(p, 2)) for c, p in ranked]
    conf = d.confidence if d is not None else None
    if cause is Cause.unknown and d is None:
        conf = None
    return Verdict(cause=cause, phase=phase, evidence=ev, advice=advice, detail=detail, confidence=conf,
                   alternatives=alternatives)


def _clip(text: str, most: int) -> str:
    """A long evidence line, its head and its tail: a launcher's line puts the command first and what
    happened to it last ("... exits with return code = -9").

    >>> _clip("x" * 700 + " exits with return code = -9", 600)[-27:]
    'exits with return code = -9'
    """
    if len(text) <= most:
        return text
    head = most * 2 // 3
    return text[:head] + " … " + text[-(most - head - 3):]


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
