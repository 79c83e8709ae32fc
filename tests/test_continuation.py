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
from tests.modelkit import tiny_model_fixture  # noqa: F401


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


@pytest.mark.timeout(300)
def test_hf_greedy_continued_equals_one_run_token_for_token(tiny_model: Path):
    """The real transformers engine: a greedy sample cut anywhere and continued from prompt + its
    ids equals the uninterrupted one, ids and text, also when the cut falls inside `</think>`."""
    from fleet.engines.hf.engine import HfEngine

    settings = load_settings(engine="hf", model=str(tiny_model))

    async def go():
        engine = HfEngine(settings)
        await engine.start()
        try:
            req = GenRequest(record_id="g", chunk=0, sample=0, sampling=Sampling(max_tokens=48, temperature=0.0,
                             seed=1), messages=[Message(role="user", content="the lease and the store?")],
                             return_output_ids=True, request_id="g/1")  # fmt: skip
            _, whole = await collect(engine, req)
            ids = whole.output_ids
            for cut in range(1, len(ids)):  # every seam: inside a word, a multi-byte character, a special token
                cont = GenRequest(**{**req.__dict__, "prefix_ids": ids[:cut], "request_id": f"g/{cut}"})
                more, result = await collect(engine, cont)
                assert [i for d in more for i in d.ids] == ids[cut:]
                assert (result.output_ids, result.text, result.reasoning, result.finish_reason) == \
                    (ids, whole.text, whole.reasoning, whole.finish_reason)
        finally:
            await engine.shutdown()
    asyncio.run(go())
