"""Sizes of every measurement: FULL fits a 2-core machine in under 10 minutes, QUICK in ~1.

The sim engine models a B200-class GPU scaled down in slots and in time: what decides
occupancy is the shape (slots S, chunk size C, chunks in flight K, the spread of output
lengths), not the absolute step time, so the steps are short enough for a job of 100+
chunks to finish in seconds yet long enough that the sim's own Python cost stays small
next to the simulated work on two shared cores.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.bench.simjob import SimShape

#: S=64 slots, C=128: the reference deployment's C/S = 512/256, at a quarter of the size.
OCCUPANCY_SHAPE = SimShape(max_running=64, chunk_size=128, mean_output_tokens=200, sigma=0.8, step_s=0.0005)
#: Six workers on two cores: a slower step halves the sim's request rate per second.
MAKESPAN_SHAPE = SimShape(max_running=64, chunk_size=128, mean_output_tokens=200, sigma=0.8, step_s=0.001)
#: Eight workers on two cores: slower still, so eight sims together use under half a core.
SCALING_SHAPE = SimShape(max_running=64, chunk_size=128, mean_output_tokens=200, sigma=0.8, step_s=0.002)


@dataclass(frozen=True)
class Profile:
    name: str
    occupancy_shape: SimShape = OCCUPANCY_SHAPE
    occupancy_workers: int = 2
    occupancy_chunks: int = 128
    #: K values of the occupancy-against-KC/S sweep (1 and the default are always added)
    ks: tuple[int, ...] = (1, 2, 4, 8)
    makespan_shape: SimShape = MAKESPAN_SHAPE
    makespan_workers: int = 6
    makespan_chunks: int = 240
    scaling_shape: SimShape = SCALING_SHAPE
    scaling_workers: tuple[int, ...] = (1, 2, 4, 8)
    scaling_chunks_per_worker: int = 12
    overhead_chunks: int = 150
    overhead_chunk_size: int = 512
    #: worker CPU per M tokens (fleet.bench.workercpu): S values at one offered token rate
    cpu_slots: tuple[int, ...] = (64, 256, 1024)
    cpu_token_rate: float = 40_000
    cpu_mean_tokens: float = 200
    cpu_chunk_size: int = 512
    #: records per job: at least this, and at least cpu_waves x S
    cpu_records: int = 5_000
    cpu_waves: int = 12
    #: S of the profiled run (fleet.bench.workerprof); 0: no profile
    cpu_profile_slots: int = 256
    producer_sizes: tuple[int, ...] = (100_000, 1_000_000)
    producer_s3_sizes: tuple[int, ...] = (100_000,)
    producer_chunk_size: int = 512
    hf_prompts: int = 384
    hf_max_tokens: int = 96
    hf_batch: int = 16
    hf_chunk_size: int = 64
    #: fleet/bare pairs (fleet.bench.pairs: at once on a shared CPU where it can); the median ratio is the figure
    hf_repeats: int = 3
    #: a bare probe grows the prompts until a side's window lasts this long (0: no probe)
    hf_min_window_s: float = 30.0
    #: one more job with the hf worker under fleet.bench.workerprof: where its CPU goes
    hf_profile: bool = True


FULL = Profile(name="full")

QUICK = Profile(
    name="quick",
    occupancy_shape=SimShape(max_running=16, chunk_size=32, mean_output_tokens=100, sigma=0.8, step_s=0.0005),
    occupancy_workers=1,
    occupancy_chunks=16,
    ks=(1,),
    makespan_shape=SimShape(max_running=16, chunk_size=32, mean_output_tokens=100, sigma=0.8, step_s=0.001),
    makespan_workers=2,
    makespan_chunks=24,
    scaling_shape=SimShape(max_running=16, chunk_size=32, mean_output_tokens=100, sigma=0.8, step_s=0.001),
    scaling_workers=(1, 2),
    scaling_chunks_per_worker=6,
    overhead_chunks=12,
    overhead_chunk_size=64,
    cpu_slots=(16,),
    cpu_token_rate=10_000,
    cpu_mean_tokens=50,
    cpu_chunk_size=64,
    cpu_records=256,
    cpu_waves=4,
    cpu_profile_slots=0,  # one more worker start; the sampler is tested in-process (tests/test_bench.py)
    producer_sizes=(5_000, 20_000),
    producer_s3_sizes=(5_000,),
    producer_chunk_size=512,
    hf_prompts=32,
    hf_max_tokens=16,
    hf_batch=8,
    hf_chunk_size=16,
    hf_repeats=1,
    hf_min_window_s=0.0,
    hf_profile=False,  # the sampler is tested in-process (tests/test_bench.py)
)

PROFILES = {"full": FULL, "quick": QUICK}
