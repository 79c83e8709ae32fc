"""Throughput, wall time and cost of a job on a fleet, next to the physical limit.

The estimate is plain arithmetic on a measured (or guessed) per-GPU rate. The roofline
says how fast decode could possibly go: each decode step streams the weights once,
whatever the batch, plus every running request's KV cache (and recurrent state, for
hybrid models), so at batch B a GPU makes at most B x accepted-tokens-per-step tokens
per (bytes read / memory bandwidth) seconds, and never more than its BF16 FLOP/s allow.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from fleet.errors import ConfigError
from fleet.model.capacity import kv_bytes_per_token, text_config
from fleet.model.capacity import state_bytes_per_slot as recurrent_state_bytes
from fleet.model.capacity import weight_bytes as estimated_weight_bytes
from fleet.model.gpus import GpuSpec, gpu_spec

DEFAULT_BYTES_PER_PARAM = 2.0  # BF16
DEFAULT_BATCH = 256
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class ModelFacts:
    """What the roofline needs to know about the model and how it is served."""

    params_b: float  #: parameters read per decode step, billions
    bytes_per_param: float = DEFAULT_BYTES_PER_PARAM
    batch: int = DEFAULT_BATCH  #: running requests per worker (per GPU where a worker has one)
    kv_bytes_per_token: float = 0.0  #: KV cache bytes per token of context (all layers)
    context_tokens: float | None = None  #: mean KV length while decoding; default prompt + output/2
    state_bytes_per_request: float = 0.0  #: recurrent (linear-attention) state per request
    accept_length: float = 1.0  #: tokens committed per decode step (speculative decoding)
    gpus_per_worker: int = 1  #: GPUs one engine spans (tensor parallel): each reads its share of every step


@dataclass(frozen=True)
class Roofline:
    """Per-GPU upper bound on decode tok/s (bytes and memory: one GPU's)."""

    weight_bytes: float
    kv_bytes_per_step: float
    bytes_per_step: float
    step_ms: float
    memory_tok_s: float  #: bandwidth bound
    compute_tok_s: float  #: BF16 FLOP/s bound, 2 FLOPs per parameter per token
    tok_s: float  #: the lower of the two
    bound: str  #: "memory" or "compute"
    memory_needed_gb: float  #: weights + KV + state at this batch
    fits: bool  #: memory_needed_gb <= the GPU's HBM


@dataclass(frozen=True)
class Plan:
    gpus: int
    gpu: str
    #: GPUs each worker spans (its engine's tensor parallelism); gpus / gpus_per_worker workers
    gpus_per_worker: int
    usd_per_gpu_hour: float
    prompts: int
    prompt_tokens: float
    output_tokens: float
    tok_s_per_gpu: float
    basis: str  #: "estimate" (given per-GPU rate) or "roofline" (none given)
    fleet_tok_s: float
    usd_per_hour: float
    total_prompt_tokens: float
    total_output_tokens: float
    wall_s: float
    wall_hours: float
    cost_usd: float
    usd_per_m_output_tokens: float
    roofline: Roofline | None
    estimate_vs_roofline: float | None  #: tok_s_per_gpu / roofline tok/s
    capacity: dict[str, Any] | None = None  #: fleet.model.capacity.Capacity: SGLang's real batch
    shape: str = "given"  #: where prompts and token figures came from (JobShape.source)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def roofline(spec: GpuSpec, model: ModelFacts, prompt_tokens: float, output_tokens: float) -> Roofline:
    if model.params_b <= 0 or model.batch < 1 or model.accept_length <= 0:
        raise ConfigError("roofline needs params > 0, batch >= 1 and accept length > 0")
    context = model.context_tokens if model.context_tokens is not None else prompt_tokens + output_tokens / 2
    # A worker spanning n GPUs: each holds and reads 1/n of the weights and of every request's KV and state,
    # in parallel (their all-reduces are left out), and the worker's batch is shared by its n GPUs.
    n = model.gpus_per_worker
    weight_bytes = model.params_b * 1e9 * model.bytes_per_param / n
    per_request = (model.kv_bytes_per_token * context + model.state_bytes_per_request) / n
    kv_bytes = model.batch * per_request
    step_bytes = weight_bytes + kv_bytes
    step_s = step_bytes / (spec.hbm_tb_s * 1e12)
    memory_tok_s = model.batch * model.accept_length / step_s / n
    compute_tok_s = spec.bf16_tflops * 1e12 / (2 * model.params_b * 1e9)
    # Memory is sized for the longest context, not the mean one the bandwidth sees.
    peak_context = model.context_tokens if model.context_tokens is not None else prompt_tokens + output_tokens
    peak_bytes = weight_bytes + model.batch * (model.kv_bytes_per_token * peak_context
                                               + model.state_bytes_per_request) / n
    return Roofline(
        weight_bytes=weight_bytes,
        kv_bytes_per_step=kv_bytes,
        bytes_per_step=step_bytes,
        step_ms=step_s * 1e3,
        memory_tok_s=memory_tok_s,
        compute_tok_s=compute_tok_s,
        tok_s=min(memory_tok_s, compute_tok_s),
        bound="memory" if memory_tok_s <= compute_tok_s else "compute",
        memory_needed_gb=peak_bytes / 1e9,
        fits=peak_bytes / 1e9 <= spec.hbm_gb,
    )


def make_plan(
    *,
    gpus: int,
    gpu: str,
    usd_per_gpu_hour: float,
    prompts: int,
    output_tokens: float,
    prompt_tokens: float = 0.0,
    tok_s_per_gpu: float | None = None,
    model: ModelFacts | None = None,
    capacity: dict[str, Any] | None = None,
    gpus_per_worker: int = 1,
) -> Plan:
    """The plan for `prompts` prompts on `gpus` GPUs of kind `gpu`.

    Without a per-GPU rate the roofline stands in for it (and the result is a best case).
    """
    if gpus < 1 or prompts < 0 or output_tokens <= 0 or usd_per_gpu_hour < 0:
        raise ConfigError("plan needs gpus >= 1, prompts >= 0, output tokens > 0, price >= 0")
    if gpus_per_worker < 1 or gpus % gpus_per_worker:
        raise ConfigError(f"--gpus-per-worker {gpus_per_worker} does not divide --gpus {gpus}")
    if model is not None:
        model = replace(model, gpus_per_worker=gpus_per_worker)
    spec = gpu_spec(gpu)
    roof = roofline(spec, model, prompt_tokens, output_tokens) if model else None
    basis = "estimate"
    if tok_s_per_gpu is None:
        if roof is None:
            raise ConfigError("give --tok-s-per-gpu (e.g. from `fleet bench`) or --params-b for a roofline")
        tok_s_per_gpu, basis = roof.tok_s, "roofline"
    if tok_s_per_gpu <= 0:
        raise ConfigError("--tok-s-per-gpu must be > 0")
    fleet_tok_s = gpus * tok_s_per_gpu
    total_out = prompts * output_tokens
    wall_s = total_out / fleet_tok_s
    usd_per_hour = gpus * usd_per_gpu_hour
    cost = wall_s / SECONDS_PER_HOUR * usd_per_hour
    return Plan(
        gpus=gpus,
        gpu=gpu.strip().lower(),
        gpus_per_worker=gpus_per_worker,
        usd_per_gpu_hour=usd_per_gpu_hour,
        prompts=prompts,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        tok_s_per_gpu=tok_s_per_gpu,
        basis=basis,
        fleet_tok_s=fleet_tok_s,
        usd_per_hour=usd_per_hour,
        total_prompt_tokens=prompts * prompt_tokens,
        total_output_tokens=total_out,
        wall_s=wall_s,
        wall_hours=wall_s / SECONDS_PER_HOUR,
        cost_usd=cost,
        usd_per_m_output_tokens=cost / (total_out / 1e6) if total_out else 0.0,
        roofline=roof,
        estimate_vs_roofline=tok_s_per_gpu / roof.tok_s if roof else None,
        capacity=capacity,
    )


# -- the job's shape when the figures are not given ------------------------------------------


@dataclass(frozen=True)
class JobShape:
    prompts: int
    prompt_tokens: float
    output_tokens: float
    source: str  #: "given", "reference job", or the job and what was measured of it


def reference_shape(prompts: int, prompt_tokens: float, output_tokens: float) -> JobShape:
    """The reference job's shape (fleet.bench.reference, passed in by the CLI)."""
    return JobShape(prompts, prompt_tokens, output_tokens,
                    f"reference job ({prompts:,} prompts of {prompt_tokens:,.0f} + {output_tokens:,.0f} tokens)")


def job_shape(status: Any, ref: JobShape) -> JobShape:
    """A job's samples, and its mean prompt and output tokens over the chunks done so far;
    the reference job's token figures while none is done (fleet.monitor.status.JobStatus)."""
    done = status.samples_done
    if not done or not status.completion_tokens:
        return JobShape(status.samples_total, ref.prompt_tokens, ref.output_tokens,
                        f"job {status.job!r} ({status.samples_total:,} samples; no chunk done yet, "
                        f"token figures of the {ref.source})")  # fmt: skip
    return JobShape(status.samples_total, status.prompt_tokens / done, status.completion_tokens / done,
                    f"job {status.job!r} ({status.samples_total:,} samples; tokens measured over {done:,})")


def fill_shape(base: JobShape, prompts: int | None, prompt_tokens: float | None,
               output_tokens: float | None) -> JobShape:
    """Given figures win; the rest come from `base`, and the source says so."""
    given = [v is not None for v in (prompts, prompt_tokens, output_tokens)]
    if all(given):
        return JobShape(prompts, prompt_tokens, output_tokens, "given")  # type: ignore[arg-type]
    source = base.source if not any(given) else f"given, the rest from the {base.source}"
    return JobShape(
        base.prompts if prompts is None else prompts,
        base.prompt_tokens if prompt_tokens is None else prompt_tokens,
        base.output_tokens if output_tokens is None else output_tokens,
        source,
    )


# -- model facts from a model directory ----------------------------------------------------


def weight_bytes_in(model_dir: Path) -> float:
    """Bytes of weights on disk: the safetensors index's total, else the files' sizes."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        if total:
            return float(total)
    files = list(model_dir.glob("*.safetensors")) or list(model_dir.glob("pytorch_model*.bin"))
    return float(sum(f.stat().st_size for f in files))


def model_facts_from_dir(model_dir: str | Path, **overrides: Any) -> ModelFacts:
    """ModelFacts read from a local model directory; `overrides` win (None is ignored).

    Weight bytes become params_b at the given bytes_per_param, so a quantised checkpoint
    is counted by what it really streams.
    """
    path = Path(model_dir).expanduser()
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"{path} has no config.json")
    config = json.loads(cfg_file.read_text())
    bpp = overrides.get("bytes_per_param") or DEFAULT_BYTES_PER_PARAM
    facts: dict[str, Any] = {
        "bytes_per_param": bpp,
        "kv_bytes_per_token": kv_bytes_per_token(config),
        "state_bytes_per_request": recurrent_state_bytes(config),
    }
    weights = weight_bytes_in(path)
    if not weights and text_config(config).get("hidden_size"):
        weights = estimated_weight_bytes(config)  # config.json alone: count the parameters
    if weights:
        facts["params_b"] = weights / bpp / 1e9
    facts.update({k: v for k, v in overrides.items() if v is not None})
    if "params_b" not in facts:
        raise ConfigError(f"{path} has no weight files; give --params-b")
    return ModelFacts(**facts)
