"""The structure of a failure log, read without knowing its wording: layer 2 of the classifier.

Signature rules (layer 1) know messages. This layer knows the shapes every engine's logs share,
so it also reads logs whose words no rule has seen:
  - Python exceptions: the exception line ending each traceback (or standing alone in an excerpt),
    its type, its message, and the package whose frame raised it (triton, torch.distributed,
    safetensors, argparse ...): `OutOfResources` is a kernel resource limit whatever it says, a
    `RuntimeError` raised inside torch/distributed is a collective failure, an `AttributeError` in an
    engine's own code is a plain bug;
  - native crash reports: C++ `terminate called ... what(): ...` (the what() message decides),
    Python's faulthandler (`Fatal Python error: Segmentation fault`), backtrace frames;
  - kills: a shell's `Killed`, container and job exit codes, Kubernetes and Slurm events, SIGTERM
    notices, and the OOM evidence that turns a SIGKILL into host_oom;
  - what a dead server left behind: process listings (ps, nvtop) with orphans or GPU memory held;
  - degenerate generated text (one character or one short unit repeated, rows of `#`);
  - no progress: throughput reports stuck at zero while requests are running.

Each detector returns `Finding`s: a cause, the 1-based line, the text, and how strong it is.
"""
from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass, field

from moelab.spec import Cause

STRONG, WEAK = 2, 1  # a strong finding is a root error; a weak one decides only when nothing strong does


@dataclass
class Finding:
    cause: Cause
    line: int | None  # 1-based; None for facts that are not one line (exit status)
    text: str
    layer: str  # "rule", "structure", "words", "exit", "oom"
    confidence: float
    strength: int = STRONG
    source: str = ""
    rank: str | None = None
    advice: str = ""
    rule_id: str | None = None
    kind: str = "root"  # root | wrapper | kill | oom | context
    extra: dict = field(default_factory=dict)


# -- Python exceptions -------------------------------------------------------------------------
_EXC = re.compile(r"^(?:(?P<mod>[A-Za-z_][\w.]*)\.)?(?P<type>[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Failed|"
                  r"Warning|Exceeded|Timeout))(?::\s*(?P<msg>.*)|\s*)$")
# a traceback frame (prefix-stripped): its file and, where given, its function
FRAME = re.compile(r'^File "(?P<path>[^"]+)", line \d+(?:, in (?P<func>\S+))?')
# exception type -> cause (any message)
TYPE_CAUSE: dict[str, Cause] = {
    "OutOfMemoryError": Cause.gpu_oom,  # torch.OutOfMemoryError / torch.cuda.OutOfMemoryError
    "MemoryError": Cause.host_oom,
    "OutOfResources": Cause.kernel_resource_limit,  # triton.runtime.errors.OutOfResources
    "CompilationError": Cause.jit_compile_error,  # triton.compiler.errors.CompilationError
    "BackendCompilerFailed": Cause.jit_compile_error,  # torch._dynamo (inductor)
    "InductorError": Cause.jit_compile_error,
    "DistBackendError": Cause.collective_error,
    "DistNetworkError": Cause.collective_error,
    "DistStoreError": Cause.collective_error,
    "NcclError": Cause.collective_error,
    "ArgumentError": Cause.bad_args,
    "ArgumentTypeError": Cause.bad_args,
    "SafetensorError": Cause.model_load_error,
    "HeaderTooLarge": Cause.model_load_error,
    "GatedRepoError": Cause.model_load_error,
    "RepositoryNotFoundError": Cause.model_load_error,
    "EntryNotFoundError": Cause.model_load_error,
    "LocalEntryNotFoundError": Cause.model_load_error,
    "HFValidationError": Cause.model_load_error,
    "KeyboardInterrupt": Cause.killed_external,  # Ctrl-C: a person stopped it (classify asks whether it hung first)
}
# types that, with no rule for their message, are plain software bugs: `unknown`, the error kept
BUG_TYPES = {"AttributeError", "TypeError", "NameError", "KeyError", "IndexError", "ZeroDivisionError",
             "UnboundLocalError", "NotImplementedError", "ImportError", "ModuleNotFoundError", "RecursionError",
             "AssertionError", "JSONDecodeError", "UnicodeDecodeError", "StopIteration", "IsADirectoryError"}
# the package of the frame that raised a generic exception -> cause (path fragments, first match)
PACKAGE_CAUSE: tuple[tuple[str, Cause], ...] = (
    ("/torch/distributed/", Cause.collective_error),
    ("/c10d/", Cause.collective_error),
    ("/triton/compiler/", Cause.jit_compile_error),
    ("/triton/runtime/build", Cause.jit_compile_error),
    ("/torch/utils/cpp_extension", Cause.jit_compile_error),
    ("/tvm_ffi/cpp/", Cause.jit_compile_error),
    ("/flashinfer/jit/", Cause.jit_compile_error),
    ("/deep_gemm/jit/compiler", Cause.jit_compile_error),
    ("/argparse.py", Cause.bad_args),
    ("/safetensors/", Cause.model_load_error),
    ("/huggingface_hub/", Cause.model_load_error),
    ("/transformers/models/auto/", Cause.model_load_error),
    ("/transformers/configuration_utils", Cause.model_load_error),
    ("/transformers/dynamic_module_utils", Cause.model_load_error),
    ("/gguf/", Cause.model_load_error),
)
# generic types whose package decides (others are taken as they come)
GENERIC_TYPES = {"RuntimeError", "Exception", "ValueError", "OSError", "AssertionError", "CalledProcessError",
                 "SystemExit", "TimeoutError"}


def package_of(path: str) -> str | None:
    """`.../site-packages/triton/compiler/compiler.py` -> `triton`; a repo checkout's first package dir."""
    m = re.search(r"(?:site|dist)-packages/([\w.-]+?)(?:-[\d.]+[^/]*\.egg)?/", path)
    if m:
        return m.group(1).split("-")[0]
    m = re.search(r"/(sglang|vllm|tensorrt_llm|lmdeploy|text_generation_server|xinference|deep_gemm|flashinfer|"
                  r"triton|torch|transformers|ray)/", path)
    return m.group(1) if m else None


_RAISE = re.compile(r"^raise (\w+)\(")


