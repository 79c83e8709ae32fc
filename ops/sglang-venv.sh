#!/usr/bin/env bash
# Create the heavy virtualenv with sglang==0.5.23 (CUDA torch, kernels: several GB).
#
# It is what the GPU hosts run, and where the SGLang contract test runs on a CPU:
#   ops/sglang-venv.sh [VENV_DIR]          # default: .venv-sglang in the repo root (CI: ~/.cache/fleet/sglang-venv)
#   PYTHONPATH=. VENV_DIR/bin/python -m pytest tests/test_engines_sglang.py -q -k real_sglang
# It writes nothing outside VENV_DIR (fleet itself is not installed there: PYTHONPATH carries it).
# .ci/run builds it (outside the checkout) and runs the contract tests with it.
set -euo pipefail

SGLANG_VERSION="0.5.23"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/.venv-sglang}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python="python3"

# Nothing outside the venv: uv's cache lives in it while it is built, then goes (the venv itself
# is what CI caches); pip, which only brings uv, keeps none.
export PIP_NO_CACHE_DIR=1 UV_CACHE_DIR="$venv/.uv-cache"
echo "creating $venv with $("$python" --version) and sglang==$SGLANG_VERSION" >&2
"$python" -m venv "$venv"
# pip brings uv into the venv; uv installs the rest (ops/uv.sh)
# shellcheck source=ops/uv.sh
source "$root/ops/uv.sh"
uv_into "$venv"
# sglang first, so its exact pins (torch, transformers, kernels) win; fleet's ranges accept them.
"${uv[@]}" "sglang==$SGLANG_VERSION"
# fleet's own dependencies, read from pyproject.toml, but never fleet itself: installing the
# checkout (even non-editable) writes fleet.egg-info and build/ into it. Tests run the
# checkout's fleet through PYTHONPATH.
mapfile -t deps < <("$venv/bin/python" - "$root/pyproject.toml" <<'PY'
import sys
import tomllib

project = tomllib.load(open(sys.argv[1], "rb"))["project"]
for dep in project["dependencies"] + [d for extra in ("hf", "dev") for d in project["optional-dependencies"][extra]]:
    print(dep)
PY
)
"${uv[@]}" "${deps[@]}"
rm -rf "$UV_CACHE_DIR"

"$venv/bin/python" - <<'PY'
import sglang
import torch
import transformers
from sglang.srt.server_args import ServerArgs  # noqa: F401  (what the contract test needs)

print(f"sglang {sglang.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
print(f"CUDA available: {torch.cuda.is_available()}")
PY
echo "contract test: PYTHONPATH=$root $venv/bin/python -m pytest $root/tests/test_engines_sglang.py -q -k real_sglang" >&2
