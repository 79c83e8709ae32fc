"""Test-side loader that lets the real sglang 0.5.23 run on a CPU (tests only).

Python imports `sitecustomize` at start from the first directory on sys.path that has it, so a
test puts this directory on PYTHONPATH and every process it starts (fleet's workers, SGLang's
scheduler and detokenizer, which are spawned) gets the same two changes:

- `SGLANG_USE_CPU_ENGINE=1`: SGLang accepts device="cpu" only with it (srt/utils/common.py).
- sgl_kernel's native-library load becomes a no-op. The PyPI `sglang-kernel` wheel is CUDA-only:
  loading it fails on libcuda.so.1. With an empty ops module `torch.ops.sgl_kernel` has no ops,
  SGLang's AMX/CPU-kernel detection is false and its layers take their `forward_native` paths.

Nothing else is touched: the engine, scheduler and model code are the real ones. One switch for the
abort test: with `SGLANG_TEST_ABORT_RID` set when the process starts, a request whose rid holds that
text is aborted by the scheduler after its first output, through SGLang's own AbortReq with an HTTP
status (the path its running and waiting timeouts take), so the test decides which request fails and
when, instead of a timeout that also fires on every slow request of a busy machine. Without it,
SGLang's own generate_request runs unwrapped.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

TARGET = "sgl_kernel.load_utils"
MANAGER = "sglang.srt.managers.tokenizer_manager"
ABORT_RID = "SGLANG_TEST_ABORT_RID"
ABORT_MESSAGE = "Request aborted by the test (SGLANG_TEST_ABORT_RID)."


def _no_native_ops() -> types.ModuleType:
    return types.ModuleType("common_ops")


def _no_cuda_preload() -> None:
    return None


def _abort_after_first_output(generate_request):  # noqa: ANN001, ANN202
    """TokenizerManager.generate_request, aborting the request whose rid holds SGLANG_TEST_ABORT_RID once
    its first output is out, as the scheduler's own timeouts abort one (HTTP 503)."""

    async def wrapped(self, obj, request=None):  # noqa: ANN001, ANN202
        part, rid = os.environ.get(ABORT_RID), getattr(obj, "rid", None)
        armed = bool(part) and isinstance(rid, str) and part in rid
        inner = generate_request(self, obj, request)
        try:
            async for out in inner:
                yield out
                if armed:
                    from sglang.srt.managers.io_struct import AbortReq

                    armed = False
                    self._dispatch_to_scheduler(AbortReq(rid=rid, abort_message=ABORT_MESSAGE, finished_reason={
                        "type": "abort", "status_code": 503, "message": ABORT_MESSAGE}))
        finally:  # closed with this one, as SGLang's own would be, not left to the loop's finalizer
            await inner.aclose()

    return wrapped


def _patch_kernel_loader(module: types.ModuleType) -> None:
    module._load_architecture_specific_ops = _no_native_ops
    module._preload_cuda_library = _no_cuda_preload


def _patch_tokenizer_manager(module: types.ModuleType) -> None:
    """Only in a process started with the switch set: elsewhere (the benchmarks) SGLang's own method runs."""
    if not os.environ.get(ABORT_RID):
        return
    manager = module.TokenizerManager
    manager.generate_request = _abort_after_first_output(manager.generate_request)


PATCHES = {TARGET: _patch_kernel_loader, MANAGER: _patch_tokenizer_manager}


class _Loader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader, patch) -> None:  # noqa: ANN001
        self.real, self.patch = real, patch

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return self.real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.real.exec_module(module)
        self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loaders of the patched modules only; every other import is left to the others."""

    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201
        if name not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, PATCHES[name])
                return spec
        return None


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