def exceptions(texts: list[str], ranks: list[str | None], rule_cause=None) -> list[Finding]:
    """Every exception line that ends a traceback (or stands alone), with the frames above it.
    `rule_cause(text)` reads a follow-on message line (pydantic's) with the signature rules."""
    out: list[Finding] = []
    frames: dict[str | None, list[str]] = {}
    for n, (text, rank) in enumerate(zip(texts, ranks), 1):
        if text.endswith("Traceback (most recent call last):"):
            frames[rank] = []
            continue
        fm = FRAME.match(text)
        if fm:
            # a path a terminal wrapped and the paste kept padded (`.../torch/utils      /cpp_extension.py`)
            frames.setdefault(rank, []).append(_WRAP_GAP.sub("", fm.group("path")))
            continue
        m = _EXC.match(text)
        raised = _RAISE.match(text)
        if raised and (n == len(texts) or not FRAME.match(texts[n]) and not _EXC.match(texts[n])):
            # an excerpt that ends at the `raise X(...)` source line: the type still says what happened,
            # or for a generic type the package of the frames above it (torch's cpp_extension build)
            etype = raised.group(1)
            cause, why = (TYPE_CAUSE[etype], "") if etype in TYPE_CAUSE else \
                _exception_cause(etype, "", frames.get(rank, [])) if etype in GENERIC_TYPES else (None, "")
            if cause is not None:
                out.append(Finding(cause=cause, line=n, text=text, layer="structure", rank=rank, confidence=0.75,
                                   source=f"structure: the traceback ends raising {etype}" + (f" ({why})" if why else "")))
                frames.pop(rank, None)
                continue
        if not m or text.startswith(("warnings.warn", "raise ")):
            continue
        etype, msg = m.group("type"), (m.group("msg") or "").strip()
        had_header = rank in frames
        if etype == "ValidationError" and rule_cause is not None:
            # pydantic: "N validation error(s) for XConfig" and the message on the next lines
            inner = next((c for t in texts[n:n + 4] if (c := rule_cause(t.removeprefix("Value error, ")))), None) or \
                next((c for t in texts[n:n + 4] if (c := message_cause(t.strip().removeprefix("Value error, ")))
                      and c is not Cause.bad_args), None)
            cause = inner or Cause.bad_args
            out.append(Finding(cause=cause, line=n, text=(text + " " + " ".join(texts[n:n + 2]))[:500],
                               layer="structure", rank=rank, confidence=0.8,
                               source="structure: a configuration validation error" +
                                      (f" whose message says {inner.value}" if inner else "")))
            frames.pop(rank, None)
            continue
        stack = frames.pop(rank, [])
        src = next((t for t in texts[max(0, n - 4):n - 1][::-1] if t.strip() and not _CARETS.fullmatch(t.strip())), "")
        read = _SETTING_READ.search(src) if not FRAME.match(src) else None
        if read and (etype == "ValueError" or read.group("env") and etype in ("TypeError", "KeyError")):
            # the source line that raised reads a setting (an environment variable, a key of the loaded
            # configuration): its value was refused
            what = f"the environment variable {read.group('var')}" if read.group("env") else f"the setting {read.group('var')!r}"
            out.append(Finding(cause=Cause.bad_args, line=n, text=text, layer="structure", rank=rank, confidence=0.7,
                               source=f"structure: {etype} raised reading {what}: its value is not what the program "
                                      "takes", extra={"type": etype, "message": msg}))
            continue
        if etype == "AssertionError" and _DIVIDES.search(src):
            # `assert self.total_num_kv_heads % tp_size == 0`: a size of the model does not divide by
            # the parallelism asked for; the flag is refused, however bare the AssertionError
            out.append(Finding(cause=Cause.bad_args, line=n, text=(src.strip() + " -> " + text)[:500], layer="structure",
                               rank=rank, confidence=0.75,
                               source="structure: an assert that a size of the model divides by the parallel size "
                                      "failed: that parallel size does not fit this model", extra={"type": etype,
                                                                                                  "message": msg}))
            frames.pop(rank, None)
            continue
        if _CHILD_KILLED.search(msg):
            continue  # a launcher's error that its child was killed: the kill (and its reason) is the evidence
        path = next((p for p in reversed(stack) if not p.endswith(("/subprocess.py", "/threading.py"))), None)
        cause, why = _exception_cause(etype, msg, stack)
        if cause is None and had_header and not etype.endswith("Warning"):
            # the exception that ends a traceback is the root error even when nothing says which cause
            cause, why = Cause.unknown, f"{etype} ends the traceback; its message names no known cause"
        if cause is None:
            continue
        out.append(Finding(cause=cause, line=n, text=text, layer="structure", rank=rank,
                           confidence=0.8 if cause is not Cause.unknown else 0.6,
                           source=f"structure: {etype}{' raised in ' + (package_of(path) or path) if path else ''}"
                                  f" ({why})", extra={"type": etype, "message": msg, "package": package_of(path or "")}))
    return out


_WRAP_GAP = re.compile(r"\s{2,}(?=/)")  # padding a terminal's wrap left inside a path, before a slash
_CARETS = re.compile(r"[~^]+")  # Python 3.11's marks under the failing expression
# a source line of a traceback that reads an environment variable (`int(os.getenv('VLLM_PORT', '0'))`) or
# a key of a loaded configuration (`contextsize_text.index(str(dict["contextsize"]))`)
_SETTING_READ = re.compile(r"\b(?:(?P<env>os\.(?:getenv|environ(?:\.get)?))|(?:config|cfg|conf|settings|dict|options|opts))"
                           r"\s*[(\[]\s*['\"](?P<var>\w+)['\"]")
# an assert that a size divides by a parallel size (`assert n_heads % tp_size == 0`,
# `% get_tensor_model_parallel_world_size() == 0`): the divisor's name holds a parallelism word
_DIVIDES = re.compile(r"^\s*assert\b.*%\s*\(?\s*[\w.]*?(?<![a-z])(?:tp|ep|pp|dp|tensor|parallel|world|gpus|shards?)(?![a-z])[\w.]*"
                      r"(?:\(\))?\s*\)?\s*==\s*0")
# a launcher's exception whose message says its child died of SIGKILL / SIGTERM
_CHILD_KILLED = re.compile(r"died with <Signals\.SIG(?:KILL|TERM): (?:9|15)>|non-zero exit status -(?:9|15)\b")


# a shell line that sets an environment variable for the command it runs ("OLLAMA_ORIGINS=x ollama serve")
_ENV_SET = re.compile(r"(?:^|[\s;$>])(?P<var>[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)=\S+\s+(?:[\w./-]+)")
# words of variable names that name no one setting (which device, where, how loud)
_ENV_COMMON = {"cuda", "visible", "devices", "device", "home", "path", "level", "debug", "verbose", "cache", "dir",
               "launch", "blocking", "host", "port", "num", "threads", "library"}


def setting_named(texts: list[str], line: int) -> tuple[int, str] | None:
    """(line, VAR): an environment variable set on a command line before `line` whose own word the
    error at `line` names ("OLLAMA_ORIGINS=chrome-extension://... ollama serve", then "panic: bad
    origin: origins must contain '*'"): the value given was refused.

    >>> setting_named(["$ OLLAMA_ORIGINS=chrome-extension://abc ollama serve", "panic: bad origin: ..."], 2)
    (1, 'OLLAMA_ORIGINS')
    >>> setting_named(["CUDA_VISIBLE_DEVICES=0 python serve.py", "KeyError: 'device'"], 2) is None
    True
    """
    said = texts[line - 1].lower()
    for n in range(line - 1, 0, -1):
        for m in _ENV_SET.finditer(texts[n - 1]):
            for word in m.group("var").lower().split("_")[1:]:
                stem = word[:-1] if word.endswith("s") else word
                if len(stem) >= 4 and word not in _ENV_COMMON and re.search(rf"\b{re.escape(stem)}", said):
                    return n, m.group("var")
    return None


