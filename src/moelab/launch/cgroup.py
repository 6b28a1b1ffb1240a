"""A memory cgroup per trial, so a host OOM is reproducible and attributable.

cgroup v1 (the memory controller at /sys/fs/cgroup/memory, as on CI here): a child of moelab's own
memory cgroup with memory.limit_in_bytes; after death memory.oom_control's `oom_kill`,
memory.failcnt and memory.max_usage_in_bytes say whether the kernel's OOM killer fired.
cgroup v2: memory.max and memory.events (`oom_kill`, `max`), memory.peak.
When no cgroup can be created (not root, read-only /sys/fs/cgroup), the limit falls back to
RLIMIT_AS for the server process (set by `ulimit -v` in a tiny sh wrapper); that is weaker
evidence (an allocation fails instead of an OOM kill) and is labelled as such.
The server is put into the cgroup by the same sh wrapper (`echo $$ > cgroup.procs; exec ...`),
so every child it ever forks is inside and accounted for.
"""
from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path

from moelab.diagnose import OomEvidence

ROOT = Path("/sys/fs/cgroup")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.I)


def parse_size(text: str) -> int:
    """'4G', '512MiB', '1.5g', '1000000' -> bytes (binary units); ValueError with a hint otherwise."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"cannot read {text!r} as a size; write e.g. 512M, 4G or 8GiB")
    n = float(m.group(1)) * 1024 ** "bkmgt".index((m.group(2) or "b").lower())
    if n < 1 << 20:
        raise ValueError(f"memory limit {text!r} is below 1 MiB; write e.g. 512M or 4G")
    return int(n)


def _own_cgroup(version: int) -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, ctrls, path = line.split(":", 2)
        if version == 1 and "memory" in ctrls.split(","):
            return ROOT / "memory" / path.lstrip("/")
        if version == 2 and hid == "0":
            return ROOT / path.lstrip("/")
    raise OSError("this process is in no memory cgroup")


class MemoryCgroup:
    """One trial's cgroup (or the rlimit fallback). `note` says which, in words."""

    def __init__(self, limit_bytes: int | None, name: str | None = None, try_cgroup: bool = True) -> None:
        self.limit = limit_bytes
        self.path: Path | None = None
        self.version: int | None = None
        self.note = ""
        name = name or f"moelab-{uuid.uuid4().hex[:10]}"
        errors = []
        for version in (1, 2) if try_cgroup else ():
            try:
                self._create(version, name)
                self.note = f"cgroup v{version} {self.path}"
                return
            except OSError as e:
                errors.append(f"v{version}: {e}")
        why = "; ".join(errors) if try_cgroup else "cgroups turned off by the caller"
        self.note = (f"no memory cgroup could be created ({why})" +
                     ("; falling back to RLIMIT_AS (evidence: allocation failures, not OOM kills)"
                      if limit_bytes else ""))

    def _create(self, version: int, name: str) -> None:
        if version == 1 and not (ROOT / "memory").is_dir():
            raise OSError("no v1 memory controller")
        if version == 2 and not (ROOT / "cgroup.controllers").exists():
            raise OSError("no cgroup v2 hierarchy")
        parent = _own_cgroup(version)
        if version == 2 and "memory" not in (parent / "cgroup.subtree_control").read_text().split():
            raise OSError(f"memory controller not enabled in {parent}/cgroup.subtree_control")
        path = parent / name
        path.mkdir()
        try:
            if self.limit is not None:
                f = "memory.limit_in_bytes" if version == 1 else "memory.max"
                (path / f).write_text(str(self.limit))
                if version == 1 and (path / "memory.memsw.limit_in_bytes").exists():
                    try:  # no swapping past the limit either, so the OOM is what the user asked for
                        (path / "memory.memsw.limit_in_bytes").write_text(str(self.limit))
                    except OSError:
                        pass
        except OSError:
            path.rmdir()
            raise
        self.path, self.version = path, version

    def wrap(self, argv: list[str]) -> list[str]:
        """argv prefixed by the sh wrapper that joins the cgroup (or sets RLIMIT_AS), then execs."""
        if self.path is not None:
            return ["/bin/sh", "-c", f'echo $$ > "{self.path}/cgroup.procs" && exec "$@"', "moelab-cg", *argv]
        if self.limit is not None:
            return ["/bin/sh", "-c", f'ulimit -v {self.limit // 1024} && exec "$@"', "moelab-rl", *argv]
        return argv

    def pids(self) -> list[int]:
        if self.path is None:
            return []
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def usage(self) -> int | None:
        return self._int("memory.usage_in_bytes" if self.version == 1 else "memory.current")

    def _int(self, name: str) -> int | None:
        try:
            return int((self.path / name).read_text().split()[0]) if self.path else None
        except (OSError, ValueError, IndexError):
            return None

    def _kv(self, name: str) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in (ln.split() for ln in (self.path / name).read_text().splitlines())}
        except (OSError, ValueError, TypeError):
            return {}

    def oom_kills(self) -> int:
        """OOM kills counted in this cgroup so far (microseconds to read; 0 without a cgroup)."""
        if self.path is None:
            return 0
        if self.version == 1:
            return self._kv("memory.oom_control").get("oom_kill", 0)
        return self._kv("memory.events").get("oom_kill", 0)

    def oom_evidence(self, last_rss: int | None = None) -> OomEvidence:
        """What the cgroup counted; read right after death (takes microseconds)."""
        if self.path is None:
            src = "rlimit (RLIMIT_AS, no cgroup)" if self.limit else "none (no cgroup)"
            return OomEvidence(source=src, limit_bytes=self.limit, last_rss_bytes=last_rss)
        if self.version == 1:
            return OomEvidence(source="cgroup v1", limit_bytes=self.limit,
                               oom_kill=self._kv("memory.oom_control").get("oom_kill", 0),
                               failcnt=self._int("memory.failcnt"),
                               max_usage_bytes=self._int("memory.max_usage_in_bytes"), last_rss_bytes=last_rss)
        ev = self._kv("memory.events")
        return OomEvidence(source="cgroup v2", limit_bytes=self.limit, oom_kill=ev.get("oom_kill", 0),
                           failcnt=ev.get("max"), max_usage_bytes=self._int("memory.peak"), last_rss_bytes=last_rss)

    def remove(self, wait_s: float = 3.0) -> bool:
        """rmdir the cgroup once its processes are gone; False if it could not be removed."""
        if self.path is None:
            return True
        deadline = time.monotonic() + wait_s
        while True:
            try:
                os.rmdir(self.path)
                self.path = None
                return True
            except FileNotFoundError:
                self.path = None
                return True
            except OSError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
