"""Entry point of ranks 1..N-1: `python -m moelab.engine.parallel.worker --rank R ...` (started by
rank 0, never by hand). It loads its part of the model exactly as rank 0 does (build.py), then
runs rank 0's commands until STOP. Its refusals print the same `moelab serve: error:` lines as
rank 0's, so the launch's diagnosis reads them the same way.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import traceback


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="moelab-rank")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--store", required=True, help="host:port of rank 0's TCPStore")
    ap.add_argument("--parent", type=int, required=True, help="rank 0's pid: this rank dies with it")
    ap.add_argument("--config", required=True, help="rank 0's ServerConfig as JSON")
    a = ap.parse_args(argv)

    from moelab.engine.parallel import ranklog
    from moelab.engine.parallel.ranks import die_with_parent

    ranklog.install(a.rank)
    die_with_parent(a.parent)
    for sig in (signal.SIGINT, signal.SIGTERM):  # rank 0 decides when the launch ends
        signal.signal(sig, signal.SIG_IGN)

    from moelab.engine.build import build_engine
    from moelab.engine.checkpoint import ModelLoadError
    from moelab.engine.config import ConfigError, ServerConfig
    from moelab.engine.parallel.group import open_store
    from moelab.engine.parallel.ranks import Follower

    d = json.loads(a.config)
    cfg = ServerConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
    host, port = a.store.rsplit(":", 1)
    try:
        link = Follower(a.rank, cfg, open_store(host, int(port), cfg.parallelism.ranks, False, cfg.dist_timeout))
        engine, _ = build_engine(cfg, link)
        link.serve(engine)
    except ConfigError as e:
        print(f"moelab serve: error: {e}", file=sys.stderr, flush=True)
        return 2
    except ModelLoadError as e:
        print(f"moelab serve: error: cannot load the model: {e}", file=sys.stderr, flush=True)
        return 1
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
