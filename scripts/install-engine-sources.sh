#!/usr/bin/env bash
# Install the Python source of SGLang and the libraries it dispatches to into a scratch venv,
# without their dependencies (no torch, no CUDA), so `moelab audit --python VENV/bin/python`
# and the audit tests read real engine source on a machine without a GPU. Nothing here is
# imported or run: the audit only parses the files.
#
#   sglang            0.5.23  (the version of engines/catalogues/sglang-0.5.23.json)
#   flashinfer-python 0.7.2   (what sglang 0.5.23 pins: flashinfer_python[cu13]==0.7.2)
#   sglang-kernel     0.4.10  (what sglang 0.5.23 pins; import name sgl_kernel). Its wheel is
#                     ~370 MB of CUDA binaries around ~0.6 MB of Python: only the .py files and
#                     the dist-info are kept. MOELAB_SKIP_SGL_KERNEL=1 leaves it out.
#
# Idempotent: a venv that already has all of them at these versions is left as it is.
# Prints one line per package, "name version", at the end.
set -euo pipefail
VENV="${MOELAB_ENGINE_SRC:-/tmp/moelab-engine-src}"
SGLANG="${MOELAB_SGLANG_VERSION:-0.5.23}"
FLASHINFER="${MOELAB_FLASHINFER_VERSION:-0.7.2}"
SGL_KERNEL="${MOELAB_SGL_KERNEL_VERSION:-0.4.10}"
PY="${PYTHON:-python3}"

version_of() {  # the installed version of a distribution in the venv, or nothing
    "$VENV/bin/python" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$1"
}

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps)

[ "$(version_of sglang)" = "$SGLANG" ] || "${PIP[@]}" "sglang==$SGLANG"
[ "$(version_of flashinfer-python)" = "$FLASHINFER" ] || "${PIP[@]}" "flashinfer-python==$FLASHINFER"

if [ "${MOELAB_SKIP_SGL_KERNEL:-0}" != "1" ] && [ "$(version_of sglang-kernel)" != "$SGL_KERNEL" ]; then
    TMP=$(mktemp -d)
    trap 'rm -rf "$TMP"' EXIT
    "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps -d "$TMP" "sglang-kernel==$SGL_KERNEL"
    SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # Only the Python side and the metadata: *.so, *.cubin and headers stay in the wheel.
    "$VENV/bin/python" - "$TMP"/sglang_kernel-*.whl "$SP" <<'EOF'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    keep = [n for n in z.namelist() if n.endswith(".py") and n.startswith("sgl_kernel/")
            or ".dist-info/" in n and not n.endswith("RECORD")]
    z.extractall(dest, keep)
    # without RECORD, importlib.metadata maps the import name to the distribution by this file
    info = next(n for n in keep if n.endswith(".dist-info/METADATA")).rpartition("/")[0]
    with open(f"{dest}/{info}/top_level.txt", "w") as f:
        f.write("sgl_kernel\n")
EOF
fi

for d in sglang flashinfer-python sglang-kernel; do
    v=$(version_of "$d")
    [ -n "$v" ] && echo "$d $v"
done
