"""One log line as the classifier reads it: time stamps, log levels and rank prefixes of every engine
stripped off, the rank kept, ANSI colours removed, JSON-wrapped messages unwrapped.

Engines and their launchers wrap each line in their own way; the same error reads the same after:

    >>> strip_prefixes("[2026-11-30 09:14:21 TP3] RuntimeError: x")
    ('RuntimeError: x', 'TP3')
    >>> strip_prefixes("vllm-1  | ERROR 11-18 18:07:28 engine.py:366] ValueError: No available memory")[0]
    'ValueError: No available memory'
    >>> strip_prefixes("Jan 17 16:39:29 quorra ollama[4173706]: ggml_backend_cuda_buffer_type_alloc_buffer: x")[0]
    'ggml_backend_cuda_buffer_type_alloc_buffer: x'
    >>> strip_prefixes("[rank3]: torch.distributed.DistBackendError: NCCL error")
    ('torch.distributed.DistBackendError: NCCL error', 'rank3')
    >>> strip_prefixes("2025-03-04T10:11:12.123Z ERROR 11-26 09:29:11 engine.py:366]     lambda: x")[0]
    'lambda: x'
    >>> strip_prefixes("1: [pod/vllm-1/server] Killed")
    ('Killed', '1')
"""
from __future__ import annotations

import json
import re

_ANSI = re.compile(r"(?:\x1b|\^\[)\[[0-9;]*[A-Za-z]")
_RANK = re.compile(r"\b(?:TP|DP|EP|PP|RANK|rank)\s?\d+")
# Tried again and again until none matches; each strips one layer.
_PREFIXES = [
    # moelab's own server.log stamp, TGI / Rust tracing: "2023-08-17T10:23:27.032737Z ERROR target: "
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+"
               r"(?:(?:TRACE|DEBUG|INFO|WARN|WARNING|ERROR)\s+(?!\d\d-\d\d \d\d:)(?:[\w:-]+(?:\{[^}]*\})?:\s)?)?"),
    # docker compose / kubectl logs -f: "vllm-1  | ", "api-1                 | "
    re.compile(r"^[A-Za-z][\w.-]{0,40}\s+\|\s?"),
    # journald / syslog: "Jan 17 16:39:27 host ollama[123]: "
    re.compile(r"^[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d \S+ [\w./-]+(?:\[\d+\])?: "),
    # kernel log: "[26002.108918] " (dmesg) and "[Sun Mar 24 23:54:53 2024] " (dmesg -T)
    re.compile(r"^\[\s*\d+\.\d+\]\s"),
    re.compile(r"^\[[A-Z][a-z]{2} [A-Z][a-z]{2} +\d+ [\d:]+ \d{4}\]\s"),
    # SGLang: "[2026-01-02 10:11:12 TP3] ", "[2025-06-26 07:25:31 DP4 TP4] "; Ray/vLLM workers:
    # "(EngineCore_DP0 pid=123) ", "(VllmWorker TP1 pid=9) ", "(pid=4242, ip=10.0.0.1) "
    re.compile(r"^\[(?P<rank>[^\]]*?\b(?:TP|DP|EP|PP|RANK)\s?\d+[^\]]*)\]\s?"),
    re.compile(r"^\[\d{4}-\d\d-\d\d[ T|][\d:.,|]+[^\]]*\]\s?"),
    re.compile(r"^\((?P<rank>[\w:.-]+(?: [\w:.-]+)* pid=\d+(?:, ip=[\d.]+)?)\)\s?"),
    re.compile(r"^\(pid=\d+(?:, ip=[\d.]+)?\)\s?"),
    # torch.distributed's rank prefix: "[rank3]: ", "[rank0]:[W1209 11:24:53.75 x.cpp:117] "
    re.compile(r"^\[(?P<rank>rank\d+)\]:\s?"),
    # vLLM's logger, old and new: "ERROR 11-30 20:07:21 [core.py:1063] ", "ERROR 02-28 01:21:51 engine.py:400] "
    re.compile(r"^(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w./-]+:\d+\] "),
    # glog (PyTorch c10, Triton server, TensorRT): "[E108 20:04:34.46 socket.cpp:957] ",
    # "W0823 16:54:02.337000 139733055988160 torch/x/api.py:688] ", "[E ProcessGroupNCCL.cpp:458] "
    re.compile(r"^\[?[IWEF]\d{3,4} \d\d:\d\d:\d\d\.\d+\s+(?:\d+\s+)?[\w./-]+:\d+\]\s"),
    re.compile(r"^\[[IWEF] [\w./-]+:\d+\]\s"),
    # Python logging: "2024-05-08 16:16:10,360 - lmdeploy - ERROR - ", Ray CLI "2025-04-24 18:57:03,337 ERR cli.py:71 -- "
    re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+ (?:- [\w.]+ - )?(?:DEBUG|INFO|WARNING|WARN|ERROR|ERR|CRITICAL)"
               r"(?: - | [\w.]+:\d+ -- | )"),
    # NCCL: "host:191191:219889 [0] "
    re.compile(r"^[\w.-]+:\d+:\d+ \[\d+\] "),
    # LocalAI / zerolog: "6:47PM DBG ", "10:16PM WRN [WatchDog] "; FreeToken-style "[16:10:33] stdout/INFO  "
    re.compile(r"^\d{1,2}:\d\d[AP]M (?:DBG|INF|WRN|ERR|FTL) "),
    re.compile(r"^\[\d\d:\d\d:\d\d\] [\w/]+/(?:INFO|WARN|WARNING|ERROR|DEBUG)\s+"),
    # Go log: "2023/09/26 23:40:47 llama.go:346: "
    re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d(?: [\w.-]+:\d+:)? "),
    # kubectl logs --prefix: "[pod/vllm-0/server] "; srun --label: "3: " (the task's rank)
    re.compile(r"^\[pod/[\w.-]+/[\w.-]+\]\s"),
    re.compile(r"^(?P<rank>\d{1,3}):(?: |$)"),
    # bare "INFO:     " (uvicorn), "[TRT-LLM] [E] "
    re.compile(r"^(?:INFO|ERROR|WARNING):\s+"),
]
# One regex for every layer: a line is peeled with one search per layer instead of one per prefix.
_ANY_PREFIX = re.compile("|".join(f"(?:{rx.pattern.replace('(?P<rank>', f'(?P<rank{i}>')})"
                                  for i, rx in enumerate(_PREFIXES)))