def _exception_cause(etype: str, msg: str, stack: list[str]) -> tuple[Cause | None, str]:
    if etype in TYPE_CAUSE:
        return TYPE_CAUSE[etype], f"{etype} means {TYPE_CAUSE[etype].value}"
    if etype.endswith("Warning"):
        return None, ""
    if etype in GENERIC_TYPES or etype not in BUG_TYPES:
        for frag, cause in PACKAGE_CAUSE:
            if any(frag in p for p in stack[-3:]):
                return cause, f"raised from {frag.strip('/')}"
    if etype == "CalledProcessError" and re.search(r"\b(ninja|nvcc|gcc|g\+\+|c\+\+|clang|ptxas|ld|cmake|make)\b", msg):
        return Cause.jit_compile_error, "a compiler or build tool failed"
    said = message_cause(msg)
    if said is not None:
        return said, f"its message says {said.value}"
    if etype in BUG_TYPES:
        return Cause.unknown, f"{etype}: a plain software error, no known cause"
    return None, ""


# a setting named in a message: `--flag`, a backquoted or quoted snake_case name, or a config key=value
_SETTING = re.compile(r"(?<![\w-])--[a-z][\w-]+|`[a-z_][\w.]*`|'[a-z]+_[a-z_]+'|\b[a-z]+(?:_[a-z]+)+\b\s*(?:=|\(\d)")
_CONSTRAINT = re.compile(r"\bmust(?: not)? be\b|\bshould be\b|\brequires?\b|\bgreater than\b|\bless than\b|\bexceeds?\b|"
                         r"\bnot (?:supported|allowed|compatible)\b|\binvalid\b|\bcannot be\b|\bonly (?:supported|support|allowed)\b|"
                         r"\bout of range\b|\bexpected\b.*\bgot\b|(?<=[\w\s)`])\s?[<>]=?\s*`?[\w.-]*\d|\s[<>]=?\s+`?\w|\b(?:smaller|larger|bigger|lower|higher) than\b|"
                         r"\bat (?:least|most)\b", re.I)


@functools.lru_cache(maxsize=1024)  # a long log raises the same exception again and again
def message_cause(msg: str) -> Cause | None:
    """What an exception's message names when its type does not: the cause words (a word of weight
    3, or two causes' words agreeing on one), or a setting (`--flag`, a snake_case key) held to a
    constraint (must be, requires, greater than, not supported with), which is a refused
    configuration."""
    if not msg:
        return None
    from moelab.diagnose import words

    scores = words.score([msg])
    if scores and scores[0][1] >= 3 and (len(scores) == 1 or scores[0][1] > scores[1][1]):
        return scores[0][0]
    if _SETTING.search(msg) and _CONSTRAINT.search(msg):
        return Cause.bad_args
    return None


# -- native crash reports -----------------------------------------------------------------------
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'")
# macOS's C++ runtime says it on one line: "libc++abi: terminating due to uncaught exception of type T: what"
_LIBCXXABI = re.compile(r"libc\+\+abi(?:\.dylib)?: terminating (?:due to|with) uncaught exception of type ([\w<>]+(?:::[\w<>]+)*)(?:: (.*))?")
_WHAT = re.compile(r"^what\(\):\s*(.*)$")
_FAULTHANDLER = re.compile(r"^Fatal Python error: (Segmentation fault|Aborted|Bus error|Floating point exception|"
                           r"Illegal instruction)")


# C++ exception types -> cause, where an uncaught one says more than "it aborted"
CXX_TYPE_CAUSE: dict[str, Cause] = {"std::bad_alloc": Cause.host_oom,  # operator new found no host memory
                                    "c10::OutOfMemoryError": Cause.gpu_oom,
                                    "c10::DistBackendError": Cause.collective_error,
                                    "c10::DistNetworkError": Cause.collective_error}
# a C++ exception's namespace that is a collective library's ("gloo::IoException", "ccl::exception")
_CXX_COLLECTIVE = re.compile(r"^(?:gloo|nccl|rccl|hccl|ccl|ucc|ucx|mpi)::", re.I)


# a gdb backtrace's frame (`#0  0x00005c9f... in triton::server::...::IsCancelled (this=0x0)`, `#3 0x... in ?? ()`);
# a backtrace whose innermost frames wait (a futex, a poll, a stream sync) is a stuck process's, not a crash's
_GDB_FRAME = re.compile(r"^#(\d+)\s+(?:0x[0-9a-f]+ in )?(?P<func>[\w:~<>,*&\[\] ]+?|\?\?) \(.*\)(?: at \S+:\d+| from \S+)?$")
_WAITING = re.compile(r"futex|pthread_cond|pthread_join|sem_wait|\bpoll\b|epoll|select|nanosleep|sched_yield|usleep|"
                      r"\bwait|Synchronize|ncclGroupEnd|clock_nanosleep|__GI___libc_read|recv", re.I)


def native_reports(texts: list[str], rule_cause) -> list[Finding]:
    """C++ terminate (refined by its what() message through `rule_cause(text)`), faulthandler dumps, gdb
    backtraces of a crash."""
    out = []
    frames = [(n, m) for n, t in enumerate(texts, 1) if (m := _GDB_FRAME.match(t.strip()))]
    inner = [m for _, m in frames[:3]]
    if len(frames) >= 2 and frames[0][1].group(1) == "0" and not any(_WAITING.search(m.group("func")) for m in inner):
        n = frames[0][0]
        out.append(Finding(cause=Cause.native_crash, line=n, text=texts[n - 1][:400], layer="structure", confidence=0.7,
                           source=f"structure: a gdb backtrace of a crash ({len(frames)} frames, innermost "
                                  f"{frames[0][1].group('func').strip()[:80]})"))
    for n, text in enumerate(texts, 1):
        m = _TERMINATE.search(text) or _LIBCXXABI.search(text)
        if m:
            what = (m.group(2) or "") if m.re is _LIBCXXABI else \
                next((w.group(1) for t in texts[n:n + 3] if (w := _WHAT.match(t))), "")
            inner = (rule_cause(what) or message_cause(what)) if what else None
            inner = inner if inner not in (None, Cause.unknown) else CXX_TYPE_CAUSE.get(m.group(1)) or \
                (Cause.collective_error if _CXX_COLLECTIVE.match(m.group(1) or "") else None)
            if inner is not None and inner is not Cause.unknown:
                out.append(Finding(cause=inner, line=n, text=f"{text} what(): {what}"[:400], layer="structure",
                                   confidence=0.85, source=f"structure: C++ terminate, what() says {inner.value}"))
            else:
                out.append(Finding(cause=Cause.native_crash, line=n, text=(text + (f" what(): {what}" if what else ""))[:400],
                                   layer="structure", confidence=0.8,
                                   source=f"structure: an uncaught C++ exception ({m.group(1)}) aborted the process"))
            continue
        m = _FAULTHANDLER.match(text)
        if m:
            frame = next((t for t in texts[n:n + 6] if t.startswith("File ")), "")
            out.append(Finding(cause=Cause.native_crash, line=n, text=text, layer="structure", confidence=0.85,
                               source=f"structure: Python faulthandler ({m.group(1)})"
                                      + (f", in {frame[:120]}" if frame else "")))
    return out


