"""Test-side loader that lets the real sglang 0.5.23 run on a CPU (tests only).

Python imports `sitecustomize` at start from the first directory on sys.path that has it, so a
test puts this directory on PYTHONPATH and every process it starts (fleet's workers, SGLang's
scheduler and detokenizer, which are spawned) gets the same two changes:

- `SGLANG_USE_CPU_ENGINE=1`: SGLang accepts device="cpu" only with it (srt/utils/common.py).
- sgl_kernel's native-library load becomes a no-op. The PyPI `sglang-kernel` wheel is CUDA-only:
  loading it fails on libcuda.so.1. With an empty ops module `torch.ops.sgl_kernel` has no ops,
  SGLang's AMX/CPU-kernel detection is false and its layers take their `forward_native` paths.

Nothing else is touched: the engine, scheduler and model code are the real ones.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

TARGET = "sgl_kernel.load_utils"


def _no_native_ops() -> types.ModuleType:
    return types.ModuleType("common_ops")


def _no_cuda_preload() -> None:
    return None


class _Loader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader) -> None:
        self.real = real

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return self.real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.real.exec_module(module)
        module._load_architecture_specific_ops = _no_native_ops
        module._preload_cuda_library = _no_cuda_preload


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of sgl_kernel.load_utils only; every other import is left to the others."""

    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201
        if name != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
