"""Studies on a real local Ray cluster (`moelab study --executor ray --address ADDR`): a head and
two worker nodes on this machine with declared CPUs and fake GPUs, embedded-engine trials on them.
Results land in the one store; a trial asking for more GPUs than any node is refused at once; a
Ray worker SIGKILLed mid-trial gives an `interrupted` trial that runs again; SIGTERM to the driver
ends every remote server, and so does a SIGKILL of it; resume works across executors; no process
survives.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from moelab.store import Store

from test_cluster_local import write_study
from test_study_process import fakes_of, study_cmd as study

pytestmark = [pytest.mark.ray, pytest.mark.embedded, pytest.mark.slow, pytest.mark.process]
SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture
def cluster():
    """Head (1 CPU, no GPU) and two nodes of 1 CPU and 2 fake GPUs each; ended with the test."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False})
    try:
        for _ in range(2):
            c.add_node(num_cpus=1, num_gpus=2)
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()


def env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}


def servers(store: Path) -> set[str]:
    """The trial ids (owner marks) of the servers of this store running now."""
    out = set()
    for f in fakes_of(store):
        try:
            out.add(f.environ()["MOELAB_TRIAL_OWNER"])
        except psutil.Error:
            pass
    return out


def test_ray_study_lands_in_one_store_and_refuses_an_oversize_trial_at_once(tmp_path, cluster):
    path = write_study(tmp_path, axes={"--moe-runner-backend": ["reference", "grouped"], "--tp-size": [1, 4]},
                       base={"--moe-runner-backend": "reference"})
    store = tmp_path / "r.db"
    t0 = time.monotonic()
    r = subprocess.run(study(path, store, "--executor", "ray", "--address", cluster.address), capture_output=True,
                       text=True, timeout=240, env=env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "3 node(s)" in r.stderr and "up to 3 trials at once" in r.stderr
    s = json.loads(r.stdout)
    with Store(store) as st:
        trials = st.trials()
    by = {t["label"]: t for t in trials if t["stage"] == "grid"}
    for b in ("reference", "grouped"):  # refused at once, never waited on
        big = by[f"moe-runner-backend={b} tp-size=4"]
        assert (big["status"], big["cause"], big["phase"]) == ("pruned", "bad_args", "preflight")
        assert big["verdict"]["evidence"][0]["text"] == "needs 4 GPUs, the largest node has 2"
        assert big["finished"] - big["started"] < 5
    ran = [t for t in trials if t["status"] == "done"]
    # both tp-size=1 grid trials ran; the finals re-measure one or both, as their measured spread says
    assert sorted(t["label"] for t in ran if t["stage"] == "grid") == [
        "moe-runner-backend=grouped tp-size=1", "moe-runner-backend=reference tp-size=1"], s
    assert 1 <= sum(t["stage"] == "final" for t in ran) <= 2
    assert all(t["cause"] == "ok" and t["metrics"]["points"] for t in ran), s
    for t in ran:  # ran by moelab's supervisor on a node; one GPU given to the server (ray#50180)
        pl = t["telemetry"]["placement"]
        assert pl["executor"] == "ray" and pl["node_id"] and len(pl["gpus"]) == 1
        assert f"CUDA_VISIBLE_DEVICES={pl['gpus'][0]}" in Path(t["paths"]["dir"], "repro.sh").read_text()
    assert s["recommendation"]["n"] >= 2 and time.monotonic() - t0 < 240
    assert servers(store) == set()


def test_ray_lost_worker_reruns_the_trial_and_sigterm_ends_every_remote_server(tmp_path, cluster):
    long = {"concurrency": [2], "input_len": 8, "output_len": 48, "num_prompts": 24}
    path = write_study(tmp_path, axes={"--moe-runner-backend": ["reference", "grouped"]}, workload=long,
                       base={"--moe-runner-backend": "reference"})
    store = tmp_path / "k.db"
    p = subprocess.Popen(study(path, store, "--executor", "ray", "--address", cluster.address),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    victim = None
    deadline = time.monotonic() + 120
    while victim is None and time.monotonic() < deadline:  # the Ray worker running the first server seen
        for f in fakes_of(store):
            try:
                par = f.parent()
                if par is not None and par.name().startswith("ray::"):
                    victim = (f.environ()["MOELAB_TRIAL_OWNER"], par)
                    break
            except psutil.Error:
                continue
        time.sleep(0.2)
    assert victim is not None, "no trial server under a Ray worker appeared"
    victim[1].send_signal(signal.SIGKILL)
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err[-3000:]
    assert "its worker or node was lost" in err
    with Store(store) as st:
        trials = st.trials()
    lost_id = int(victim[0].rsplit("#", 1)[1])
    lost = next(t for t in trials if t["id"] == lost_id)
    assert lost["status"] == "interrupted" and "WorkerCrashedError" in lost["verdict"]["evidence"][0]["text"]
    again = [t for t in trials if t["label"] == lost["label"] and t["stage"] == lost["stage"] and t["id"] > lost_id]
    assert again and again[0]["status"] == "done" and again[0]["cause"] == "ok"
    assert {t["label"] for t in trials if t["stage"] == "grid" and t["status"] == "done"} == \
        {"moe-runner-backend=reference", "moe-runner-backend=grouped"}
    assert servers(store) == set()  # the killed worker's server was ended (guardian, driver sweep)

    # SIGTERM to the driver while trials run on the nodes: every remote server ends
    store2 = tmp_path / "t.db"
    p = subprocess.Popen(study(path, store2, "--executor", "ray", "--address", cluster.address),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(servers(store2)) < 2:
        time.sleep(0.2)
    assert len(servers(store2)) == 2, "two trials never ran at once on the cluster"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-3000:]
    assert servers(store2) == set()
    with Store(store2) as st:
        first = st.trials()
    assert sum(t["status"] == "interrupted" for t in first) == 2 and not any(t["status"] == "running" for t in first)
    # resumed on the local executor (started on Ray): the interrupted trials run again there
    r = subprocess.run(study(path, store2), capture_output=True, text=True, timeout=240, env=env())
    assert r.returncode == 0 and "resuming" in r.stderr, r.stderr[-2000:]
    rerun = [t for t in json.loads(r.stdout)["trials"] if t["stage"] == "grid" and t["status"] == "done"]
    assert {t["label"] for t in rerun} == {"moe-runner-backend=reference", "moe-runner-backend=grouped"}
    assert min(t["id"] for t in rerun) > max(t["id"] for t in first)  # run again here, not reused
    assert servers(store2) == set()

    # and the other way round: a packed local study interrupted, resumed on the cluster
    store3 = tmp_path / "l.db"
    p = subprocess.Popen(study(path, store3, "--parallel", "2"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(servers(store3)) < 2:
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    assert p.communicate(timeout=120) and p.returncode == 130
    r = subprocess.run(study(path, store3, "--executor", "ray", "--address", cluster.address), capture_output=True,
                       text=True, timeout=240, env=env())
    assert r.returncode == 0 and "resuming" in r.stderr, r.stderr[-2000:]
    with Store(store3) as st:
        done = [t for t in st.trials() if t["status"] == "done" and t["stage"] == "grid"]
    assert len(done) == 2 and all(t["telemetry"]["placement"]["executor"] == "ray" for t in done)
    assert servers(store3) == set()

    # the driver SIGKILLed outright: Ray ends its tasks' workers, each trial's guardian its server
    store4 = tmp_path / "x.db"
    p = subprocess.Popen(study(path, store4, "--executor", "ray", "--address", cluster.address),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(servers(store4)) < 2:
        time.sleep(0.2)
    assert len(servers(store4)) == 2
    p.kill()
    p.wait()
    deadline = time.monotonic() + 30
    while servers(store4) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert servers(store4) == set()
