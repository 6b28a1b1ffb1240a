#!/usr/bin/env bash
# The one command run on the H200 (device tool) for the kernel table in the README:
#   GPU tests, then `moelab kernels` (optionally tuning the triton runner first), results under $OUT.
# Usage: bench/kernels_h200.sh      (OUT defaults to ./kernels-out; carry .whl: pydantic/typer wheels)
# Knobs (env): TUNE_PLAN="fmts:tokens;..." TUNE_TIMEOUT, TESTS, TEST_TIMEOUT, SKIP_TESTS=1, BACKENDS,
#   FORMATS, TOKENS, REPS, TAG, CONFIG_DIR. The runs behind the README table, in order:
#   TAG=tuned FORMATS=bf16 ... (first bf16 tuning; configs copied into src/moelab/moe/configs/)
#   TEST_TIMEOUT=90 TUNE_TIMEOUT=90 TUNE_PLAN="fp8,nvfp4:1,16,64;bf16:4096" TAG=final
#   TEST_TIMEOUT=40 TESTS="tests/test_moe_gpu.py -k nvfp4" BACKENDS=grouped,triton REPS=20 TAG=final2
#   (second round, after the gemv path and the K-major NVFP4 tiles; configs from focused A/B runs)
#   SKIP_TESTS=1 BACKENDS=grouped,triton REPS=30 TAG=final
#   (third round, after the per-kernel sweep; configs from the method now in moe/tune.py)
#   SKIP_TESTS=1 BACKENDS=grouped,triton REPS=20 TAG=final
#   (fourth round, after A8/SWAP_AB/SPLIT_M; configs from same-run A/B sweeps)
#   SKIP_TESTS=1 BACKENDS=grouped,triton REPS=20 TAG=final TOKENS=1,16,64,256,512,1024,4096
#   (fifth round, after the NVFP4 word decode and the fused path; same command)
#     -> bench/kernels_h200_table.txt
#   SKIP_TESTS=1 BACKENDS=grouped,triton FORMATS=fp8 REPS=20 TAG=final TOKENS=1,4,16,64
#   (sixth round, fp8 only, after the WIDE gemv down tiles) -> bench/kernels_h200_fp8_table.txt
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/kernels-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
# the device image lacks pydantic/typer: wheels carried in .whl (see bench/README or the report)
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
moelab() { python3 -c 'import sys; from moelab.cli import main; sys.argv[0]="moelab"; main()' "$@"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -m gpu ${TESTS:-tests/} -s -p no:cacheprovider --continue-on-collection-errors 2>&1 | tail -n 40 | tee "$OUT/pytest_gpu.txt"
fi
TAG=${TAG:-kernels}; CFG=(--config-dir "${CONFIG_DIR:-$OUT/configs}")
# TUNE_PLAN="fp8,nvfp4:1,16,64;bf16:4096" tunes those formats at those token counts first
IFS=';' read -ra PLAN <<< "${TUNE_PLAN:-}"
for step in "${PLAN[@]}"; do
  python3 -c 'import sys; from moelab.cli import main; sys.argv[0]="moelab"; main()' \
    kernels --tune --tune-only --formats "${step%%:*}" --tokens "${step#*:}" "${CFG[@]}" --timeout "${TUNE_TIMEOUT:-300}" --json >> "$OUT/tune.jsonl" 2>> "$OUT/tune.err"
  echo "tune $step rc=$?"
done
[ -d "${CONFIG_DIR:-$OUT/configs}" ] && tar -C "${CONFIG_DIR:-$OUT/configs}" -cf "$OUT/configs.tar" .
TUNE=()
moelab kernels --shape qwen3-30b-a3b --backends "${BACKENDS:-all}" --reps "${REPS:-50}" --formats "${FORMATS:-bf16,fp8,nvfp4}" --tokens "${TOKENS:-1,16,64,256,1024,4096}" \
  "${TUNE[@]}" "${CFG[@]}" --json > "$OUT/$TAG.json" 2> "$OUT/$TAG.err"
echo "kernels rc=$?"
python3 - "$OUT/$TAG.json" <<'PY' | tee "$OUT/${TAG}_table.txt"
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{d['device']}: copy {d['copy_bw_bytes_s']/1e12:.2f} TB/s {d.get('copy_bw_by_method')}, bf16 {d['bf16_flops_s']/1e12:.0f} TFLOP/s")
print(f"{'backend':9} {'fmt':6} {'T':>5} {'time_us':>9} {'roof_us':>8} {'%roof':>6} {'vs_grp':>7} {'err':>8} {'mem':>7} cause")
f = lambda v, s: "-" if v is None else format(v, s)
for r in d["rows"]:
    print(f"{r['backend']:9} {r['format']:6} {r['tokens']:>5} {f(r.get('time_us'),'9.1f')} {f(r.get('roofline_us'),'8.1f')} "
          f"{f(r.get('pct_roofline'),'6.0f')} {f(r.get('speedup_vs_grouped'),'7.2f')} {f(r.get('rel_err'),'8.1e')} "
          f"{f(r.get('mem_mib'),'7.1f')} {r['cause']} {r.get('launch') or ''} {r.get('evidence','')[:80]}")
for t in d.get("tuned", []):
    print("tuned", json.dumps(t)[:300])
PY
