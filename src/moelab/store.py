"""The results store: one SQLite file, written after every trial, read by the report.

A trial row keeps what a verdict needs to be trusted and recomputed later: the resolved flags and
argv, the environment fingerprint (engine version, GPU, driver ...), the verdict with its evidence,
the raw load samples, the telemetry summary and the paths of the logs. A row is inserted as
`running` before launch and completed after; rows still `running` when a study resumes were
interrupted, are marked so, and their trials run again. `key` identifies the exact (engine version,
GPU, driver, model, flags, env), so a later study can reuse a verdict instead of relaunching.

Nothing secret is stored: every document is masked by the store's `Secrets` on the way in, and
environments, argv and flags are masked by name again on the way out (a store written by an
older moelab). One run writes a store at a time: `Store.lock()` takes an exclusive lock on
`<store>.lock`, which the kernel releases however the holder ends; a second writer learns who
holds it.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sqlite3
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Any

from moelab.secrets import NONE, Secrets

SCHEMA = """
CREATE TABLE IF NOT EXISTS studies (
  id INTEGER PRIMARY KEY, name TEXT NOT NULL, spec_hash TEXT NOT NULL, spec TEXT NOT NULL,
  fingerprint TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, status TEXT NOT NULL,
  recommendation TEXT, extra TEXT);
CREATE TABLE IF NOT EXISTS trials (
  id INTEGER PRIMARY KEY, study_id INTEGER NOT NULL REFERENCES studies(id), seq INTEGER NOT NULL,
  stage TEXT NOT NULL, rep INTEGER NOT NULL DEFAULT 0, label TEXT NOT NULL, key TEXT NOT NULL,
  engine TEXT, model TEXT, changes TEXT NOT NULL, flags TEXT NOT NULL, args TEXT NOT NULL, env TEXT NOT NULL,
  fingerprint TEXT NOT NULL, status TEXT NOT NULL, cause TEXT, phase TEXT, verdict TEXT,
  metrics TEXT, samples TEXT, telemetry TEXT, paths TEXT, command TEXT, reused_from INTEGER,
  started REAL NOT NULL, finished REAL, effective TEXT);
CREATE INDEX IF NOT EXISTS trials_key ON trials(key, status);
CREATE INDEX IF NOT EXISTS trials_study ON trials(study_id, stage, key, rep);
"""
JSON_COLS = ("changes", "flags", "args", "env", "fingerprint", "verdict", "metrics", "samples", "telemetry",
             "paths", "command", "effective")  # effective: what the engine's log says it ran (engines/effective.py)
# Columns an import may set (never taken from the imported document's own keys: it is untrusted).
TRIAL_COLS = ("seq", "stage", "rep", "label", "key", "engine", "model", *JSON_COLS, "status", "cause", "phase",
              "reused_from", "started", "finished")
class TrialStatus(str, Enum):
    """Where a trial stands. A finished one (done, pruned, reused) never runs again on resume."""

    running = "running"  # written before launch; still running when a study resumes = interrupted
    done = "done"  # launched and judged
    pruned = "pruned"  # judged without a launch (preflight, attribution, the same failure before)
    reused = "reused"  # another study's verdict for exactly this key
    interrupted = "interrupted"  # moelab was stopped during it; it runs again


DONE = tuple(s.value for s in (TrialStatus.done, TrialStatus.pruned, TrialStatus.reused))
# Columns that hold environments, argv or flags: masked by name again when read.
_NAMED = ("env", "args", "flags", "command", "spec", "recommendation", "verdict")


class Trial(dict):
    """One stored trial, read once: a plain mapping (what the pure rankings, the report and the
    JSON export read) with typed accessors. Its raw load samples, the bulk of a row, are decoded
    only when asked for."""

    def __init__(self, row: dict, raw_samples: str | None = None) -> None:
        super().__init__(row)
        self._raw = raw_samples
        TrialStatus(self["status"])  # a row with a status moelab does not know is not a trial

    def __getitem__(self, k):
        if k == "samples" and self._raw is not None:
            self._decode()
        return super().__getitem__(k)

    def get(self, k, default=None):
        if k == "samples" and self._raw is not None:
            self._decode()
        return super().get(k, default)

    def _decode(self) -> None:
        raw, self._raw = self._raw, None
        super().__setitem__("samples", json.loads(raw) if raw else None)

    def values(self):
        self.get("samples")
        return super().values()

    def items(self):
        self.get("samples")
        return super().items()

    @property
    def status(self) -> TrialStatus:
        return TrialStatus(self["status"])

    @property
    def finished(self) -> bool:
        return self["status"] in DONE

    @property
    def verdict(self):
        """The verdict as moelab's Verdict model (None while running)."""
        from moelab.spec import Verdict

        v = super().get("verdict")
        return Verdict.model_validate(v) if v else None