_LOGFMT = re.compile(r'^time=\S+ level=(?P<level>\w+) source=\S+ msg=(?P<msg>"(?:[^"\\]|\\.)*"|\S+)(?P<rest>.*)$')


def _unwrap_json(line: str) -> str:
    """A JSON-lines log entry: its message (pino, bunyan, llama.cpp's server) instead of the wrapper."""
    if not (line.startswith("{") and line.rstrip().endswith("}")):
        return line
    try:
        doc = json.loads(line)
    except ValueError:
        return line
    for key in ("msg", "message", "error", "err"):
        if isinstance(doc.get(key), str):
            return doc[key].rstrip("\n")
    return line


def _unwrap_logfmt(line: str) -> str:
    """ollama's logfmt: `time=... level=ERROR source=sched.go:455 msg="x" error="y"` -> `x error="y"`."""
    m = _LOGFMT.match(line)
    if not m:
        return line
    msg = m.group("msg")
    if msg.startswith('"'):
        try:
            msg = json.loads(msg)
        except ValueError:
            msg = msg.strip('"')
    return f"{msg}{m.group('rest')}"


def strip_prefixes(line: str) -> tuple[str, str | None]:
    """(line without time/level/rank prefixes, the rank label if there was one)."""
    rank = None
    line = _ANSI.sub("", line.rstrip("\r\n")) if "[" in line else line.rstrip("\r\n")
    changed = True
    while changed:
        changed = False
        if line[:1] in ("{", "t"):
            unwrapped = _unwrap_logfmt(_unwrap_json(line))
            if unwrapped != line:
                line, changed = unwrapped, True
        m = _ANY_PREFIX.match(line)
        if m and m.end():
            label = next((v for k, v in m.groupdict().items() if v), None)
            if label and (rank is None or ("pid=" in rank and _RANK.search(label))):
                tag = _RANK.search(label)  # a TP/DP rank says more than a worker's pid
                rank = tag.group(0) if tag and "pid=" not in label else label
            line, changed = line[m.end():], True
    return _unquote(line.strip()), rank


def _unquote(line: str) -> str:
    """A line of a log pasted as one inline code span keeps the span's backtick at its edge; the line
    without it.

    >>> _unquote("Killed`"), _unquote("`Special tokens have been added"), _unquote("`pip` failed")
    ('Killed', 'Special tokens have been added', '`pip` failed')

    A one-line log in a span that holds spans of its own: the backtick after the first opens a span
    (a space before it), so the first cannot have closed at it:

    >>> _unquote("`ValueError: Set the `--num_processes` argument`"), _unquote("`pip` or `npm`")
    ('ValueError: Set the `--num_processes` argument', '`pip` or `npm`')
    """
    if "`" not in line or line.startswith("```") or line.endswith("```"):
        return line
    if line.count("`") % 2 == 0:
        inner = line[1:-1] if len(line) > 2 and line[0] == line[-1] == "`" else ""
        at = inner.find("`")
        if at > 0 and inner[at - 1].isspace() and at + 1 < len(inner) and not inner[at + 1].isspace():
            return inner.strip()
        return line
    if line.startswith("`"):
        return line[1:].lstrip()
    if line.endswith("`"):
        return line[:-1].rstrip()
    return line
