"""Generating a chunk (fleet.worker.run.generate): requests only for samples not yet checkpointed,
n samples with distinct seeds that a regenerated chunk asks for again, record sampling over
the job's defaults, and record errors kept apart from chunk failures."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from fleet.engines.sim.engine import SimEngine
from fleet.engines.specs import job_config
from fleet.errors import ConfigError
from fleet.records import InputRecord, OutputRecord, Sampling, derive_seed, record_sampling
from fleet.settings import Settings, SimSettings
from fleet.store.manifest import Manifest, config_hash
from fleet.worker.run.chunk import ChunkRun, sample_key
from fleet.worker.run.generate import generate_chunk, requests_for

pytestmark = pytest.mark.usefixtures("clean_env")


def manifest(**settings) -> Manifest:
    config = job_config(Settings(**settings))
    return Manifest(
        job="j",
        input="in.jsonl",
        chunk_size=8,
        chunks=1,
        records=3,
        samples=3,
        config=config,
        config_hash=config_hash(config),
    )


def rec(pos: int, rid: str, sampling: dict | None = None, prompt: str | None = "p") -> InputRecord:
    return InputRecord(
        pos=pos,
        line=pos + 1,
        id=rid,
        prompt=prompt,
        messages=None if prompt else [{"role": "user", "content": "q"}],
        sampling=sampling,
    )


def chunk_run(records: list[InputRecord], index: int = 4, **settings) -> ChunkRun:
    return ChunkRun(
        job="j",
        index=index,
        attempt=1,
        worker="gpu0@h",
        manifest=manifest(**settings),
        records=records,
    )


# -- derive_seed -------------------------------------------------------------------------


def test_derive_seed_is_pinned():
    # A regenerated chunk must ask for the same seeds as the first run, in any later release
    assert derive_seed(0, "a", 0) == 1474268390
    assert derive_seed(0, "a", 1) == 1978902801
    assert derive_seed(42, "rec-7", 3) == 1156825637


@pytest.mark.slow
def test_derive_seed_is_stable_across_processes():
    # Given another interpreter with another hash randomisation
    code = "from fleet.records import derive_seed as d; print(d(0,'a',0), d(42,'rec-7',3))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    # Then it derives the same seeds
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(derive_seed(0, "a", 0)), str(derive_seed(42, "rec-7", 3))]


def test_derive_seed_differs_by_job_seed_id_and_sample():
    seeds = {
        derive_seed(js, rid, s) for js in (0, 1) for rid in ("a", "b", "a\x000") for s in range(4)
    }
    assert len(seeds) == 24
    assert all(0 <= s < 2**31 for s in seeds)


# -- requests_for ------------------------------------------------------------------------


def test_one_request_per_sample_with_distinct_stable_seeds():
    # Given a job asking n = 3 samples per record
    records = [rec(0, "a"), rec(1, "b")]
    run = chunk_run(records, seed=9, sampling={"n": 3})
    # When requests are built
    reqs = requests_for(run)
    # Then each (record, sample) gets one request, in order, with derive_seed(job seed, id, sample)
    assert [(r.record_id, r.sample) for _, r in reqs] == [
        ("a", 0),
        ("a", 1),
        ("a", 2),
        ("b", 0),
        ("b", 1),
        ("b", 2),
    ]
    seeds = [r.sampling.seed for _, r in reqs]
    assert len(set(seeds)) == 6
    assert seeds[1] == derive_seed(9, "a", 1)
    # And building them again (a rerun) asks for the same seeds
    assert [
        r.sampling.seed for _, r in requests_for(chunk_run(records, seed=9, sampling={"n": 3}))
    ] == seeds
    assert all(r.chunk == 4 for _, r in reqs)


def test_record_n_overrides_job_n():
    run = chunk_run([rec(0, "a", {"n": 2}), rec(1, "b")], sampling={"n": 1})
    assert [(r.record_id, r.sample) for _, r in requests_for(run)] == [("a", 0), ("a", 1), ("b", 0)]


def test_record_seed_is_the_base_of_its_samples():
    run = chunk_run([rec(0, "a", {"seed": 100, "n": 3}), rec(1, "b", {"seed": 0})], seed=5)
    assert [r.sampling.seed for _, r in requests_for(run)] == [100, 101, 102, 0]


def test_checkpointed_samples_are_skipped():
    # Given a chunk resumed with a:0 and b:1 already in checkpoints
    run = chunk_run([rec(0, "a"), rec(1, "b"), rec(2, "c")], sampling={"n": 2})
    run.finished = {
        sample_key("a", 0): {"id": "a", "sample": 0},
        sample_key("b", 1): {"id": "b", "sample": 1},
    }
    # When requests are built
    reqs = requests_for(run)
    # Then only the missing samples are asked for, with the seeds a first run would use
    assert [(r.record_id, r.sample) for _, r in reqs] == [("a", 1), ("b", 0), ("c", 0), ("c", 1)]
    assert reqs[0][1].sampling.seed == derive_seed(0, "a", 1)


def test_a_fully_checkpointed_chunk_needs_no_request():
    run = chunk_run([rec(0, "a")])
    run.finished = {sample_key("a", 0): {}}
    assert requests_for(run) == []


def test_requests_carry_the_record_and_job_facts():
    m_rec, p_rec = rec(0, "m", prompt=None), rec(1, "p", prompt="raw text")
    run = chunk_run([m_rec, p_rec], enable_thinking=False, return_output_ids=True)
    (r0, q0), (r1, q1) = requests_for(run)
    assert (r0, r1) == (m_rec, p_rec)
    assert q0.messages == m_rec.messages and q0.prompt is None
    assert q1.prompt == "raw text" and q1.messages is None
    assert (q0.enable_thinking, q0.return_output_ids) == (False, True)


def test_job_sampling_reaches_the_request():
    run = chunk_run(
        [rec(0, "a")],
        sampling={
            "temperature": 0.6,
            "top_p": 0.9,
            "top_k": 20,
            "min_p": 0.05,
            "max_tokens": 77,
            "stop": ["</s>"],
        },
    )
    [(_, req)] = requests_for(run)
    assert req.sampling == Sampling(
        temperature=0.6,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        max_tokens=77,
        stop=("</s>",),
        seed=derive_seed(0, "a", 0),
    )


# -- record_sampling ------------------------------------------------------------------


DEFAULTS = {
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "min_p": 0.0,
    "max_tokens": 2048,
    "n": 1,
    "stop": ["<|im_end|>"],
}


def test_record_sampling_overrides_job_defaults():
    # Given a record overriding temperature, max_tokens and stop
    record = rec(0, "a", {"temperature": 0.0, "max_tokens": 16, "stop": "END"})
    # When the effective sampling is built
    s = record_sampling(DEFAULTS, record, seed=3)
    # Then its values win, the job's fill the rest, and stop is a tuple
    assert s == Sampling(
        temperature=0.0, top_p=0.95, top_k=20, min_p=0.0, max_tokens=16, stop=("END",), seed=3
    )


def test_no_record_sampling_means_job_defaults():
    s = record_sampling(DEFAULTS, rec(0, "a"), seed=1)
    assert s == Sampling(
        temperature=0.6,
        top_p=0.95,
        top_k=20,
        min_p=0.0,
        max_tokens=2048,
        stop=("<|im_end|>",),
        seed=1,
    )


def test_a_sampler_the_job_leaves_unset_is_off():
    # Given a job's sampling that sets only max_tokens (the sim engine's: it samples nothing), and a record's top_k
    s = record_sampling({"max_tokens": 10}, rec(0, "a", {"top_k": 5}), seed=0)
    # Then the request's sampling is final: the record's top_k, every other sampler off, no stop
    assert s == Sampling(top_k=5, max_tokens=10, seed=0)
    assert (s.temperature, s.top_p, s.min_p, s.repetition_penalty, s.stop) == (1.0, 1.0, 0.0, 1.0, None)


def test_a_manifest_written_before_the_penalties_samples_without_them():
    # Given a job sampling as manifests held it before the penalties existed (the engines then sent none)
    old = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "max_tokens": 64, "n": 1, "stop": None}
    # When a record's request is built from it
    s = record_sampling(old, rec(0, "a"), seed=3)
    # Then the penalties are off, and the rest is the job's
    assert (s.repetition_penalty, s.presence_penalty, s.frequency_penalty) == (1.0, 0.0, 0.0)
    assert (s.temperature, s.top_k, s.max_tokens) == (0.6, 20, 64)


def test_a_manifest_without_max_tokens_is_refused_naming_the_field():
    # Given a chunk run whose manifest's sampling holds no max_tokens (one fleet did not write)
    run = chunk_run([rec(0, "a")])
    del run.manifest.config["sampling"]["max_tokens"]
    # Then no request is built: the error names the field
    with pytest.raises(ConfigError, match="sampling.max_tokens"):
        requests_for(run)


# -- generate_chunk ----------------------------------------------------------------------


def generate(run: ChunkRun, cfg: SimSettings) -> None:
    async def main() -> None:
        engine = SimEngine(cfg)
        await engine.start()
        await generate_chunk(run, engine)

    asyncio.run(main())


def test_generate_chunk_fills_every_missing_sample():
    # Given a resumed chunk of 3 records x 2 samples with one sample checkpointed
    run = chunk_run([rec(0, "a"), rec(1, "b"), rec(2, "c", prompt=None)], sampling={"n": 2})
    kept = {"id": "a", "sample": 0, "marker": "from checkpoint"}
    run.finished = {sample_key("a", 0): kept}
    # When the chunk is generated on the sim engine
    generate(run, SimSettings(step_s=0))
    # Then all 6 samples are finished, the checkpointed one untouched, 5 of them fresh
    assert len(run.finished) == run.expected() == 6
    assert run.finished[sample_key("a", 0)] is kept
    fresh = run.take_fresh()
    assert sorted((o["id"], o["sample"]) for o in fresh) == [
        ("a", 1),
        ("b", 0),
        ("b", 1),
        ("c", 0),
        ("c", 1),
    ]
    # And each is a valid output record with its input position and run facts
    for o in fresh:
        OutputRecord.model_validate(o)
        assert o["pos"] == {"a": 0, "b": 1, "c": 2}[o["id"]]
        assert (o["chunk"], o["worker"], o["finish_reason"]) == (4, "gpu0@h", "stop")
        assert o["model"] == "sim-m256-s0.8" and o["latency_s"] is not None


def test_generated_outputs_repeat_on_a_rerun():
    outs = []
    for _ in range(2):
        run = chunk_run([rec(0, "a"), rec(1, "b")], seed=3, sampling={"n": 2})
        generate(run, SimSettings(step_s=0))
        outs.append({k: (v["output"], v["completion_tokens"]) for k, v in run.finished.items()})
    assert outs[0] == outs[1]


def test_a_failing_record_becomes_an_error_record_and_the_chunk_goes_on():
    run = chunk_run([rec(0, "a"), rec(1, "bad"), rec(2, "c")])
    generate(run, SimSettings(step_s=0, fail_ids=["bad"]))
    assert len(run.finished) == 3
    bad = run.finished[sample_key("bad", 0)]
    assert (bad["finish_reason"], bad["completion_tokens"], bad["output"]) == ("error", 0, "")
    assert "bad" in bad["error"]
    assert run.finished[sample_key("c", 0)]["finish_reason"] == "stop"


def test_an_engine_failure_fails_the_whole_attempt():
    run = chunk_run([rec(0, "a"), rec(1, "b")], index=2)
    with pytest.raises(RuntimeError):
        generate(run, SimSettings(step_s=0, fault_chunks=[2]))
    assert run.finished == {}