# -- Go and Rust panics -------------------------------------------------------------------------
# A panic is those languages' uncaught exception: an index out of range is a plain bug, a nil dereference
# Go turned from a SIGSEGV (it prints `[signal SIGSEGV ...]` on the next line) a native crash, and a message
# that names a cause ("Unable to warmup model: ... out of memory") says it.
_GO_PANIC = re.compile(r"^(?:panic|fatal error): (?P<msg>.+)$")
_GO_SIGNAL = re.compile(r"^\[signal (SIG[A-Z]+)")
_RUST_PANIC = re.compile(r"^thread '[^']*' panicked at (?:'(?P<msg>.*)', \S+:\d+:\d+|(?P<loc>\S+:\d+:\d+):?(?: (?P<msg2>.+))?)$")


def panics(texts: list[str], rule_cause) -> list[Finding]:
    out = []
    for n, text in enumerate(texts, 1):
        m = _GO_PANIC.match(text) or _RUST_PANIC.match(text)
        if not m:
            continue
        lang = "Go" if m.re is _GO_PANIC else "Rust"
        msg = m.group("msg") or (m.groupdict().get("msg2") or (texts[n] if n < len(texts) else "")).strip()
        said = (rule_cause(msg) or message_cause(msg)) if msg else None
        sig = _GO_SIGNAL.match(texts[n]) if n < len(texts) and lang == "Go" else None
        if sig and said in (None, Cause.unknown):
            # Go turned a SIGSEGV (a nil dereference) into this panic: a native crash by the table
            out.append(Finding(cause=Cause.native_crash, line=n, text=f"{text} {texts[n]}"[:500], layer="structure",
                               confidence=0.75, source=f"structure: a Go panic on {sig.group(1)} ({msg[:80]})",
                               extra={"type": "Go panic", "message": msg}))
            continue
        cause = said if said is not None else Cause.unknown
        out.append(Finding(cause=cause, line=n, text=text[:500], layer="structure", confidence=0.8 if said else 0.6,
                           source=f"structure: a {lang} panic" + (f" whose message says {said.value}" if said else
                                                                    ": a plain software error, no known cause"),
                           extra={"type": f"{lang} panic", "message": msg}))
    return out


# -- kills and OOM evidence ------------------------------------------------------------------
_SIGKILL = re.compile(r"(?:^|[\s\]%|])Killed(?:\s+\S.*)?$|已杀死\s*$|\bexit(?:ed)? with code 137\b|\bexit(?: code|ed| status)[: ]+137\b|"
                      r"\bsignal: killed\b|\bkilled by signal 9\b|\bSIGKILL\b|Exit Code:\s*137|code=137|"
                      r"^(?:zsh|bash|sh): (?:line \d+: )?(?:\d+ )?killed\b|\[\d+\]\s+(?:\+\s+)?\d+ killed\s|"
                      r"exit ?code:? -9\b|exitcode\s*:\s*-9\b|return ?code\s*[:=]?\s*-9\b|killed by signal: Killed|^Killed: 9$|"
                      r"[Ee]xit code (?:is|was|of) 137\b|exit(?:ed)? with (?:exit )?code -9\b")
_OOM = re.compile(r"Out of memory: Kill(?:ed)? process|oom-kill:|\boom_kill\b|Memory cgroup out of memory|OOMKilled|"
                  r"killed by the OOM killer|OOM killer|oom-kill event|running low on memory|ray-oom-prevention|"
                  r"memory: usage (\d+)kB, limit \1kB|"
                  r"\bTask in /\S* killed as a result of limit of")  # older kernels' memory-cgroup OOM report
_EXTERNAL = re.compile(r"\bSIGTERM\b|signal 15\b|\b(?:1|2|15) death signal|Received Signals\.SIG(?:HUP|INT) death signal|^Terminated$|^\[\d+\]\s+(?:\+\s+)?\d+ terminated\b|"
                       r"\d+ Terminated\s|exit(?:ed)? with code 143|exit(?: code|ed| status)[: ]+143|signal: terminated|"
                       r"[Ll]iveness probe failed|failed liveness probe|\bEvicted\b|Stopping container|"
                       r"DUE TO (?:TIME LIMIT|PREEMPTION|NODE FAILURE)|\b[Pp]reempt(?:ed|ion)\b|CANCELLED AT|docker stop|"
                       r"scancel|received signal=SIGTERM|Received signal 15|Received Signals\.SIGTERM")


# a launcher ending the other ranks after one died (torchrun, Ray): the consequence, not an outside kill
_TEARDOWN = re.compile(r"Sending process \d+ closing signal SIGTERM|[Kk]illing (?:the )?(?:other|remaining) (?:workers|ranks|processes)")


# every line the three patterns above can match holds one of these (lower case): most lines of a long
# log hold none, and are passed over without running them
_KILL_WORDS = ("kill", "已杀死", "137", "-9", "oom", "sigterm", "signal", "terminat", "evict", "preempt", "probe", "stopping",
               "cancel", "memory", "time limit", "node failure", "docker stop", "143")


def kills(texts: list[str]) -> tuple[list[Finding], list[Finding], list[Finding]]:
    """(SIGKILL lines, OOM evidence lines, external-kill lines)."""
    k, o, e = [], [], []
    for n, text in enumerate(texts, 1):
        low = text.lower()
        if not any(w in low for w in _KILL_WORDS) or _TEARDOWN.search(text):
            continue
        if _OOM.search(text):
            o.append(Finding(Cause.host_oom, n, text, "structure", 0.9, kind="oom",
                             source="structure: OOM-killer / memory-limit evidence"))
        elif _EXTERNAL.search(text):
            e.append(Finding(Cause.killed_external, n, text, "structure", 0.75, kind="kill",
                             source="structure: the process was stopped from outside (a signal, an orchestrator)"))
        elif _SIGKILL.search(text):
            k.append(Finding(Cause.killed_external, n, text, "structure", 0.5, kind="kill",
                             source="structure: SIGKILL (a shell's `Killed`, exit status 137)"))
    return k, o, e


# -- what a dead server left behind ------------------------------------------------------------
_PS_HEADER = re.compile(r"\bPID\b.*\b(PPID|CMD|COMMAND|Command|GPU MEM|Process name|USER)\b")
_PS_ROW_PPID1 = re.compile(r"^\S+\s+\d+\s+1\s+")  # `ps -ef`: USER PID PPID ... (PPID 1: reparented to init)
_PID_PPID1 = re.compile(r"^\d+\s+1\s+[A-Z]\b")  # `ps -o pid,ppid,stat`: PID PPID STAT ...
_GPU_ROW = re.compile(r"^\d+\s+\S+\s+\d+\s+(?:Compute|Graphic)\s+\S+\s+\d+MiB|"  # nvtop: PID USER DEV TYPE GPU MEM
                      r"^\|\s+\d+\s+(?:N/A\s+N/A\s+)?\d+\s+[CG](?:\+G)?\s+\S+.*\d+MiB\s*\|$")  # nvidia-smi
_LEFT = re.compile(r"\borphan(?:ed|s)?\b|\bzombie\b|<defunct>|left behind|\bdangling process|"
                   r"still (?:running|alive|holding|using|occupying|occupied|held|in use|there)|reparented|"
                   r"did not (?:exit|terminate)|\bnot (?:be )?(?:freed|released|cleaned up)\b|kept running|"
                   r"remain(?:s|ing|ed)? (?:running|alive|in memory)|survived (?:SIGKILL|the shutdown|teardown)", re.I)
