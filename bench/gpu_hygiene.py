"""moelab's GPU hygiene on a real GPU, end to end through the CLI (run on the GPU machine).

    python bench/gpu_hygiene.py OUT_DIR

1. a foreign process takes 2 GiB of the GPU; `moelab doctor` must name it;
2. `moelab launch` of the embedded engine on the GPU must refuse (the foreign process named), and
   with --force must launch, serve, tear down and find GPU memory back at its baseline;
3. a server that leaves a GPU-holding grandchild in a session of its own must be `orphan_leak`,
   with the grandchild ended and the GPU memory back;
then the foreign process is ended. Prints one line per check and writes every JSON to OUT_DIR.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fakes" / "fake_server.py"
MOELAB = [sys.executable, "-c", "import sys; from moelab.cli import main; sys.argv[0] = 'moelab'; main()"]


def moelab(out: Path, name: str, *args: str, timeout: float = 240) -> dict:
    r = subprocess.run([*MOELAB, *args], capture_output=True, text=True, timeout=timeout)
    (out / f"{name}.stdout.json").write_text(r.stdout)
    (out / f"{name}.stderr.txt").write_text(r.stderr)
    try:
        return {"rc": r.returncode, **json.loads(r.stdout)}
    except json.JSONDecodeError:
        return {"rc": r.returncode, "error": r.stderr[-2000:]}


def used_mib() -> list[int]:
    q = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True)
    return [int(x) for x in q.stdout.split()]


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    base = used_mib()
    hog = subprocess.Popen([sys.executable, "-c", "import torch, time; x = torch.empty(2 << 30, dtype=torch.uint8, "
                            "device='cuda'); print('held', flush=True); time.sleep(3600)"], stdout=subprocess.PIPE,
                           text=True)
    hog.stdout.readline()
    try:
        print(f"baseline GPU memory used: {base} MiB; a foreign process (pid {hog.pid}) holds 2 GiB: {used_mib()} MiB")
        doc = moelab(out, "doctor", "doctor", "--json")
        gpus = doc.get("gpus") or []
        named = any(str(hog.pid) in json.dumps(g) for g in gpus)
        print(f"doctor: {[(g.get('name'), g.get('sm'), g.get('memory_total')) for g in gpus]}; driver "
              f"{doc.get('driver')}; CUDA driver {doc.get('cuda_driver')}, torch CUDA {doc.get('torch_cuda')}; foreign pid named: {named}")
        refused = moelab(out, "launch_refused", "launch", "--json", "--no-probe", "--out", str(out / "t_refused"),
                         "--", "--preset", "tiny", "--device", "cuda")
        print(f"launch next to it: {refused.get('cause')} ({refused.get('phase')}): "
              f"{[e['text'] for e in refused.get('evidence', [])][:2]}")
        forced = moelab(out, "launch_forced", "launch", "--json", "--force", "--out", str(out / "t_forced"),
                        "--", "--preset", "tiny", "--device", "cuda")
        td = (forced.get("detail") or {}).get("teardown") or {}
        print(f"launch --force: {forced.get('cause')}; teardown gpu_back={td.get('gpu_back')} "
              f"({td.get('gpu_note') or 'within 256 MiB of the baseline'}); port_free={td.get('port_free')}")
        leak = moelab(out, "launch_leak", "launch", "--engine", "command", "--json", "--no-probe", "--force",
                      "--out", str(out / "t_leak"), "--", sys.executable, str(FAKE), "--mode", "gpu_grandchild",
                      "--port", "{port}")
        td = (leak.get("detail") or {}).get("teardown") or {}
        print(f"GPU-holding grandchild: {leak.get('cause')} ({leak.get('phase')}); escaped {td.get('escaped')}; "
              f"gpu_back={td.get('gpu_back')}")
    finally:
        hog.kill()
        hog.wait()
    time.sleep(2)
    print(f"after: GPU memory used {used_mib()} MiB (baseline {base})")


if __name__ == "__main__":
    main()
