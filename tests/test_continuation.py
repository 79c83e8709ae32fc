"""Continuation: a sample interrupted mid-generation goes on from its checkpointed ids, and ends
as it would have in one go (docs/architecture.md, "Tokens as they are made")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fleet.engines.sim.engine import SimEngine
from fleet.records import GenRequest, Message, Sampling
from fleet.settings import SimSettings, load_settings
from fleet.store.checkpoints import (
    IdsDigest,
    Segment,
    decode_checkpoint,
    encode_checkpoint,
    longest_prefixes,
    read_checkpoint,
)
from tests.modelkit import tiny_model_fixture, tiny_sampling  # noqa: F401


def sim_request(prefix: list[int] | None = None, max_tokens: int = 10_000) -> GenRequest:
    return GenRequest(record_id="r1", chunk=0, sample=0, sampling=Sampling(max_tokens=max_tokens, seed=7),
                      prompt="hello", return_output_ids=True, prefix_ids=list(prefix or []), request_id="r1/x")


async def collect(engine, request: GenRequest):
    deltas = [d async for d in engine.stream(request)]
    return deltas, deltas[-1].result


def test_sim_continued_from_any_prefix_ends_as_one_run():
    # Given the sim engine and one sample generated in one go
    async def go():
        engine = SimEngine(SimSettings(mean_output_tokens=60, sigma=0.1, stream_interval=7, step_s=0))
        await engine.start()
        deltas, whole = await collect(engine, sim_request())
        # When it is continued from prefixes of every length
        for cut in (1, 7, 20, len(whole.output_ids) - 1):
            more, result = await collect(engine, sim_request(whole.output_ids[:cut]))
            # Then the deltas hold only what follows the prefix, and the result is the whole sample
            assert [i for d in more for i in d.ids] == whole.output_ids[cut:]
            assert (result.output_ids, result.text, result.completion_tokens, result.finish_reason) == \
                (whole.output_ids, whole.text, whole.completion_tokens, whole.finish_reason)
        streamed = [i for d in deltas for i in d.ids]
        assert streamed == whole.output_ids and len(deltas) > 2
    asyncio.run(go())


def segments_of(ids: list[int], cuts: list[int], record: str = "r", continued: list[int] | None = None):
    out, start = [], 0
    for cut in [*cuts, len(ids)]:
        out.append(Segment(record, 0, start, IdsDigest(ids[:start]).hexdigest(), ids[start:cut], continued or []))
        start = cut
    return out


def test_the_longest_valid_chain_wins_never_the_oldest():
    ids = list(range(100, 160))
    # Given a first run's segments up to 30, and a second run that continued at 20 and got to 60
    first = segments_of(ids[:30], [10, 20])
    second = segments_of(ids, [20, 40])[1:]  # it continues from the first run's 20 ids
    other = [Segment("r", 0, 30, "not-a-prefix", [1, 2, 3])]  # follows nothing we hold
    fork = [Segment("r", 0, 20, IdsDigest(ids[:20]).hexdigest(), [7] * 5)]  # another copy after 20, shorter
    # When they are read back in any order
    found = longest_prefixes(list(reversed(first + second + other + fork)))
    # Then the sample's prefix is the longest valid chain
    assert found[("r", 0, 0)].ids == ids
    # And a chain missing its first piece is nothing
    assert longest_prefixes(second) == {}


def test_checkpoints_hold_rows_and_segments_and_old_readers_skip_them():
    seg = segments_of(list(range(9)), [4], continued=[4])
    data = encode_checkpoint([{"id": "done", "sample": 0}], "h1", seg)
    found = read_checkpoint(data, "k", "h1")
    assert found is not None and found.rows == [{"id": "done", "sample": 0}] and found.segments == seg
    assert decode_checkpoint(data, "k", "h1") == [{"id": "done", "sample": 0}]
    assert read_checkpoint(data, "k", "h2") is None
    # a version-1 reader compared `identity_hash`: it finds none here and ignores the object
    header = next(iter(__import__("fleet.store.layout", fromlist=["x"]).decode_lines(data, "k")))
    assert "identity_hash" not in header


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("temperature", "every"), [(0.0, 1), (1.0, 3)], ids=["greedy", "sampled"])
def test_hf_continued_equals_one_run_token_for_token(tiny_model: Path, temperature: float, every: int):
    """The real transformers engine: a sample cut anywhere (greedy: at every seam, inside a word, a
    multi-byte character, `</think>`) and continued from prompt + its ids equals the uninterrupted one,
    ids and text. A sampled one draws its token at output position p with draw(seed, p): continued after
    any prefix it draws what its uninterrupted run drew there, never its first draws again."""
    from fleet.engines.hf.engine import HfEngine

    settings = load_settings(engine="hf", model=str(tiny_model))

    def request(seed: int, **over) -> GenRequest:
        return GenRequest(record_id="g", chunk=0, sample=0, messages=[Message(role="user", content="the lease?")],
                          sampling=tiny_sampling("g", max_tokens=48, temperature=temperature, seed=seed),
                          return_output_ids=True, request_id=f"g/{seed}", **over)  # fmt: skip

    async def go():
        engine = HfEngine(settings)
        await engine.start()
        try:
            _, whole = await collect(engine, request(1))
            ids = whole.output_ids
            if temperature:  # the seed does choose the tokens
                assert (await collect(engine, request(2)))[1].output_ids != ids
            for cut in range(1, len(ids), every):
                more, result = await collect(engine, request(1, prefix_ids=ids[:cut]))
                assert [i for d in more for i in d.ids] == ids[cut:], f"continued at {cut}"
                assert (result.output_ids, result.text, result.reasoning, result.finish_reason) == \
                    (ids, whole.text, whole.reasoning, whole.finish_reason)
        finally:
            await engine.shutdown()
    asyncio.run(go())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hf_a_row_that_ends_early_gets_its_result_while_its_batch_runs_on(tiny_model: Path):
    """A row's record reaches its stream the step the row ends, with its last ids: a hand-over while its
    batch runs on finds it finished, never ids that end in an end id with no record."""
    from fleet.engines.hf.engine import HfEngine

    settings = load_settings(engine="hf", model=str(tiny_model), hf={"batch_wait_s": 0.5})

    async def go():
        engine = HfEngine(settings)
        await engine.start()
        try:
            def req(rid: str, max_tokens: int) -> GenRequest:
                return GenRequest(record_id=rid, chunk=0, sample=0, sampling=tiny_sampling(rid, max_tokens=max_tokens,
                                  temperature=0.0), prompt="the lease", return_output_ids=True, request_id=rid)

            long = asyncio.ensure_future(collect(engine, req("long", 400)))
            short_deltas, short = await collect(engine, req("short", 4))
            # Then the short row's result came while the long one still ran, with every id in one go
            assert not long.done() and short.finish_reason == "length" and len(short.output_ids) == 4
            assert short.meta["batch_size"] == 2  # one batch of both rows
            assert [i for d in short_deltas for i in d.ids] == short.output_ids
            assert short_deltas[-1].ids  # its last ids come with its result, not before it
            _, done = await long
            assert len(done.output_ids) == 400 and done.meta["batch_size"] == 2
        finally:
            await engine.shutdown()
    asyncio.run(go())


def ended_run(prefixes: dict[str, list[int]], max_tokens: int = 200, stop: list[str] | None = None):
    """A chunk run of the sim whose samples have checkpointed ids (`prefixes`, by record id)."""
    from fleet.engines.specs import job_config
    from fleet.records import InputRecord
    from fleet.settings import Settings
    from fleet.store.checkpoints import Partial
    from fleet.store.manifest import Manifest, config_hash
    from fleet.worker.run.chunk import ChunkRun, turn_key

    settings = Settings(sim={"vocab_size": 1000, "mean_output_tokens": 50, "sigma": 0.4},
                        sampling={"max_tokens": max_tokens, "stop": stop})
    config = job_config(settings)
    manifest = Manifest(job="j", input="x", chunk_size=8, chunks=1, records=len(prefixes), samples=len(prefixes),
                        config=config, config_hash=config_hash(config))
    records = [InputRecord(pos=i, line=i + 1, id=rid, prompt="p") for i, rid in enumerate(prefixes)]
    run = ChunkRun(job="j", index=0, attempt=1, worker="w", manifest=manifest, records=records)
    run.partials = {turn_key(rid, 0, 0): Partial(ids, []) for rid, ids in prefixes.items() if ids}
    return run, settings


def whole_samples(settings, ids: list[str]) -> dict[str, list[int]]:
    """Each record's sample made in one go by the sim, as requests_for asks for it."""
    from fleet.engines.sim.engine import SimEngine, sim_length
    from fleet.engines.sim.tokenchain import sim_tokens
    from fleet.records import derive_seed

    vocab = SimEngine(settings.sim).vocab
    out = {}
    for rid in ids:
        seed = derive_seed(settings.seed, rid, 0)
        out[rid] = sim_tokens(vocab, seed, sim_length(settings.sim, seed), settings.sampling.max_tokens or 10**6)[0]
    return out