# `ps aux` (USER PID %CPU %MEM VSZ RSS TTY STAT START TIME COMMAND) and `ss`/`lsof` listeners
_PS_AUX_ROW = re.compile(r"^\S+\s+\d+\s+\d+(?:\.\d+)?\s+\d+\.\d+\s+\d+\s+\d+\s+\S+\s+[RSDZTI][\w<+]*\s+\S+\s+[\d:]+\s+\S")
_LISTENER = re.compile(r"\(LISTEN\)$|^LISTEN\s+\d+\s+\d+\s+\S+:\d+.*users:\(\(")


# an engine's worker process by the name it gives itself (setproctitle), in a listing row with its pid:
# fuser, rocm-smi --showpids, nvidia-smi, ps (a leading "# " of a pasted shell comment is skipped)
_WORKER_ROW = re.compile(r"^(?:#\s+)?(?:\S+\s+)?\d{3,}\s+(?:\S+\s+)*?(?:VLLM::\w+|sglang::\w+|ray::\w+|VllmWorker\w*|EngineCore\w*)\b")


def leftovers(texts: list[str]) -> list[Finding]:
    out = []
    listing = any(_PS_HEADER.search(t.lstrip("# ")) for t in texts)
    for n, text in enumerate(texts, 1):
        if listing and _WORKER_ROW.match(text):
            out.append(Finding(Cause.orphan_leak, n, text, "structure", 0.65, strength=WEAK,
                               source="structure: a process listing shows an engine's worker process still there"))
            continue
        if _LEFT.search(text):
            out.append(Finding(Cause.orphan_leak, n, text, "structure", 0.7, strength=WEAK,
                               source="structure: the log says processes or resources stayed behind"))
        elif (m := _SMI_MEM.search(text)) and int(m.group(3)) == 0 and int(m.group(1)) >= int(m.group(2)) // 2:
            out.append(Finding(Cause.orphan_leak, n, text, "structure", 0.5, strength=WEAK,
                               source="structure: nvidia-smi shows GPU memory held at 0% utilisation (by processes "
                                      "that no longer work)"))
        elif _PS_ROW_PPID1.match(text) or _GPU_ROW.match(text) or (listing and _PID_PPID1.match(text)) or \
                _PS_AUX_ROW.match(text) or _LISTENER.search(text):
            out.append(Finding(Cause.orphan_leak, n, text, "structure", 0.6, strength=WEAK,
                               source="structure: a process listing shows processes reparented to init or "
                                      "holding GPU memory"))
    return out[:3]


_WORKER_NAMED = re.compile(r"^(?:\S+\s+)?\d{3,}\s+(?:\S+\s+)*?(?:VLLM::\w+|sglang::\w+|ray::\w+|VllmWorker\w*|EngineCore\w*)\b")


def left_behind(texts: list[str]) -> Finding | None:
    """The log says processes stayed behind ("orphaned procs:", "still running") and lists an engine's
    worker by pid right under it: the leak is shown, not guessed from a listing."""
    for n, text in enumerate(texts, 1):
        if _LEFT.search(text) and any(_WORKER_NAMED.match(t.strip()) for t in texts[n:n + 3]):
            row = next(t.strip() for t in texts[n:n + 3] if _WORKER_NAMED.match(t.strip()))
            return Finding(Cause.orphan_leak, n, f"{text.strip()} {row}"[:300], "structure", 0.7,
                           source="structure: the log says processes stayed behind and lists an engine's worker "
                                  "still there")
    return None


# -- degenerate generated text ----------------------------------------------------------------
_RUN = re.compile(r"([A-Za-z1-9!?#@$%&,;:'\"`\u4e00-\u9fff\u2047])\1{13,}|(\ufffd)\2{4,}")
_REPLACEMENT = re.compile(r"\ufffd|\\ufffd")
# nvidia-smi's per-GPU row: memory used / total and utilisation (memory held by nothing at work)
_SMI_MEM = re.compile(r"\|\s+(\d+)MiB\s+/\s+(\d+)MiB\s+\|\s+(\d+)%")
_UNIT = re.compile(r"(.{2,16}?)\1{5,}")
_WORD_REPEAT = re.compile(r"\b(\w{2,})(?:\W+\1\b){7,}", re.I)
_ESCAPED_NL = re.compile(r"(?:\\n){8,}")
_MIXED_SCRIPT = re.compile(r"[a-z]{3,}[\u0400-\u04ff]{2,}|[\u0400-\u04ff]{2,}[a-z]{3,}")
_HEXDUMP = re.compile(r"0x[0-9a-fA-F]{4,}|\b[0-9a-fA-F]{16}\b|^[A-Z0-9]{2,3}: [0-9a-f]")
_JUNK = re.compile(r"\b(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{6,}\b")
_CHUNK = re.compile(r'"(?:content|text|delta)"\s*:\s*(?:\{\s*"content"\s*:\s*)?"([^"\\]{3,})"')
_PERIODIC_HINT = re.compile(r"(.{2,16})\1\1\1")  # four in a row: a cheap pre-check
_NUMERIC_UNIT = re.compile(r"[\d\s.,:;()\[\]eE+-]+")
_PLAIN_UNIT = re.compile(r"[\s=\-_*.·─━│|+~^<>]+")


def _unit_repeat(text: str) -> str | None:
    if len(text) < 24 or len(set(text)) > len(text) // 2:  # a long periodic run keeps the alphabet small
        if len(text) < 24 or not _PERIODIC_HINT.search(text):
            return None
    for m in _UNIT.finditer(text):
        unit = m.group(1)
        if unit.strip() and len(m.group(0)) >= 24 and not _PLAIN_UNIT.fullmatch(unit) and not re.search(r"\d{2,}", unit) \
                and not _NUMERIC_UNIT.fullmatch(unit):
            return f"one unit repeated ({unit!r} x {len(m.group(0)) // len(unit)})"
    return None


def _ngram_repeat(text: str) -> str | None:
    """A phrase of 1-6 words said again and again in a row (`the cat sat the cat sat the cat sat ...`)."""
    words = text.split()
    if len(words) < 12:
        return None
    for n in range(1, 7):
        need = 10 if n == 1 else 4
        run = 0
        for i in range(n, len(words)):
            run = run + 1 if words[i] == words[i - n] else 0
            if run >= n * (need - 1) and not _NUMERIC_UNIT.fullmatch(words[i]) and not _PLAIN_UNIT.fullmatch(words[i]):
                return f"the phrase {' '.join(words[i - n + 1:i + 1])!r} repeated"
    return None


def _scripts(text: str) -> int:
    """How many writing systems the words of a line use (Latin, Cyrillic, CJK, Arabic ...)."""
    import unicodedata

    seen = set()
    for ch in text:
        if ch.isalpha() and ord(ch) > 0x7F:
            seen.add(unicodedata.name(ch, "?").split(" ")[0])
        elif ch.isalpha():
            seen.add("LATIN")
    return len(seen - {"?"})


