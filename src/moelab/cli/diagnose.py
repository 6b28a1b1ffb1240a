"""`moelab diagnose LOG...`: why a server died, from logs captured elsewhere.

One log, several, a folder of them (every file, recursively; one verdict each and a summary
table), or standard input (`-`). The engine is guessed from each log's own words unless
`--engine` says it. Exit 0 when every log is `ok`, 1 when one names a failure, 2 for bad usage.
"""
from __future__ import annotations

import codecs
import gzip
import io
import sys
import zlib
from pathlib import Path

import typer

from moelab.cli.app import app

MAX_FILES = 2000


def _logs(paths: list[str]) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """(name, lines) of every log the arguments name, and the files of a folder left out as not
    text; raises ValueError saying what was wrong."""
    out: list[tuple[str, list[str]]] = []
    skipped: list[str] = []
    for p in paths:
        if p == "-":
            text = text_of(sys.stdin.buffer.read())
            if text is None:
                raise ValueError("standard input is not a text log (it holds binary data)")
            out.append(("<stdin>", text.splitlines()))
            continue
        path = Path(p)
        if path.is_dir():
            files = sorted(f for f in path.rglob("*") if f.is_file() and not f.name.startswith("."))
            if not files:
                raise ValueError(f"{path} is a folder with no files in it: give a log file, a folder of logs, or -")
            if len(files) > MAX_FILES:
                raise ValueError(f"{path} holds {len(files)} files; give at most {MAX_FILES} (a folder of logs)")
            for f in files:
                text = _read(f)
                if text is None:
                    skipped.append(str(f))
                else:
                    out.append((str(f), text.splitlines()))
        elif path.is_file():
            text = _read(path)
            if text is None:
                raise ValueError(f"{path} is not a text log (it holds binary data)")
            out.append((str(path), text.splitlines()))
        else:
            raise ValueError(f"no such log file: {path}")
    return out, skipped


def _read(path: Path) -> str | None:
    try:
        return text_of(path.read_bytes())
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None


GUNZIP_LIMIT = 2 << 30  # a rotated log (server.log.1.gz) is read whole; a bigger one is not a log