class StoreError(Exception):
    """The store cannot be used: not a database, or written by another run (the message says who)."""


def trial_key(engine: str, fingerprint: dict, model: str | None, args: list[str], env: dict[str, str]) -> str:
    """Hash of exactly what a verdict depends on: engine version, GPU, driver, model, flags, env."""
    fp = {k: fingerprint.get(k) for k in ("engine_version", "gpu", "sm", "gpu_count", "driver", "cuda", "torch")}
    # masked by name: a secret never enters the hash, and another token is the same configuration
    doc = json.dumps([engine, fp, model, NONE.argv(args), sorted(NONE.env(env).items())], sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:20]


class Store:
    def __init__(self, path: Path, secrets: Secrets = NONE) -> None:
        self.path = Path(path)
        self.secrets = secrets
        self._lock_fd: int | None = None
        if self.path.is_dir():
            raise StoreError(f"{self.path} is a folder, not a store: give the path of a .db file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # autocommit: every statement is durable when it returns (a kill loses nothing finished)
        self.db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        self.db.row_factory = sqlite3.Row
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.executescript(SCHEMA)
            cols = {r["name"] for r in self.db.execute("PRAGMA table_info(studies)")}
        except sqlite3.DatabaseError as e:
            self.db.close()
            raise StoreError(f"{self.path} is not a moelab store ({e}): give the .db file `moelab study "
                             "--store` wrote, or a new path to start one") from None
        if "extra" not in cols:  # a store written before strategy results were kept
            self.db.execute("ALTER TABLE studies ADD COLUMN extra TEXT")
        if "effective" not in {r["name"] for r in self.db.execute("PRAGMA table_info(trials)")}:
            self.db.execute("ALTER TABLE trials ADD COLUMN effective TEXT")  # written before it was read

    def close(self) -> None:
        self.unlock()
        self.db.close()

    # -- one writer at a time -----------------------------------------------------------------
    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def lock(self, what: str = "") -> None:
        """Take the store's writer lock, or raise StoreError naming the run that holds it."""
        if self._lock_fd is not None:
            return
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace")
            os.close(fd)
            try:
                h = json.loads(holder)
                who = (f"moelab pid {h['pid']} ({h.get('what') or 'a study'}), running since "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(h['started']))}")
            except (ValueError, KeyError, TypeError):
                who = "another moelab run"
            raise StoreError(f"{self.path} is being written by {who}: wait for it to finish, or give this run "
                             "another --store") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "what": what or " ".join(sys.argv[1:3]),
                                  "started": time.time()}).encode(), 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _dump(self, v: Any) -> str | None:
        return None if v is None else json.dumps(self.secrets.data(v), default=str)

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- studies ----------------------------------------------------------------------------
    def open_study(self, name: str, spec: dict, fingerprint: dict) -> tuple[int, bool]:
        """(study id, resumed): the unfinished study with this exact spec, else a new one."""
        h = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]
        row = self.db.execute("SELECT id FROM studies WHERE spec_hash=? AND status!='done' ORDER BY id DESC LIMIT 1",
                              (h,)).fetchone()
        now = time.time()
        if row:
            self.db.execute("UPDATE studies SET updated=?, status='running' WHERE id=?", (now, row["id"]))
            return row["id"], True
        cur = self.db.execute("INSERT INTO studies(name, spec_hash, spec, fingerprint, created, updated, status) "
                              "VALUES (?,?,?,?,?,?, 'running')", (name, h, self._dump(spec), self._dump(fingerprint), now, now))
        return cur.lastrowid, False

    def finish_study(self, study_id: int, recommendation: dict | None, status: str = "done",
                     extra: dict | None = None) -> None:
        """Store the outcome; `extra` holds strategy results such as bisect's minimal failing set."""
        self.db.execute("UPDATE studies SET recommendation=?, status=?, updated=?, extra=? WHERE id=?",
                        (self._dump(recommendation), status, time.time(), self._dump(extra), study_id))

    def studies(self) -> list[dict]:
        return [self._study(r) for r in self.db.execute("SELECT * FROM studies ORDER BY id")]

    def study(self, study_id: int | None = None) -> dict | None:
        q = "SELECT * FROM studies WHERE id=?" if study_id else "SELECT * FROM studies ORDER BY id DESC LIMIT 1"
        r = self.db.execute(q, (study_id,) if study_id else ()).fetchone()
        return self._study(r) if r else None

    @staticmethod
    def _study(r: sqlite3.Row) -> dict:
        d = dict(r)
        for k in ("spec", "fingerprint", "recommendation", "extra"):
            d[k] = json.loads(d[k]) if d[k] else None
            if k in _NAMED:
                d[k] = NONE.data(d[k])
        return d

    def mark_interrupted(self, study_id: int) -> int:
        """Rows left `running` by a killed moelab: marked, kept as a record, and run again."""
        cur = self.db.execute("UPDATE trials SET status='interrupted', finished=? WHERE study_id=? AND status='running'",
                              (time.time(), study_id))
        return cur.rowcount

    # -- trials -----------------------------------------------------------------------------
    def begin_trial(self, study_id: int, *, seq: int, stage: str, rep: int, label: str, key: str, engine: str,
                    model: str | None, changes: list, flags: dict, args: list[str], env: dict, fingerprint: dict) -> int:
        cur = self.db.execute(
            "INSERT INTO trials(study_id, seq, stage, rep, label, key, engine, model, changes, flags, args, env, "
            "fingerprint, status, started) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?, 'running', ?)",
            (study_id, seq, stage, rep, label, key, engine, model, self._dump(changes), self._dump(flags), self._dump(args),
             self._dump(env), self._dump(fingerprint), time.time()))
        return cur.lastrowid

    def finish_trial(self, trial_id: int, *, status: str, verdict: dict, metrics: dict | None = None,
                     samples: list | None = None, telemetry: dict | None = None, paths: dict | None = None,
                     command: list[str] | None = None, reused_from: int | None = None,
                     effective: dict | None = None) -> None:
        self.db.execute(
            "UPDATE trials SET status=?, cause=?, phase=?, verdict=?, metrics=?, samples=?, telemetry=?, paths=?, "
            "command=?, reused_from=?, finished=?, effective=? WHERE id=?",
            (status, verdict.get("cause"), verdict.get("phase"), self._dump(verdict), self._dump(metrics), self._dump(samples),
             self._dump(telemetry), self._dump(paths), self._dump(command), reused_from, time.time(),
             self._dump(effective), trial_id))

    def done_trial(self, study_id: int, stage: str, key: str, rep: int) -> dict | None:
        """This study's finished trial for (stage, key, rep): what a resume reuses."""
        r = self.db.execute(f"SELECT * FROM trials WHERE study_id=? AND stage=? AND key=? AND rep=? AND status IN "
                            f"{DONE} ORDER BY id DESC LIMIT 1", (study_id, stage, key, rep)).fetchone()
        return self._trial(r) if r else None

    def verdict_for(self, key: str, exclude_study: int, need_metrics: bool, stage: str = "") -> dict | None:
        """A launched trial from another study with the exact same key (reused unless --rerun),
        from the same stage when there is one (so one measurement is not reused for two stages), and
        never a measurement this study reused already: a finalist's separate launches stay separate
        measurements (another stored one, or a new launch), not one measurement counted twice."""
        q = ("SELECT * FROM trials WHERE key=? AND study_id!=? AND status='done' AND (cause!='ok' OR ?=0 OR "
             "metrics IS NOT NULL) AND NOT (cause='ok' AND id IN (SELECT reused_from FROM trials WHERE study_id=? "
             "AND reused_from IS NOT NULL)) ORDER BY stage=? DESC, id DESC LIMIT 1")
        r = self.db.execute(q, (key, exclude_study, int(need_metrics), exclude_study, stage)).fetchone()
        return self._trial(r) if r else None

    def trials(self, study_id: int | None = None, all_status: bool = True) -> list[Trial]:
        q, args = "SELECT * FROM trials", ()
        if study_id is not None:
            q, args = q + " WHERE study_id=?", (study_id,)
        rows = [self._trial(r) for r in self.db.execute(q + " ORDER BY id", args)]
        return rows if all_status else [r for r in rows if r["status"] in DONE]

    def trial(self, trial_id: int) -> Trial | None:
        """One trial by id (what the runner reads after each trial, instead of the whole study)."""
        r = self.db.execute("SELECT * FROM trials WHERE id=?", (trial_id,)).fetchone()
        return self._trial(r) if r else None

    @staticmethod
    def _trial(r: sqlite3.Row) -> Trial:
        d = dict(r)
        raw = d.pop("samples")
        for k in JSON_COLS:
            if k == "samples":
                continue
            d[k] = json.loads(d[k]) if d[k] else None
            if k in _NAMED:
                d[k] = NONE.data(d[k])
        d["samples"] = None
        return Trial(d, raw)

    # -- export / import ---------------------------------------------------------------------
    def export(self, study_id: int | None = None) -> dict:
        studies = [s for s in self.studies() if study_id is None or s["id"] == study_id]
        ids = {s["id"] for s in studies}
        return {"moelab_store": 1, "studies": studies,
                "trials": [t for t in self.trials() if t["study_id"] in ids]}

    def import_doc(self, doc: dict) -> dict:
        """Add another store's studies and trials (new ids); a study already here is skipped."""
        if not isinstance(doc, dict) or doc.get("moelab_store") != 1:
            raise ValueError("not a moelab store export (expected {\"moelab_store\": 1, ...}); "
                             "make one with `moelab store export STORE`")
        have = {(s["spec_hash"], s["created"]) for s in self.studies()}
        added_s = added_t = 0
        for s in doc["studies"]:
            if (s["spec_hash"], s["created"]) in have:
                continue
            cur = self.db.execute(
                "INSERT INTO studies(name, spec_hash, spec, fingerprint, created, updated, status, recommendation, extra) "
                "VALUES (?,?,?,?,?,?,?,?,?)", (s["name"], s["spec_hash"], self._dump(s["spec"]), self._dump(s["fingerprint"]),
                                               s["created"], s["updated"], s["status"], self._dump(s["recommendation"]),
                                               self._dump(s.get("extra"))))
            added_s += 1
            for t in (t for t in doc["trials"] if t["study_id"] == s["id"]):
                cols = [c for c in TRIAL_COLS if c in t]
                vals = [self._dump(t[c]) if c in JSON_COLS else t[c] for c in cols]
                self.db.execute(f"INSERT INTO trials(study_id, {', '.join(cols)}) VALUES (?{', ?' * len(cols)})",
                                [cur.lastrowid, *vals])
                added_t += 1
        return {"studies": added_s, "trials": added_t}