def test_a_sample_whose_checkpointed_ids_already_end_it_is_kept_as_made_never_continued():
    from fleet.engines.sim.engine import SimEngine
    from fleet.worker.run.generate import generate_chunk

    # Given samples made in one go, and checkpoints a hand-over left of them: one whose ids end on its
    # end id, one continued past it (an older fleet's defect), one that reached its max tokens, one
    # stopped midway
    async def go():
        _, settings = ended_run({}, max_tokens=60)
        made = whole_samples(settings, [f"r{i}" for i in range(40)])
        ends = [rid for rid, ids in made.items() if ids[-1] == 999]  # the sim's end id
        cuts = [rid for rid, ids in made.items() if len(ids) == 60 and ids[-1] != 999]
        whole = {"eos": made[ends[0]], "past": made[ends[1]], "mid": made[ends[2]], "new": made[ends[3]],
                 "full": made[cuts[0]]}
        names = {"eos": ends[0], "past": ends[1], "mid": ends[2], "new": ends[3], "full": cuts[0]}
        prefixes = {"eos": whole["eos"], "past": whole["past"] + whole["eos"][:6], "full": whole["full"],
                    "mid": whole["mid"][:20], "new": []}
        run, settings = ended_run({names[k]: v for k, v in prefixes.items()}, max_tokens=60)
        engine = SimEngine(settings.sim.model_copy(update={"step_s": 0}))
        await engine.start()
        await generate_chunk(run, engine)
        return run, whole, names

    run, whole, names = asyncio.run(go())
    rows = {key: run.finished[f"{rid}\x000"] for key, rid in names.items()}
    # Then each ended sample is its own ids up to its end, with its own reason, and nothing was made for it
    assert rows["eos"]["output_ids"] == whole["eos"] and rows["eos"]["finish_reason"] == "stop"
    assert rows["past"]["output_ids"] == whole["past"] and rows["past"]["finish_reason"] == "stop"
    assert rows["full"]["output_ids"] == whole["full"] and rows["full"]["finish_reason"] == "length"
    assert run.tokens_made == len(whole["mid"]) - 20 + len(whole["new"])
    # And the sample stopped midway is continued to what one run makes
    assert rows["mid"]["output_ids"] == whole["mid"] and rows["mid"]["continued_at"] == [20]
    assert rows["new"]["output_ids"] == whole["new"] and rows["new"]["continued_at"] is None


