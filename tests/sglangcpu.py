"""The real sglang 0.5.23 on a CPU, for tests: the kwargs it needs, the environment every
process it starts needs, and a way to ask whether this interpreter has it.

The loader itself is tests/sglang_cpu/sitecustomize.py (see there why). These tests run in
the sglang virtualenv (ops/sglang-venv.sh, .ci/run); in the main one they skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from fleet.engines.sglang.spec import CPU_THREADS

ROOT = Path(__file__).resolve().parents[1]
LOADER_DIR = Path(__file__).parent / "sglang_cpu"
#: Everything SGLang needs to serve a dense model on a CPU without its CUDA kernels: torch-native
#: attention and sampling, no CUDA graphs, no overlap thread, no grammar backend, no warmup
#: request, and a bounded KV pool (unbounded it takes ~15 GB of host memory; 12,288 tokens hold the
#: five 1,800-token records and the short ones tests/test_sglang_real.py's hand-over runs at once).
CPU_KWARGS: dict[str, Any] = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "sampling_backend": "pytorch",
    "disable_cuda_graph": True,
    "disable_overlap_schedule": True,
    "grammar_backend": "none",
    "skip_server_warmup": True,
    "max_total_tokens": 12288,
}
#: fleet's settings for the same engine (dtype float32: the CPU has no fast bf16 path here)
CPU_SETTINGS_ENV = {
    "FLEET_SGLANG__MTP": "false",
    "FLEET_SGLANG__DTYPE": "float32",
    "FLEET_SGLANG__MEM_FRACTION_STATIC": "0.05",
    "FLEET_SGLANG__ENGINE_KWARGS": json.dumps(CPU_KWARGS),
}


def have_real_sglang() -> bool:
    """sglang and its kernel package are installed (the sglang venv), not the stand-in."""
    return importlib.util.find_spec("sglang") is not None and importlib.util.find_spec("sgl_kernel") is not None


#: the environment before any test built SGLang's ServerArgs in this process: that writes SGLANG_* variables
#: into os.environ (SGLANG_USE_CUDA_IPC_TRANSPORT among them), and a child that inherits them is not the engine
#: an operator starts
SESSION_ENV = dict(os.environ)


def process_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process that runs the real engine: the loader first on PYTHONPATH,
    then this checkout's fleet; no FLEET_* from the caller's shell, nothing an in-process engine set."""
    env = {k: v for k, v in SESSION_ENV.items() if not k.startswith("FLEET_")}
    env["PYTHONPATH"] = os.pathsep.join([str(LOADER_DIR), str(ROOT)])
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(extra or {})})
    return env


def run_bare(spec: dict[str, Any], out: Path, timeout: float = 1800) -> dict[str, Any]:
    """Run tests/sglang_cpu/bare_engine.py (a plain sglang.Engine, no fleet) in its own process:
    `Engine.shutdown()` kills every child of the calling process, the test's Redis included."""
    inp = out.with_suffix(".in.json")
    inp.write_text(json.dumps(spec))
    # the threads of fleet's CPU workers (an operator's OMP_NUM_THREADS, else SGLang's spec's): float32 sums
    # split another way may differ
    threads = SESSION_ENV.get("OMP_NUM_THREADS", str(CPU_THREADS))
    proc = subprocess.run(
        [sys.executable, str(LOADER_DIR / "bare_engine.py"), str(inp), str(out)],
        env=process_env({"OMP_NUM_THREADS": threads}), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())
