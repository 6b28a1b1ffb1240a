#!/usr/bin/env bash
# The GPU checks of moelab on one lent H200, in two calls of the device tool (each < 10 minutes):
#   bench/gpu_h200.sh hygiene   doctor, launch hygiene (foreign process, --force, GPU memory back,
#                               a GPU-holding grandchild), the GPU tests, the moelab kernels table
#   bench/gpu_h200.sh engine    bench/engine_throughput.py per format (bf16, fp8, nvfp4) with the
#                               decode roofline, and bench/preset_accuracy.py on CUDA beside it
# Results under $OUT (default ./gpu-out). Carry .whl (the image lacks typer/pydantic/aiohttp ...).
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)' \
  | tee -a "$OUT/gpu.txt"
case "${1:-hygiene}" in
hygiene)
  timeout 200 python3 bench/gpu_hygiene.py "$OUT/hygiene" 2>&1 | tee "$OUT/hygiene.txt"
  timeout 150 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -n 15 | tee "$OUT/pytest_gpu.txt"
  timeout 200 python3 -c 'import sys; from moelab.cli import main; sys.argv[0]="moelab"; main()' kernels \
    --shape qwen3-30b-a3b --backends grouped,triton --tokens 1,16,64,256,1024,4096 --reps 20 2>&1 \
    | tee "$OUT/kernels.txt" | tail -n 30
  ;;
engine)
  for q in none fp8 nvfp4; do
    timeout 150 python3 bench/engine_throughput.py --preset small --device cuda --backend triton --quantization "$q" \
      --concurrency 1,32 --hf off 2>&1 | tee "$OUT/engine_$q.txt" | tail -n 8
  done
  timeout 120 python3 bench/preset_accuracy.py --device cuda --runners reference,triton --formats bf16,fp8,nvfp4 2>&1 \
    | tee "$OUT/accuracy.txt" | tail -n 12
  ;;
esac