def test_a_sample_that_cannot_cross_the_seam_on_its_engine_starts_again_from_token_0():
    from fleet.engines.sim.engine import SimEngine
    from fleet.worker.run.generate import generate_chunk

    class PenaltyCountsOutputOnly(SimEngine):
        def restart_reason(self, request):
            return "this engine counts the penalty over output ids only"

    async def go():
        run0, settings = ended_run({"a": [], "b": []})
        whole = whole_samples(settings, ["a", "b"])
        run, settings = ended_run({"a": whole["a"][:25], "b": whole["b"]})
        engine = PenaltyCountsOutputOnly(settings.sim.model_copy(update={"step_s": 0}))
        await engine.start()
        await generate_chunk(run, engine)
        return run, whole

    run, whole = asyncio.run(go())
    rows = {r["id"]: r for r in run.finished.values()}
    # Then the running one was made again from token 0 (its 25 checkpointed tokens made twice); the
    # ended one is kept as made, never generated again
    assert rows["a"]["output_ids"] == whole["a"] and rows["a"]["continued_at"] is None
    assert rows["b"]["output_ids"] == whole["b"] and rows["b"]["continued_at"] == [len(whole["b"])]
    assert run.restarted == 1 and run.tokens_made == len(whole["a"])


@pytest.mark.parametrize(("engine_name", "sampling", "restarts"), [
    ("vllm", {"presence_penalty": 0.5}, True),
    ("vllm", {"frequency_penalty": 0.2}, True),
    ("vllm", {"repetition_penalty": 1.1}, False),  # vLLM counts prompt and output ids alike
    ("vllm", {}, False),
    ("sglang", {"repetition_penalty": 1.1}, True),  # SGLang's penalizers count output ids only
    ("sglang", {"presence_penalty": 0.5}, True),
    ("sglang", {}, False),
])  # fmt: skip
def test_vllm_and_sglang_continue_with_a_seed_of_their_own_and_restart_what_they_cannot_carry(
        engine_name, sampling, restarts):
    """A continued vLLM or SGLang request starts its random stream afresh: its seed is derived from the
    sample's seed and the ids made, so its tail does not replay the draws of its head; a penalty the engine
    counts over output ids only cannot cross the seam, and the sample starts again instead."""
    from fleet.engines.sglang.engine import SglangEngine
    from fleet.engines.vllm.engine import VllmEngine
    from fleet.engines.wire import sglang_sampling as sglang_params
    from fleet.engines.wire import vllm_sampling as vllm_params
    from fleet.records import continued_seed

    engine = object.__new__(VllmEngine if engine_name == "vllm" else SglangEngine)
    engine.eos_ids = [2]
    fresh = GenRequest(record_id="r", chunk=0, sample=0,
                       sampling=tiny_sampling("r", max_tokens=100, seed=7, **sampling))
    continued = GenRequest(**{**fresh.__dict__, "prefix_ids": [5] * 40})
    assert engine.request_sampling(fresh).seed == 7
    seed = engine.request_sampling(continued).seed
    assert seed == continued_seed(7, 40) not in (7, continued_seed(7, 41), None)
    params = (vllm_params(engine.request_sampling(continued), 60, [2]) if engine_name == "vllm"
              else sglang_params(engine.request_sampling(continued), 60, [2], seeded=True))
    assert seed in params.values()
    assert (engine.restart_reason(continued) is not None) == restarts