def text_of(data: bytes) -> str | None:
    r"""A log's text from its bytes, or None when they are not text. Rotated logs come gzipped;
    Windows PowerShell's `>` writes UTF-16 with a byte-order mark; undecodable bytes are replaced
    rather than refused (a log cut mid-character is still a log).

    >>> text_of("Killed\n".encode("utf-16"))
    'Killed\n'
    >>> import gzip; text_of(gzip.compress(b"\xef\xbb\xbfRuntimeError: CUDA error\n"))
    'RuntimeError: CUDA error\n'
    >>> text_of(b"\x7fELF\x02\x01\x01\x00\x00\x00") is None, text_of(bytes(range(1, 256))) is None
    (True, True)
    >>> text_of("Killed\r\n".encode("utf-16-le"))
    'Killed\r\n'

    """
    if data[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
                data = f.read(GUNZIP_LIMIT + 1)
        except (OSError, EOFError, zlib.error):
            return None
        if len(data) > GUNZIP_LIMIT:
            return None
    for bom, codec in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(bom):
            return data.decode(codec, errors="replace")
    head = data[:4096]
    pairs = list(zip(head[0::2], head[1::2]))
    if pairs and sum(hi == 0 and (32 <= lo < 127 or lo in (9, 10, 13)) for lo, hi in pairs) > 0.9 * len(pairs):
        return data.decode("utf-16-le", errors="replace")  # UTF-16LE without its mark: ASCII text, NUL after each
    if b"\0" in head or sum(head.count(c) for c in _CONTROL) > 0.02 * len(head):
        return None  # NULs, or control bytes no terminal output holds: an executable, an image, a core
    return data.decode("utf-8", errors="replace")


# C0 control bytes other than the ones logs carry (tab, newline, carriage return, bell, backspace,
# form feed, the escape of colours)
_CONTROL = [bytes([c]) for c in range(32) if c not in b"\t\n\r\x07\x08\x0c\x1b"]


@app.command(options_metavar="[OPTIONS] LOG... (a file, a folder of logs, or - for stdin)")
def diagnose(
    logs: list[str] = typer.Argument(..., help="Server logs (`nohup ... > server.log 2>&1`), folders of logs, or -."),
    exit_code: int | None = typer.Option(None, "--exit-code", help="The server's exit status (137 = SIGKILL, "
                                         "-9 also accepted), if you know it (applies to every log given)."),
    engine: str | None = typer.Option(None, "--engine", help="Engine whose own rules apply too (sglang, vllm, "
                                      "embedded ...); default: guessed from each log."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document (one verdict, or every verdict "
                                  "and a summary)."),
) -> None:
    """Say why a server died from its log: cause, phase, evidence lines, advice, and second readings."""
    from moelab.cli.output import console, emit_json, fail
    from moelab.diagnose import RuleError, classify, guess_engine, rule_engines
    from moelab.diagnose.render import verdict_doc, verdict_json, verdict_panel
    from moelab.engines import ENGINES

    known = sorted({*rule_engines(), *ENGINES.names()})
    if engine is not None and engine not in known:
        fail(f"no rules for engine {engine!r}", f"use one of: {', '.join(known)} (or leave --engine out to guess)")
    try:
        found, skipped = _logs(logs)
    except ValueError as e:
        fail(str(e), "give the path of a server log (e.g. server.log), a folder of logs, or - for stdin")
    if not found:
        fail(f"no text logs among the files given ({len(skipped)} binary files left out)",
             "give a server log file, a folder of logs, or - for stdin")
    results = []
    for name, lines in found:
        if not any(ln.strip() for ln in lines):
            if len(found) == 1:
                fail(f"{name} is empty: there is nothing to diagnose",
                     "give the log of the failed launch (stdout and stderr: `... > server.log 2>&1`)")
            results.append((name, lines, None, None))
            continue
        eng = engine or guess_engine(lines)
        try:
            v = classify(lines, exit_code=exit_code, engine=eng)
        except RuleError as e:
            fail(f"a rule file is broken: {e}", "fix the rule named above")
        results.append((name, lines, eng, v))
    if len(results) == 1:
        name, lines, eng, v = results[0]
        extra = {"log": name, "lines": len(lines), "engine": eng, "engine_guessed": engine is None}
        if json_out:
            typer.echo(verdict_json(v, **extra))
        else:
            guessed = f" (engine {eng}, guessed from the log)" if engine is None and eng else \
                f" (engine {eng})" if eng else ""
            console.print(verdict_panel(v, log_name=Path(name).name,
                                        footer=[f"{len(lines)} lines read from {name}{guessed}"]), soft_wrap=False)
        raise typer.Exit(0 if v.ok else 1)
    judged = [r for r in results if r[3] is not None]
    counts: dict[str, int] = {}
    for _, _, _, v in judged:
        counts[v.cause.value] = counts.get(v.cause.value, 0) + 1
    if json_out:
        emit_json({"logs": [{"log": n, "lines": len(ls), "engine": e, **(verdict_doc(v) if v else
                                                                           {"cause": None, "note": "empty"})}
                            for n, ls, e, v in results],
                   "summary": {"logs": len(results), "empty": len(results) - len(judged), "causes": counts,
                               "not_text": skipped}})
    else:
        _table(results, counts)
        if skipped:
            console.print(f"{len(skipped)} files left out as not text: " + ", ".join(skipped[:5]) +
                          (" ..." if len(skipped) > 5 else ""), soft_wrap=True)
    raise typer.Exit(0 if all(v.ok for *_, v in judged) else 1)


def _table(results, counts: dict[str, int]) -> None:
    from rich import box
    from rich.table import Table

    from moelab.cli.output import console

    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("log", "engine", "cause", "conf.", "second reading", "evidence"):
        t.add_column(col, overflow="fold")
    for name, _, eng, v in results:
        if v is None:
            t.add_row(name, "-", "(empty)", "", "", "")
            continue
        ev = next((e for e in v.evidence if e.kind == "log"), v.evidence[0] if v.evidence else None)
        where = f"{Path(name).name}:{ev.line} " if ev is not None and ev.line else ""
        alt = ", ".join(f"{a.cause.value} {a.confidence:.2f}" for a in v.alternatives[:2])
        t.add_row(name, eng or "-", v.cause.value, f"{v.confidence:.2f}" if v.confidence is not None else "-", alt,
                  (where + (ev.text if ev else ""))[:140])
    console.print(t)
    console.print(f"{len(results)} logs: " + ", ".join(f"{c} {n}" for c, n in sorted(counts.items(), key=lambda x: -x[1])),
                  soft_wrap=True)
