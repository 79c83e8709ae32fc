"""What fleet asks of the sglang engine: identity, capacity plan, engine kwargs and their check."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any
from unittest import mock

from fleet.engines.base import Engine
from fleet.engines.modelspec import ModelEngineSpec
from fleet.model.gpus import query_gpus
from fleet.settings import Settings

#: sglang settings (and engine_kwargs keys) that change throughput and memory, not tokens. Tensor parallelism
#: changes the order of reductions as the batch's composition does, which no identity holds either: hosts
#: whose workers span other GPU counts share a job (`fleet worker --gpus-per-worker`)
SGLANG_SPEED_ONLY = frozenset({
    "tp_size",
    "max_running_requests", "mem_fraction_static", "chunked_prefill_size",
    "enable_hierarchical_cache", "hicache_ratio", "hicache_size", "hicache_write_policy",
    "log_level", "cuda_graph_max_bs", "disable_cuda_graph", "enable_metrics", "watchdog_timeout",
    "engine_kwargs", "radix_cache", "shared_prefixes", "mamba_full_memory_ratio", "context_tokens",
})
#: Torch threads of a CPU worker's SGLang scheduler (SGLang on a CPU is for tests and demos: it needs a GPU
#: for a job). A small model's decode steps are too short to split across cores, and on x86 without AMX
#: SGLang binds no thread to a core, so a second thread only waits on a core that the worker, the tokenizer
#: manager or anything else on the host holds: a job through one CPU worker took 99 s with one thread and
#: 537 s with two beside a one-core hog (69-73 s either way on a quiet host).
CPU_THREADS = 1


class SglangSpec(ModelEngineSpec):
    name = "sglang"
    tensor_parallel = "tp_size"
    needs_gpu = True

    def cpu_threads(self, settings: Settings) -> int | None:
        return CPU_THREADS

    def build(self, settings: Settings) -> Engine:
        from fleet.engines.sglang.engine import SglangEngine

        return SglangEngine(settings)

    def shaping(self, settings: Settings) -> dict[str, Any]:
        shaped = {k: v for k, v in settings.sglang.model_dump().items() if k not in SGLANG_SPEED_ONLY}
        if not settings.sglang.mtp:
            shaped = {k: v for k, v in shaped.items() if not k.startswith("speculative_")}
        shaped["engine_kwargs"] = {
            k: v for k, v in settings.sglang.engine_kwargs.items() if k not in SGLANG_SPEED_ONLY
        }
        return shaped

    def planned(self, settings: Settings, gpu: str | None = None) -> Settings:
        from fleet.engines.sglang.plan import with_planned_running

        return with_planned_running(settings, gpu)

    def job_capacity(self, settings: Settings, gpu: str, context_tokens: float, **choices: Any) -> Any:
        from fleet.engines.sglang.plan import job_capacity

        return job_capacity(settings, gpu, context_tokens, **choices)

    def engine_args(self, settings: Settings, gpu: str | None = None) -> dict[str, Any]:
        from fleet.engines.sglang.engine import engine_kwargs

        return engine_kwargs(settings, gpu)

    def validate_args(self, settings: Settings) -> str:
        kwargs = self.engine_args(settings)
        try:
            from sglang.srt.server_args import ServerArgs
        except ImportError:
            return f"{len(kwargs)} kwargs built; sglang not installed, not validated"
        try:
            validate_server_args(ServerArgs, kwargs)
        except Exception as e:
            raise ValueError(f"sglang ServerArgs refused them: {type(e).__name__}: {e}") from e
        return f"{len(kwargs)} kwargs accepted by sglang ServerArgs"


def validate_server_args(server_args_cls: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """SGLang's own checks (docs/architecture.md: ServerArgs, resolve_once, check_server_args); on a
    host without a GPU they run with device="cpu", which validates in seconds. Resolving writes
    SGLANG_* variables into os.environ; they are put back, so that a check leaves no trace in a
    process that may start an engine later (a preset SGLANG_USE_CUDA_IPC_TRANSPORT takes SGLang's
    deprecated path)."""
    args = dict(kwargs)
    if "device" not in args and not query_gpus()[0]:
        args["device"] = "cpu"
    with mock.patch.dict(os.environ):
        server_args = server_args_cls(**args)
        for step in ("resolve_once", "check_server_args"):
            fn = getattr(server_args, step, None)
            if callable(fn):
                fn()


SPEC = SglangSpec()
