#!/usr/bin/env bash
# Installs what fleet needs on a fresh Debian/Ubuntu machine into a project virtualenv
# (.venv), never into the system interpreter (PEP 668): redis-server (for the local broker
# of `fleet run` and the tests), a CPU build of torch, and fleet with its extras.
# Idempotent; run from the repository root. FLEET_VENV overrides the venv path.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
venv="${FLEET_VENV:-.venv}"

if ! command -v redis-server >/dev/null 2>&1; then
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq redis-server >/dev/null
fi
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
# torch first and pinned: without it pip resolves the hf extra to a multi-GB CUDA build.
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" -e ".[hf,dev]"