def _junk(text: str) -> bool:
    """Letter-digit salad (`P23D323D4`, `D3D3DDD`) in a short prose line, not a key=value or path."""
    if len(text) > 80 or re.search(r"[=:/\[\]]|0x", text):
        return False
    return sum(len(re.findall(r"[A-Z]\d|\d[A-Z]", t)) >= 3 for t in _JUNK.findall(text)) >= 1


# an evaluation that scored (near) nothing: "Accuracy: 0.016", "'accuracy': 0.0", lm-eval's "|exact_match|↑ | 0|"
_NO_SCORE = re.compile(r"\b(?:accuracy|acc|exact_match|pass@1)['\"]?\s*[:=]\s*0(?:\.(?:0+[0-4]?\d*|0*))?(?![\d.])|"
                       r"\|\s*(?:exact_match|acc(?:_norm)?|accuracy)\s*\|[^|\d]*\|\s*0(?:\.0[0-4]\d*)?\s*\|", re.I)


# a multibyte character decoded in half among whole ones: the detokenizer got bytes, not characters
# (a log read with the wrong encoding has no whole CJK characters to stand beside)
_HALF_CHAR = re.compile(r"\ufffd.{0,4}[\u4e00-\u9fff\u3040-\u30ff\uac00-\ud7af]|[\u4e00-\u9fff\u3040-\u30ff\uac00-\ud7af].{0,4}\ufffd")
_PROGRESS_BAR = re.compile(r"\d+%\|[\u2580-\u259f #=>-]*\|")


def degenerate(texts: list[str]) -> list[Finding]:
    out = []
    scored = next((n for n, t in enumerate(texts, 1) if _NO_SCORE.search(t)), None)
    if scored:
        out.append(Finding(Cause.garbage_output, scored, texts[scored - 1][:300], "structure", 0.6, strength=WEAK,
                           source="structure: an evaluation scored (near) zero: the answers are wrong wholesale, as a "
                                  "kernel or quantization bug answers"))
    hash_rows = junk = 0
    chunks: list[tuple[int, str]] = []
    for n, text in enumerate(texts, 1):
        why = None
        if _PROGRESS_BAR.search(text):
            continue  # tqdm's bar repeats its block by design
        if _ESCAPED_NL.search(text):
            why = "only newlines were generated"
        elif (m := _RUN.search(text)) and not _HEXDUMP.search(text):
            why = f"one character repeated ({m.group(0)[:12]}...)"
        elif (w := _WORD_REPEAT.search(text)):
            why = f"one word repeated ({w.group(1)!r})"
        elif (u := _unit_repeat(text)):
            why = u
        elif (g := _ngram_repeat(text)):
            why = g
        elif _MIXED_SCRIPT.search(text) or (len(text.split()) >= 6 and _scripts(text) >= 4):
            why = "words glued across scripts (token salad)"
        elif _HALF_CHAR.search(text):
            why = "a character cut in half inside the answer (U+FFFD beside CJK text)"
        elif _junk(text):
            junk += 1
            why = "letter-digit salad" if junk >= 2 else None
        if re.fullmatch(r"[#\s]*#[#\s]*", text) and text.strip():
            hash_rows += 1
            if hash_rows == 5:
                why = "rows of '#' only"
        for c in _CHUNK.findall(text):
            chunks.append((n, c))
        if why:
            out.append(Finding(Cause.garbage_output, n, text[:300], "structure", 0.65, strength=WEAK,
                               source=f"structure: degenerate generated text: {why}"))
    bad = [n for n, t in enumerate(texts, 1) if _REPLACEMENT.search(t)]
    if len(bad) >= 2 and not out:
        out.append(Finding(Cause.garbage_output, bad[0], texts[bad[0] - 1][:300], "structure", 0.6, strength=WEAK,
                           source="structure: the output is replacement characters (U+FFFD), bytes that decode to "
                                  "nothing"))
    same = [(n, c) for (n, c), (_, prev) in zip(chunks[1:], chunks) if c == prev and c.strip()]
    if same and not out:
        n, c = same[0]
        out.append(Finding(Cause.garbage_output, n, texts[n - 1][:300], "structure", 0.55, strength=WEAK,
                           source=f"structure: the same streamed token {c!r} again and again"))
    if not out:
        out += broken_text(texts)
    return out[:3]


# -- generated text that is not language ---------------------------------------------------------
# A pasted answer with no error line in it is read as text: words said again within a few words,
# tokens that are no word of any language (`P23D323D4`, a lone `D`), brackets closed by the wrong
# kind (`(... class](...}`). Each is normal once in a while; together, over the answer, they are
# what a broken kernel or quantization makes of a model's output.
_ERRORLIKE = re.compile(r"error|fail|fatal|exception|killed|abort|crash|timeout|timed out|refus|denied|warn|cannot|"
                        r"unable|traceback|^\s*File \"|\bterminated\b|\bsegmentation\b|core dumped", re.I)
# a log's own line (an error, or a level, a clock, a size, a path): not part of an answer
_LOGLIKE = re.compile(_ERRORLIKE.pattern + r"|\b(?:INFO|DEBUG|WARNING|ERROR)\b|\d\d:\d\d:\d\d|"
                      r"^\s*(?:at |#\d+ )|\bpid\b|MiB|GiB|it/s|(?:/[\w.-]+){3}", re.I)
_STOP = set("a an the of to in on at by for and or but is are was were be been being it its this that these those "
            "as with from can could would should will may might not no so if then than there here i you he she we "
            "they me him her us them my your our their do does did has have had".split())
_OPEN, _CLOSE = "([{", ")]}"
# the user's turn in a pasted chat transcript (ollama and llama.cpp's `>>>`/`>` prompts, "User:")
_PROMPT = re.compile(r"^\s*(?:>>>|>|User:|USER:|### (?:Human|User):)\s*")
_TYPED = re.compile(r"^\s*\$\s+\S")  # a command typed at a shell prompt (`$ aichat tell me ...`): the user's words
# pieces of chat-template tokens the model writes as text (`<end_of_turn>`, `end_of_turn_of_of_turn>`, `<|im_end|>`)
_TEMPLATE = re.compile(r"<\|?(?:im_)?(?:start|end|eot|turn)\w*|\b(?:end|start)_(?:of_)?(?:turn|text)\w*|<\|(?:im_end|eot_id|endoftext)")


# word salad: words of a language in an order none of its writers uses -- a function word capitalised
# inside a sentence ("users It C"), an article before a function word ("the there", "a a"), markup
# left half open (one `**`, a `#` between words, a bracket never closed on its line)
_ARTICLES = {"the", "a", "an"}
_FUNCTION = {"the", "a", "an", "there", "and", "of", "to", "is", "it", "this", "that", "in", "on", "at", "by", "for",
             "or", "but", "was", "were", "are", "be", "with", "from", "as", "its", "his", "her", "their", "our", "my",
             "your"}
_CAP_FUNCTION = {"The", "It", "This", "That", "An", "And", "Of", "To", "Is", "In", "On", "For", "With", "But", "Or",
                 "Are", "Was", "From"}
_AFTER_BREAK = re.compile(r"[.!?:;\"'“”‘’(\[\-—*#>|]$")


