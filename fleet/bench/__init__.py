"""`fleet bench`: the measurements behind issue 6's targets, run through real fleet processes.

Each measurement drives fleet only through its command line (`fleet worker`, `fleet
enqueue`, `fleet run`) and reads only the store, so changes inside the worker show up in
the figures without touching this package. `suite.py` runs them and writes the table,
the JSON and the plots; BENCHMARKS.md explains what each figure means for a real job.
"""

from __future__ import annotations

#: Measurement name -> what it measures, in the order `fleet bench` runs them.
MEASUREMENTS = {
    "occupancy": "occupancy, K=1 vs default, and against K x C / S",
    "makespan": "makespan of a 6-worker job against its ideal",
    "projection": "the zero-overhead model at the reference job's shape",
    "scaling": "throughput of 1, 2, 4, 8 workers on one broker",
    "overhead": "per-chunk overhead with the S3 store; the worker's CPU per M tokens, and its profile",
    "producer": "producer prompts/s and peak memory",
    "hf": "fleet vs the bare HfEngine, pairs on a shared CPU, hf tiny model",
}
