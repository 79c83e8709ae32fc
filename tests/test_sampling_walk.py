"""The walk of a job's sampling from the CLI to the engine (docs/architecture.md, "Sampling"): a flag is a
setting, validated as its environment variable is; the job's sampling is resolved once, at enqueue, into the
manifest; a record's is resolved once, when its request is built; the engine sends it as it is."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import typer

from fleet.cli.app import settings_from
from fleet.engines.specs import build_engine, job_config
from fleet.records import InputRecord, Message, SamplingOverrides
from fleet.settings import Settings
from fleet.store.manifest import Manifest, config_hash
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.generate import requests_for
from tests.modelkit import LoopThread, loop_thread_fixture, tiny_model_fixture  # noqa: F401
from tests.test_engines_sglang import fake_sglang_fixture  # noqa: F401

pytestmark = pytest.mark.usefixtures("clean_env")


def manifest_of(config: dict) -> Manifest:
    return Manifest(job="walk", input="in.jsonl", chunk_size=2, chunks=1, records=2, samples=2, config=config,
                    config_hash=config_hash(config))


def record(pos: int, rid: str, **sampling) -> InputRecord:
    return InputRecord(pos=pos, line=pos + 1, id=rid, messages=[Message(role="user", content=f"Question {pos}?")],
                       sampling=SamplingOverrides(**sampling) if sampling else None)


def test_a_flags_max_tokens_reaches_the_engine_as_the_manifest_resolved_it(
        fake_sglang: ModuleType, tiny_model: Path, loop_thread: LoopThread, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given `--max-tokens 77` on the CLI, a temperature in the environment, and a model whose
    # generation_config.json sets top_k 20 and top_p 0.95
    monkeypatch.setenv("FLEET_SAMPLING__TEMPERATURE", "0.3")
    settings = settings_from(engine="sglang", model=str(tiny_model), max_tokens=77)
    # When the job is resolved at enqueue into its manifest
    manifest = manifest_of(job_config(settings))
    job = manifest.config["sampling"]
    # Then the manifest holds every value: the flag's, the environment's, the model's, the neutral rest
    assert (job["max_tokens"], job["temperature"], job["top_k"], job["top_p"]) == (77, 0.3, 20, 0.95)
    assert manifest.config["max_tokens_from"] == "job setting"

    # When a worker whose own settings sample otherwise builds the chunk's requests and runs them
    monkeypatch.delenv("FLEET_SAMPLING__TEMPERATURE")
    fast = {"mtp": False, "engine_kwargs": {"fake_step_s": 0}}
    worker = Settings(engine="sglang", model=str(tiny_model), sglang=fast)
    assert worker.sampling.temperature is None and worker.sampling.max_tokens is None
    run = ChunkRun(job="walk", index=0, attempt=1, worker="w", manifest=manifest,
                   records=[record(0, "a"), record(1, "b", max_tokens=5, top_k=3)])
    [(_, first), (_, second)] = requests_for(run)
    engine = build_engine(worker)
    loop_thread.run(engine.start())
    try:
        for request in (first, second):
            loop_thread.run(engine.generate(request))
    finally:
        loop_thread.run(engine.shutdown())

    # Then the engine sent the manifest's sampling, the record's overrides over it, and nothing of its own
    [fake] = fake_sglang.instances
    sent = [r["sampling_params"] for r in fake.requests]
    assert [s["max_new_tokens"] for s in sent] == [77, 5]
    assert [(s["temperature"], s["top_k"], s["top_p"]) for s in sent] == [(0.3, 20, 0.95), (0.3, 3, 0.95)]
    assert (first.sampling.max_tokens, second.sampling.max_tokens) == (77, 5)


def test_an_invalid_max_tokens_flag_is_refused_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as refused:
        settings_from(engine="sim", max_tokens=-5)
    assert refused.value.exit_code == 2
    assert "--max-tokens -5: Input should be greater than or equal to 1" in " ".join(capsys.readouterr().err.split())


def test_the_sim_and_a_model_engine_resolve_a_jobs_sampling_the_same_way(tiny_model) -> None:
    # Given one job's sampling settings (top_p set, the rest unset) for the sim and for the hf engine on a model
    # whose generation config sets nothing the job leaves unset but the samplers' own defaults
    flags = {"sampling": {"top_p": 0.9, "max_tokens": 64}}
    sim = job_config(Settings(engine="sim", **flags))["sampling"]
    hf = job_config(Settings(engine="hf", model=str(tiny_model), **flags))["sampling"]
    # Then both manifests hold every sampler set, unset ones off, by the one resolution
    samplers = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                "frequency_penalty")
    assert all(sim[k] is not None for k in samplers), sim
    assert sim["top_p"] == hf["top_p"] == 0.9 and sim["max_tokens"] == hf["max_tokens"] == 64
    assert set(sim) == set(hf)
