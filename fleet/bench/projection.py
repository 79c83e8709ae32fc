"""The reference job itself, through the zero-overhead model: 902,087 prompts, 6 GPUs.

The measured runs are time-scaled: a job there lasts only a few times its longest
request, so the end-of-job tail weighs far more than in a 25-hour job. Every measured run
lands on the model fed with its own lengths (fleet's own cost is too small to see), so
the model at the reference job's true shape (S=256 slots, C=512, log-normal lengths with
mean 1,818 and sigma 0.8, the K that Settings derives) is the better estimate of what
that job gets from the schedule. A pure computation: no processes, a few seconds.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from fleet.bench.idealmodel import model_occupancy
from fleet.bench.occupancy import MAKESPAN_TARGET, OCCUPANCY_TARGET
from fleet.bench.profile import Profile
from fleet.bench.reference import REFERENCE
from fleet.bench.report import Figure, Section, at_least, at_most
from fleet.settings import Settings

REFERENCE_SLOTS = 256
REFERENCE_SIGMA = 0.8


def reference_lengths(prompts: int, chunk_size: int, mean: float, sigma: float, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    mu = math.log(mean) - sigma**2 / 2
    return [[max(1, round(rng.lognormvariate(mu, sigma))) for _ in range(min(chunk_size, prompts - start))]
            for start in range(0, prompts, chunk_size)]


def measure_projection(profile: Profile, workdir: Path) -> Section:
    ref = REFERENCE
    prompts = ref.prompts if profile.name == "full" else ref.prompts // 10
    default_k = Settings(engine="sglang", chunk_size=ref.chunk_size,
                         sglang={"max_running_requests": REFERENCE_SLOTS}).resolved_slots()
    lengths = reference_lengths(prompts, ref.chunk_size, ref.output_tokens, REFERENCE_SIGMA)
    ranked = [sorted(c, reverse=True) for c in lengths]
    ks = sorted({1, default_k, 2 * default_k})
    fifo = {k: model_occupancy(lengths, ref.gpus, REFERENCE_SLOTS, k) for k in ks}
    longest = {k: model_occupancy(ranked, ref.gpus, REFERENCE_SLOTS, k) for k in ks}
    figures = [Figure(f"occupancy, K={k} (K x C / S = {k * ref.chunk_size / REFERENCE_SLOTS:g})", round(fifo[k], 4),
                      note=f"longest-first in chunk {longest[k]:.3f}") for k in ks if k != default_k]
    figures.insert(1, at_least(f"occupancy, default K={default_k}", round(fifo[default_k], 4), OCCUPANCY_TARGET,
                               note=f"longest-first in chunk {longest[default_k]:.3f}"))
    figures.append(at_most(f"makespan / ideal, default K={default_k}", round(1 / fifo[default_k], 4), MAKESPAN_TARGET,
                           note="6 GPUs, FIFO (SGLang cannot predict lengths)"))
    data = {"prompts": prompts, "gpus": ref.gpus, "slots": REFERENCE_SLOTS, "chunk_size": ref.chunk_size,
            "mean_tokens": ref.output_tokens, "sigma": REFERENCE_SIGMA, "default_k": default_k,
            "fifo": {str(k): v for k, v in fifo.items()}, "longest_first": {str(k): v for k, v in longest.items()}}
    scale = "" if prompts == ref.prompts else f", {prompts:,} prompts"
    return Section("projection", f"model at the reference job's shape (S=256, C=512, 6 GPUs{scale})", figures, data)
