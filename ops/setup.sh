#!/usr/bin/env bash
# Installs what fleet needs on a fresh Debian/Ubuntu machine: redis-server (for the local
# broker of `fleet run` and for the tests), a CPU build of torch, and fleet with its extras.
# Idempotent; run from the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v redis-server >/dev/null 2>&1; then
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq redis-server >/dev/null
fi
# torch first and pinned: without it pip resolves the hf extra to a multi-GB CUDA build.
python3 -m pip install -q --disable-pip-version-check "torch==2.13.0"
python3 -m pip install -q --disable-pip-version-check -e ".[hf,dev]"
