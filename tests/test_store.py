"""The SQLite store: trial rows written before and after launch, resume marking, export/import."""
from __future__ import annotations

import json
import subprocess
import sys

from moelab.store import Store, trial_key

FP = {"engine": "command", "engine_version": "1.0", "gpu": None, "driver": None}


def _row(**kw):
    row = dict(seq=1, stage="screen", rep=0, label="a=1", key="k1", engine="command", model=None,
               changes=[["--a", 1]], flags={"--a": 1}, args=["--a", "1"], env={}, fingerprint=FP)
    row.update(kw)
    return row


def fill(path):
    with Store(path) as st:
        sid, resumed = st.open_study("s", {"strategy": "grid", "x": 1}, FP)
        t1 = st.begin_trial(sid, **_row())
        st.finish_trial(t1, status="done", verdict={"cause": "ok", "phase": "load", "evidence": []},
                        metrics={"points": [{"concurrency": 1, "output_tps": 10.0}]}, samples=[{"c": 1, "samples": []}])
        st.begin_trial(sid, **_row(key="k2", label="a=2"))  # left running: a killed moelab
        return sid, resumed


def test_resume_marks_interrupted_and_keeps_finished(tmp_path):
    sid, resumed = fill(tmp_path / "s.db")
    assert not resumed
    with Store(tmp_path / "s.db") as st:
        sid2, resumed = st.open_study("s", {"strategy": "grid", "x": 1}, FP)
        assert (sid2, resumed) == (sid, True)
        assert st.mark_interrupted(sid) == 1
        done = st.done_trial(sid, "screen", "k1", 0)
        assert done["metrics"]["points"][0]["output_tps"] == 10.0 and done["flags"] == {"--a": 1}
        assert st.done_trial(sid, "screen", "k2", 0) is None  # interrupted: runs again
        # another study may reuse the exact key; the same study never "reuses" itself this way
        assert st.verdict_for("k1", exclude_study=sid, need_metrics=True) is None
        assert st.verdict_for("k1", exclude_study=sid + 1, need_metrics=True)["id"] == done["id"]


def test_one_stored_measurement_is_reused_once_per_study(tmp_path):
    # a finalist measured in two separate launches: a later study reuses two stored launches, never
    # one launch twice; with none left it launches again
    ok = {"cause": "ok", "phase": "load", "evidence": []}
    with Store(tmp_path / "s.db") as st:
        old, _ = st.open_study("old", {"strategy": "grid", "x": 1}, FP)
        first = [st.begin_trial(old, **_row(stage="final", rep=i)) for i in range(2)]
        for t in first:
            st.finish_trial(t, status="done", verdict=ok, metrics={"points": [{"concurrency": 1, "output_tps": 10.0}]})
        new, _ = st.open_study("new", {"strategy": "grid", "x": 2}, FP)
        got = []
        for i in range(3):
            r = st.verdict_for("k1", exclude_study=new, need_metrics=True, stage="final")
            got.append(r and r["id"])
            t = st.begin_trial(new, **_row(stage="final", rep=i))
            if r:
                st.finish_trial(t, status="reused", verdict=ok, metrics=r["metrics"], reused_from=r["id"])
    assert sorted(got[:2]) == sorted(first) and got[2] is None


def test_key_depends_on_what_a_verdict_depends_on():
    k = trial_key("vllm", {"engine_version": "0.9", "gpu": "H200", "driver": "580"}, "m", ["--a", "1"], {})
    assert k == trial_key("vllm", {"engine_version": "0.9", "gpu": "H200", "driver": "580", "other": 1}, "m", ["--a", "1"], {})
    assert k != trial_key("vllm", {"engine_version": "0.10", "gpu": "H200", "driver": "580"}, "m", ["--a", "1"], {})
    assert k != trial_key("vllm", {"engine_version": "0.9", "gpu": "H200", "driver": "580"}, "m", ["--a", "2"], {})
    assert k != trial_key("vllm", {"engine_version": "0.9", "gpu": "H200", "driver": "580"}, "m", ["--a", "1"], {"X": "1"})


def moelab(*args):
    r = subprocess.run([sys.executable, "-m", "moelab.cli", *args], capture_output=True, text=True, timeout=60)
    r.stderr = " ".join(r.stderr.split())  # Rich wraps long lines at the terminal width
    return r


def test_export_import_round_trip_through_the_cli(tmp_path):
    fill(tmp_path / "a.db")
    out = tmp_path / "a.json"
    r = moelab("store", "export", str(tmp_path / "a.db"), "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"out": str(out), "studies": 1, "trials": 2}
    r = moelab("store", "import", str(tmp_path / "b.db"), str(out), "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == {"studies": 1, "trials": 2}
    again = moelab("store", "import", str(tmp_path / "b.db"), str(out), "--json")
    assert json.loads(again.stdout) == {"studies": 0, "trials": 0}  # the same study is not added twice
    with Store(tmp_path / "b.db") as st:
        t = st.trials()
        assert [x["label"] for x in t] == ["a=1", "a=2"] and t[0]["metrics"]["points"][0]["output_tps"] == 10.0
    listed = json.loads(moelab("store", "list", str(tmp_path / "b.db"), "--json").stdout)
    assert listed[0]["name"] == "s" and listed[0]["trials"] == 2


def test_import_refuses_what_is_not_an_export(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"studies": []}))
    r = moelab("store", "import", str(tmp_path / "b.db"), str(bad))
    assert r.returncode == 2 and "not a moelab store export" in r.stderr
    bad.write_text("{nope")
    r = moelab("store", "import", str(tmp_path / "b.db"), str(bad))
    assert r.returncode == 2 and "is not JSON" in r.stderr
    r = moelab("store", "export", str(tmp_path / "missing.db"))
    assert r.returncode == 2 and "no store at" in r.stderr
