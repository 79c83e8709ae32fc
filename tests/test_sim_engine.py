"""The sim engine (docs/architecture.md, CLI: engines): deterministic text and heavy-tailed length per
(seed, record id, sample), the configured mean, max_tokens, a slot limit like continuous
batching, and the fault knobs (fail_ids, fault_chunks)."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

from fleet.engines.sim.engine import SimEngine, prompt_size, sim_length
from fleet.engines.sim.tokenchain import SimVocab, sim_text, sim_tokens
from fleet.errors import RecordError
from fleet.records import GenRequest, GenResult, Message, Sampling, derive_seed, prompt_digest
from fleet.settings import SimSettings


def request(
    rid: str = "r1",
    sample: int = 0,
    chunk: int = 0,
    seed: int | None = None,
    max_tokens: int = 100_000,
    prompt: str | None = "two words",
    messages: list[Message] | None = None,
) -> GenRequest:
    return GenRequest(
        record_id=rid,
        chunk=chunk,
        sample=sample,
        sampling=Sampling(max_tokens=max_tokens, seed=derive_seed(0, rid, sample) if seed is None else seed),
        prompt=prompt,
        messages=messages,
    )


def run(cfg: SimSettings, *reqs: GenRequest, engine: SimEngine | None = None) -> list[GenResult]:
    async def main() -> list[GenResult]:
        eng = engine or SimEngine(cfg)
        await eng.start()
        return list(await asyncio.gather(*(eng.generate(r) for r in reqs)))

    return asyncio.run(main())


FAST = SimSettings(step_s=0, max_running=64)


# -- determinism -------------------------------------------------------------------------


def test_same_seed_id_sample_gives_the_same_output_on_a_fresh_engine():
    # Given two engines in two event loops
    seed = derive_seed(7, "rec-1", 0)
    [a] = run(FAST, request("rec-1", 0, seed=seed))
    [b] = run(FAST, request("rec-1", 0, seed=seed))
    # Then the sample is identical, byte for byte
    assert (a.text, a.reasoning, a.completion_tokens, a.finish_reason) == (
        b.text,
        b.reasoning,
        b.completion_tokens,
        b.finish_reason,
    )
    assert a.completion_tokens == sim_length(FAST, seed)


def test_samples_and_seeds_give_different_outputs():
    results = run(
        FAST,
        *[request("rec-1", s, seed=derive_seed(0, "rec-1", s)) for s in range(8)],
        request("rec-1", 0, seed=derive_seed(1, "rec-1", 0)),
    )
    assert len({(r.text, r.reasoning) for r in results}) == len(results)


def test_with_the_derived_seed_the_output_follows_id_and_sample():
    [a, b, c] = run(FAST, request("x", 0), request("x", 0), request("x", 1))
    assert (a.text, a.completion_tokens) == (b.text, b.completion_tokens)
    assert a.text != c.text
    assert a.completion_tokens == sim_length(FAST, derive_seed(0, "x", 0))


def test_sim_text_splits_reasoning_and_answer_with_one_word_per_token():
    # Given any length, the think block holds a third of the ids and the answer the rest
    for tokens in (3, 10, 301):
        text = sim_text(123, tokens)
        assert text.startswith("<think>") and text.count("</think>") == 1
        reasoning, answer = text.removeprefix("<think>").split("</think>")
        assert len(reasoning.split()) == tokens // 3
        assert len(reasoning.split()) + len(answer.split()) == tokens - 1  # one id closes the block
    assert sim_text(5, 40) == sim_text(5, 40) and sim_text(5, 40) != sim_text(6, 40)


def test_every_id_depends_on_the_ids_before_it():
    # Given a sample made in one go
    vocab = SimVocab(1000)
    ids, reason = sim_tokens(vocab, 7, 60, 1000)
    assert reason == "stop" and ids[-1] == vocab.eos and vocab.eos not in ids[:-1]
    assert ids.count(vocab.think_end) == 1
    # When it is continued from its own prefix, it ends as one run
    for cut in (1, 20, 59):
        assert sim_tokens(vocab, 7, 60, 1000, ids[:cut])[0] == ids
    # And from a prefix with one id changed, or shifted by one, what follows differs
    changed = [*ids[:10], (ids[10] + 1) % 998, *ids[11:20]]
    assert sim_tokens(vocab, 7, 60, 1000, changed)[0][20:] != ids[20:]
    shifted = ids[1:21]
    assert sim_tokens(vocab, 7, 60, 1000, shifted)[0][20:] != ids[21:]
    # And a prefix that already holds its end id is gone on from, as a real engine does: a second end id
    again = sim_tokens(vocab, 7, 60, 1000, ids)[0]
    assert again[: len(ids)] == ids and again.count(vocab.eos) == 2


def test_result_text_is_the_answer_and_reasoning_is_split():
    [res] = run(FAST, request("r", seed=99))
    assert "<think>" not in res.text and "</think>" not in res.text
    assert "<think>" not in res.reasoning
    # every id is a word but the one that closes the think block and the end id
    assert len(res.reasoning.split()) + len(res.text.split()) == res.completion_tokens - 2


# -- lengths -----------------------------------------------------------------------------


@pytest.mark.parametrize(("mean", "sigma"), [(256, 0.8), (1818, 0.8), (200, 1.0)])
def test_mean_length_is_close_to_configured(mean, sigma):
    # Given many seeds
    cfg = SimSettings(mean_output_tokens=mean, sigma=sigma)
    lengths = [sim_length(cfg, derive_seed(0, str(i), 0)) for i in range(20_000)]
    # Then the mean is within 5% of the configured one
    assert statistics.fmean(lengths) == pytest.approx(mean, rel=0.05)
    # And the tail is heavy: the longest of 512 is several times the mean
    assert max(lengths[:512]) > 3 * mean
    assert min(lengths) >= 1


def test_zero_sigma_gives_the_mean_exactly():
    cfg = SimSettings(mean_output_tokens=40, sigma=0)
    assert {sim_length(cfg, s) for s in range(50)} == {40}


def test_max_tokens_cuts_with_finish_reason_length():
    # Given a record whose natural length is above max_tokens
    seed = next(s for s in range(1000) if sim_length(FAST, s) > 20)
    [cut, whole] = run(FAST, request(seed=seed, max_tokens=20), request(seed=seed))
    # Then it stops at max_tokens with finish_reason length; unbounded it stops naturally
    assert (cut.completion_tokens, cut.finish_reason) == (20, "length")
    assert (whole.completion_tokens, whole.finish_reason) == (sim_length(FAST, seed), "stop")


def test_max_tokens_equal_to_natural_length_is_a_stop():
    natural = sim_length(FAST, 42)
    [res] = run(FAST, request(seed=42, max_tokens=natural))
    assert (res.completion_tokens, res.finish_reason) == (natural, "stop")


def test_prompt_tokens_count_the_prompt():
    assert prompt_size(request(prompt="a b c d")) == 4
    msgs = [
        Message(role="system", content="be brief"),
        Message(role="user", content="hi there you"),
    ]
    assert prompt_size(request(prompt=None, messages=msgs)) == 4 + 2 + 4 + 3
    [res] = run(FAST, request(prompt="one two three"))
    assert res.prompt_tokens == 3


# -- slots -------------------------------------------------------------------------------


def test_never_more_than_max_running_requests_at_once():
    # Given 2 slots, every request 10 steps of 10 ms, and 6 requests at once
    cfg = SimSettings(max_running=2, step_s=0.01, mean_output_tokens=10, sigma=0)
    engine = SimEngine(cfg)
    seen: list[int] = []

    async def main() -> float:
        await engine.start()
        stop = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                seen.append(engine.running)
                await asyncio.sleep(0.002)

        watcher = asyncio.create_task(watch())
        began = time.monotonic()
        results = await asyncio.gather(*(engine.generate(request(str(i))) for i in range(6)))
        took = time.monotonic() - began
        stop.set()
        await watcher
        assert all(r.completion_tokens == 10 for r in results)
        return took

    took = asyncio.run(main())
    # Then at most 2 run at a time, both slots are used, and the work takes three waves or more (a
    # busy machine only adds to the steps' sleeps)
    assert max(seen) == 2
    assert took >= 0.28
    assert engine.running == 0
    assert engine.busy_slot_s >= 0.55  # 6 requests x 0.1 s
    assert engine.max_running == 2


def test_prefill_time_holds_a_slot():
    cfg = SimSettings(max_running=1, step_s=0, prefill_s=0.05)
    began = time.monotonic()
    run(cfg, *[request(str(i)) for i in range(4)])
    assert time.monotonic() - began >= 0.19


def test_generate_before_start_fails_loudly():
    with pytest.raises(AssertionError, match="start"):
        asyncio.run(SimEngine(FAST).generate(request()))


# -- faults ------------------------------------------------------------------------------


def test_fail_ids_raise_record_error_for_that_record_only():
    cfg = SimSettings(step_s=0, fail_ids=["bad"])

    async def main() -> tuple[list, GenResult]:
        eng = SimEngine(cfg)
        await eng.start()
        outcomes = await asyncio.gather(
            eng.generate(request("bad")), eng.generate(request("good")), return_exceptions=True
        )
        return outcomes

    bad, good = asyncio.run(main())
    assert isinstance(bad, RecordError) and "bad" in str(bad)
    assert isinstance(good, GenResult) and good.finish_reason == "stop"


def test_fault_chunks_raise_for_every_record_of_that_chunk():
    cfg = SimSettings(step_s=0, fault_chunks=[3])
    with pytest.raises(Exception) as info:
        run(cfg, request("a", chunk=3))
    # A chunk failure, not a record failure: the record error path must not swallow it
    assert not isinstance(info.value, RecordError)
    assert "3" in str(info.value)
    [ok] = run(cfg, request("a", chunk=2))
    assert ok.finish_reason == "stop"


def test_model_name_names_the_length_model():
    assert (
        SimEngine(SimSettings(mean_output_tokens=1818, sigma=0.8)).model_name() == "sim-m1818-s0.8"
    )


def test_pre_tokenized_prompt_counts_its_ids_and_output_ids_follow_the_vocabulary():
    # Given a pre-tokenized request asking for output ids on a sim with a 50-token vocabulary
    req = request("t", seed=5, max_tokens=30, prompt=None)
    req.input_ids, req.return_output_ids = [3, 1, 4, 1, 5], True
    [res] = run(SimSettings(step_s=0, vocab_size=50), req)
    # Then the prompt is its ids, fingerprinted, and there is one output id per token, in range
    assert res.prompt_tokens == 5 and res.meta["prompt_digest"] == prompt_digest([3, 1, 4, 1, 5])
    assert len(res.output_ids) == res.completion_tokens and all(0 <= i < 50 for i in res.output_ids)