def _salad(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """[(line, kind)] of grammar slips: "capital" (a function word capitalised mid-sentence), "article"
    (an article before a function word), "markup" (markup left half open on its line)."""
    out = []
    for n, t in lines:
        prev = None
        for w in re.findall(r"[^\W_]+|[^\w\s]+", t):
            if re.match(r"[^\W_]+$", w) and prev is not None:
                if w in _CAP_FUNCTION and not _AFTER_BREAK.search(prev):
                    out.append((n, "capital"))
                if prev.lower() in _ARTICLES and w.lower() in _FUNCTION:
                    out.append((n, "article"))
            prev = w
        out += [(n, "markup")] * (t.count("**") % 2 + len(re.findall(r"(?<=\S\s)#(?=\s)", t))
                                  + (t.count("(") != t.count(")")))
    return out


def _mismatched(text: str) -> int:
    """Brackets closed by the other kind within one line: `(a]`, `{b)`."""
    stack, bad = [], 0
    for ch in text:
        if ch in _OPEN:
            stack.append(ch)
        elif ch in _CLOSE and stack:
            if _OPEN[_CLOSE.index(ch)] != stack.pop():
                bad += 1
    return bad


def _nonword(tok: str) -> bool:
    """A token no language spells: letters and digits alternating (`P23D323D4`), a lone capital that
    is not a word (`D`, `F`), a syllable stuttered on (`heheheheh`, `axaxaxax`)."""
    if len(tok) == 1:
        return tok.isupper() and tok not in "IAO"
    return len(re.findall(r"(?=[A-Z]\d|\d[A-Z])", tok)) >= 3 or bool(_STUTTER.search(tok)) or \
        len(re.findall(r"(?=[^\W\d_]\d|\d[^\W\d_])", tok)) >= 4 and not _HEX.fullmatch(tok)  # `sTRss0y000TR`


_HEX = re.compile(r"(?:0x)?[0-9a-f]+|[0-9A-F]+")  # an address, a hash: digits and letters by design


_STUTTER = re.compile(r"([^\W\d_]{2,3})\1{3,}")
# one token that is a decoder's loop by itself: a syllable six times over, a letter ten times (not the
# x's of a redacted key), or 40 letters unbroken
_LOOPED = re.compile(r"((?!([^\W\d_])\2)[^\W\d_]{2,3})\1{5,}|([^\W\d_xX])\3{9,}")


def _run(toks: list[tuple[int, str]]) -> tuple[int, str, int] | None:
    """(line, word, count) of a word written four or more times in a row ("Care Care Care Care"), the
    loop a broken decoder falls into; None when there is none."""
    best, count = None, 1
    for (_, prev), (n, w) in itertools.pairwise(toks):
        count = count + 1 if w.lower() == prev.lower() and not w.isdigit() else 1
        if count >= 4 and (best is None or count > best[2]):
            best = (n, w, count)
    return best


# A short paste of an answer (a line or two a reporter quoted) is too little for the statistics below, but
# a decoder's loop still shows in it: a phrase said twice and the rest elided (`the function of the
# function of ...`), a syllable stuttered inside a word (`academyléléléléulif`), a long word said twice
# in a row (`dekametersapl dekametersapl`), a line of one symbol (`!!!!!!!`, `///////`).
_ELIDED_LOOP = re.compile(r"^\W*((?:[^\W\d_]+\W+){1,5}?[^\W\d_]+)\W+\1\W*(?:\.\.\.|…)\W*$")
_WORD_TWICE = re.compile(r"\b([^\W\d_]{6,})\s+\1\b", re.I)
_SYMBOL_ROW = re.compile(r"^[\s\"'`]*([!?/\\@$%&:;,])\1{4,}[\s\"'`]*$")
# an answer of punctuation alone, spaced (`, , , ,,`): no letter, no digit, no separator rule
_PUNCT_ONLY = re.compile(r"^\s*(?=(?:\s*[,;:!?/\\@$%&]){4})[\s,;:!?/\\@$%&]+$")
_LABEL = re.compile(r"^\s*(?:Output|Response|Answer|Assistant|AI|Bot|Model|A)\s*:\s*", re.I)


def _short_answer(answers: list[tuple[int, str]]) -> tuple[int, str, bool] | None:
    """(line, why, whole) of a loop in a short pasted answer, `whole` where one line of symbols says it
    in an answer of any length; None when it reads as language."""
    if len(answers) > 4:
        return _symbols(answers)
    for n, t in answers:
        said = _LABEL.sub("", t).strip()
        if (m := _ELIDED_LOOP.search(said)) and len(m.group(1)) >= 6:
            return n, f"{m.group(1)!r} said twice, then the rest left out (...)", False
        if (m := _STUTTER.search(said)) and not re.search(r"(?i)\b(?:ha|he|hi|ho|la|na)+\b", said):
            return n, f"a syllable stuttered inside a word ({m.group(0)!r})", False
        if m := _WORD_TWICE.search(said):
            return n, f"the word {m.group(1)!r} twice in a row", False
    return _symbols(answers)


def _symbols(answers: list[tuple[int, str]]) -> tuple[int, str, bool] | None:
    # one short line of symbols over and over (`<|>` on line after line): a decoder's loop
    prev, start, run, best = None, 0, 0, None
    for n, t in answers:
        key = t.strip()
        run, start = (run + 1, start) if key and key == prev and not re.search(r"[^\W_]", key) else (1, n)
        prev = key
        if run >= 5 and best is None:
            best = (start, key)
    if best:
        return best[0], f"the line {best[1][:20]!r} five or more times in a row", True
    rows = [(n, m.group(1)) for n, t in answers if (m := _SYMBOL_ROW.match(t))]
    if rows and (len(rows) >= 2 or rows[0][1] in "!?"):
        return rows[0][0], f"lines of one symbol repeated ({', '.join(repr(c * 5) for _, c in rows[:3])} ...)", True
    bare = [(n, t) for n, t in answers if _PUNCT_ONLY.match(t)]
    if bare and len(bare) < len(answers):  # among lines that are language: an answer of symbol punctuation alone
        return bare[0][0], f"an answer of punctuation and symbols alone ({bare[0][1].strip()[:20]!r})", True
    return None


# a function word glued to digits (`to293`, `of1The`, `and5.1.The1a1`): a model's number tokens spliced into
# its words, which no identifier spells (`a100`, `sm90`, `cuda12`, `fp16` are no function words)
_GLUED = re.compile(r"(?<![\w.-])(?:the|The|of|to|and|that|with|out)\d+(?![\w.-]*[/=])|(?<=[a-z]\d)(?:The|the|of|and)\b")


# numerals no writer writes, a model's digit tokens run together: a thousands group of more than three
# digits (`1,00080278`), decimals and dashes chained into one long number (`21446.21466-15-05.19398035`)
_MANGLED = re.compile(r"(?<![\w.,-])\d{1,3},\d{4,}(?!\w|[.,-]\d)|"
                      r"(?<![\w.-])(?=[\d.-]{16,}(?![\w.-]))\d+\.\d+(?:-\d+)+\.\d+(?![\w.-])")


def broken_text(texts: list[str]) -> list[Finding]:
    lines = [(n, t) for n, t in enumerate(texts, 1) if t.strip()]
    if not lines or len(lines) > 60 or any(_ERRORLIKE.search(t) for _, t in lines):
        return []  # a log with an error in it, not a pasted answer
    lines = [(n, t) for n, t in lines if not _LOGLIKE.search(t)]  # a server's own lines around the answer
    if not lines:
        return []
    prompts = [n for n, t in lines if _PROMPT.match(t)]
    answers = [(n, t) for n, t in lines if n not in prompts]
    if len(prompts) >= 2 and answers and not any(re.search(r"[^\W\d_]", t) for _, t in answers):
        return [Finding(Cause.garbage_output, answers[0][0], texts[answers[0][0] - 1][:300], "structure", 0.55,
                        strength=WEAK, source=f"structure: a chat transcript whose answers to {len(prompts)} prompts "
                                              "hold no letter, only symbols")]
    if short := _short_answer(answers):
        return [Finding(Cause.garbage_output, short[0], texts[short[0] - 1][:300], "structure", 0.55, strength=WEAK,
                        source=f"structure: the pasted answer is not language: {short[1]}")]
    glued = [(n, m.group(0)) for n, t in lines for pat in (_GLUED, _MANGLED) for m in pat.finditer(t)]
    if len(glued) >= 2 and len(lines) <= 12:  # before the table filter: the digits are the salad
        n = glued[0][0]
        return [Finding(Cause.garbage_output, n, texts[n - 1][:300], "structure", 0.55, strength=WEAK,
                        source="structure: the pasted answer is not language: words glued to digits, or "
                               f"numbers, no writer writes ({', '.join(repr(g) for _, g in glued[:3])})")]
    toks = [(n, w) for n, t in lines if not _TYPED.match(t) for w in re.findall(r"[^\W_]+", t)]
    if len(toks) < 8 or any(w.lower() in ("nan", "inf") for _, w in toks):
        return []  # too little to judge, or numbers that are not numbers: a NaN reading, not broken text
    if sum(w.isalpha() or _nonword(w) for _, w in toks) < 0.5 * len(toks) or \
            sum(w.isdigit() for _, w in toks) > 0.3 * len(toks):
        return []  # a table of figures (a process listing, a metrics dump), not an answer
    why, at = [], None
    for n, sentence in ((n, x) for n, t in lines for x in re.split(r"(?<=[.!?])\s", t)):
        # whole identifiers: "sm_50 sm_60 sm_70" names seven things, it does not say "sm" seven times
        content = [w.lower() for w in re.findall(r"\w+", sentence) if w.lower() not in _STOP]
        again = sum(1 for i, w in enumerate(content) if w in content[max(0, i - 6):i])
        if len(content) >= 10 and again >= 3 and again >= 0.25 * len(content):
            why.append(f"{again} of {len(content)} words of one sentence said again within six words")
            at = n
            break
    if not why:
        run = _run(toks)
        if run:
            why.append(f"{run[1]!r} {run[2]} times in a row")
            at = run[0]
    odd = [n for n, w in toks if _nonword(w)]
    if len(odd) >= 3 and len(odd) >= 0.3 * len(toks):
        why.append(f"{len(odd)} of {len(toks)} tokens are no word (letter-digit runs, lone capitals)")
        at = at or odd[0]
    elif (loop := next(((n, w) for n, w in toks if _LOOPED.search(w) or len(w) >= 40 and w.isalpha()), None)):
        why.append(f"a run of {len(loop[1])} letters no language writes ({loop[1][:24]}...)")
        at = at or loop[0]
    salad = _salad(lines)
    words = sum(1 for _, w in toks if w.isalpha())
    if len(salad) >= 3 and len(salad) >= 0.15 * words and len({k for _, k in salad}) >= 2:
        kinds = sorted({k for _, k in salad})
        why.append(f"word salad: {len(salad)} slips of grammar no writer makes ({', '.join(kinds)})")
        at = at or salad[0][0]
    leaked = [n for n, t in lines if _TEMPLATE.search(t)]
    if len(leaked) >= 3:
        why.append(f"chat-template markers inside the answer on {len(leaked)} lines")
        at = at or leaked[0]
    crossed = [(n, k) for n, t in lines if (k := _mismatched(t))]
    if sum(k for _, k in crossed) >= 2:
        why.append(f"{sum(k for _, k in crossed)} brackets closed by the wrong kind")
        at = at or crossed[0][0]
    if not why:
        return []
    return [Finding(Cause.garbage_output, at, texts[at - 1][:300], "structure", 0.5 + 0.05 * len(why), strength=WEAK,
                    source="structure: the pasted answer is not language: " + "; ".join(why))]


# -- no progress ---------------------------------------------------------------------------
_STUCK = re.compile(r"generation throughput: 0\.0 tokens/s, Running: ([1-9]\d*) reqs")


def no_progress(texts: list[str]) -> list[Finding]:
    # one pass; the patterns run only on lines that hold their words (a long log holds few)
    hits, queued, shifts = [], [], {}
    for n, t in enumerate(texts, 1):
        if "throughput" in t:
            if _STUCK.search(t):
                hits.append((n, t))
            if m := _QUEUED.search(t):
                queued.append((n, t, int(m.group(2))))
        elif "context shift" in t.lower():
            task = _TASK.search(t)
            shifts.setdefault(task.group(0) if task else "", []).append(n)
    if len(hits) >= 3:
        n, t = hits[0]
        return [Finding(Cause.hang, n, t, "structure", 0.75,
                        source=f"structure: {len(hits)} throughput reports at 0.0 tokens/s with requests running")]
    # requests queue up and none is scheduled: reports with nothing running, the queue never shorter,
    # the last at 0.0 tokens/s
    tail = []
    for q in queued:
        tail = tail + [q] if tail and q[2] >= tail[-1][2] else [q]
    if len(tail) >= 2 and _ZERO_GEN.search(tail[-1][1]):
        n, t, _ = tail[0]
        return [Finding(Cause.hang, n, t, "structure", 0.7,
                        source=f"structure: {len(tail)} throughput reports with no request running while "
                               f"{tail[0][2]} -> {tail[-1][2]} wait: nothing is scheduled",
                        advice="Requests wait and none is scheduled: a prompt longer than the scheduler's token budget "
                               "(vLLM --max-num-batched-tokens, SGLang --chunked-prefill-size) never fits a batch "
                               "without chunked prefill. Raise the budget to at least --max-model-len, or enable "
                               "chunked prefill.")]
    # a server that keeps shifting one request's context: it generates past the window and never ends
    looped = max(shifts.values(), key=len, default=[])
    if len(looped) >= 3:
        return [Finding(Cause.hang, looped[0], texts[looped[0] - 1][:300], "structure", 0.65,
                        source=f"structure: one request's context shifted {len(looped)} times: it generates past "
                               "the context window and never finishes",
                        advice="One request generates past the context window and the server keeps shifting its "
                               "context instead of ending it: cap the generated tokens (max_tokens, n_predict, "
                               "ollama's num_predict) or give it a larger context.")]
    return []


_QUEUED = re.compile(r"generation throughput: [\d.]+ tokens/s, Running: (0) reqs.*\bPending: ([1-9]\d*) reqs")
_ZERO_GEN = re.compile(r"generation throughput: 0\.0 tokens/s")
_TASK = re.compile(r"\btask_id\W+\d+")
