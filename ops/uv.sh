#!/usr/bin/env bash
# Shared by the install scripts (ops/setup.sh, ops/sglang-venv.sh, ops/vllm-venv.sh); source it.
#
# uv installs several times faster than pip (parallel downloads, a resolver in Rust), and is one
# static binary in a wheel on PyPI: pip brings it into the venv, then uv installs the rest into
# that venv's interpreter, never anywhere else. uv reads no pip configuration, so the indexes and
# wheel directories pip is configured with (a machine's mirror, a proxy, a directory of wheels)
# are handed to it, and it chooses among them as pip does: the best match over all of them.

UV_VERSION="0.13.8"

# uv_into VENV: uv into VENV; sets the array `uv` to `uv pip install` into VENV's interpreter.
# Bytecode is compiled at install, as pip does: every worker and test process imports torch and
# transformers, and without .pyc files (PYTHONDONTWRITEBYTECODE set, a read-only venv) each one
# would compile them again.
uv_into() {
  local venv="$1" line key value v
  local sources=()
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
  # pip's own view of its settings (files and PIP_* variables): key='value' lines
  while IFS= read -r line; do
    key="${line%%=*}"
    key="${key##*.}"
    value="${line#*=}"
    value="${value#\'}"
    value="${value%\'}"
    case "$key" in
      index-url) sources+=(--index-url "$value") ;;
      extra-index-url) for v in $value; do sources+=(--extra-index-url "$v"); done ;;
      find-links) for v in $value; do sources+=(--find-links "$v"); done ;;
    esac
  done < <("$venv/bin/python" -m pip config list 2>/dev/null)
  uv=("$venv/bin/uv" pip install --quiet --compile-bytecode --python "$venv/bin/python")
  if [ "${#sources[@]}" -gt 0 ]; then
    uv+=(--index-strategy unsafe-best-match "${sources[@]}")
  fi
}

# reachable URL: the index answers within 10 s (only PyPI may be reachable from CI).
reachable() {
  python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)" "$1/" >/dev/null 2>&1
}
