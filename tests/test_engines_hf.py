"""The transformers engine on the tiny model: real tokens, batching, stops, seeds, failures.

The engine runs as the worker runs it: started on one long-lived loop thread, with
requests submitted to that loop from other threads.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.engines.hf.engine import HfEngine, RowSampler
from fleet.errors import EngineError, RecordError
from fleet.model.reasoning import split_reasoning
from fleet.model.rendering import load_tokenizer, render_ids
from fleet.records import GenRequest, GenResult, prompt_digest
from fleet.settings import Settings
from tests.modelkit import LoopThread, chat, raw, tiny_model_fixture  # noqa: F401


def hf_settings(model: Path, **hf) -> Settings:
    return Settings(engine="hf", model=str(model), hf={"device": "cpu", "max_batch": 8, **hf})


class Running:
    """An HfEngine started on its own loop thread; `gen` submits from the calling thread."""

    def __init__(self, settings: Settings):
        self.lt = LoopThread()
        self.engine = HfEngine(settings)
        self.lt.run(self.engine.start())

    def gen(self, *requests: GenRequest) -> list[GenResult | BaseException]:
        async def all_of() -> list:
            return await asyncio.gather(*(self.engine.generate(r) for r in requests), return_exceptions=True)

        return self.lt.run(all_of())

    def one(self, request: GenRequest) -> GenResult:
        result = self.gen(request)[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def close(self) -> None:
        self.lt.run(self.engine.shutdown())
        self.lt.close()


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    """A tiny model gains nothing from intra-op threads, and on a shared CI box OpenMP's
    spinning threads can make each step tens of times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def running(tiny_model: Path) -> Iterator[Running]:
    r = Running(hf_settings(tiny_model))
    yield r
    r.close()


def test_concurrent_requests_are_batched_into_real_tokens(tiny_model: Path, running: Running) -> None:
    # Given 20 chat requests from 20 records at once (max_batch 8)
    requests = [chat(f"r{i}", f"Question number {i}?", max_tokens=12) for i in range(20)]

    # When they are generated together
    results = running.gen(*requests)

    # Then every record has real token ids within max_tokens, in batches of at most 8
    tok = load_tokenizer(str(tiny_model))
    for request, result in zip(requests, results, strict=True):
        assert isinstance(result, GenResult)
        assert 1 <= result.completion_tokens <= 12
        assert result.output_ids and len(result.output_ids) == result.completion_tokens
        assert all(0 <= t < len(tok) for t in result.output_ids)
        assert result.prompt_tokens == len(render_ids(tok, request))
        assert result.finish_reason in ("stop", "length")
        assert 1 <= result.meta["batch_size"] <= 8
        assert result.meta["latency_s"] > 0
        # thinking on: the prompt opened <think>, so the output starts as reasoning
        assert result.reasoning is not None
        assert result.in_thinking == ("</think>" not in tok.decode(result.output_ids))
    assert 3 <= running.engine.batches < 20


def test_max_tokens_is_respected_and_reported_as_length(running: Running) -> None:
    result = running.one(raw("a", max_tokens=5, temperature=0.0))

    assert result.completion_tokens == len(result.output_ids) == 5
    assert result.finish_reason == "length"


def test_pre_tokenized_ids_generate_exactly_as_the_same_rendered_prompt(running: Running) -> None:
    # Given a chat request and a pre-tokenized one holding its rendered ids
    rendered = chat("c", "Same prompt", max_tokens=10, temperature=0.0)
    ids = render_ids(running.engine.tokenizer, rendered)
    given = chat("c", "ignored", max_tokens=10, temperature=0.0)
    given.messages, given.input_ids = None, ids
    # When both are generated greedily
    a, b = running.one(rendered), running.one(given)
    # Then the engine saw the same ids and produced the same tokens
    assert b.prompt_tokens == len(ids) and b.meta["prompt_digest"] == a.meta["prompt_digest"] == prompt_digest(ids)
    assert b.output_ids == a.output_ids


def test_greedy_output_does_not_depend_on_the_batch(running: Running) -> None:
    alone = running.one(chat("x", "Same prompt", max_tokens=16, temperature=0.0))
    crowd = running.gen(*[chat(f"c{i}", f"Other prompt {i} " * i, max_tokens=16) for i in range(5)],
                        chat("x", "Same prompt", max_tokens=16, temperature=0.0))  # fmt: skip

    assert crowd[-1].output_ids == alone.output_ids


def test_seeds_reproduce_and_differ(running: Running) -> None:
    first = running.one(chat("s", max_tokens=16, seed=11))
    again = running.one(chat("s", max_tokens=16, seed=11))
    other = running.one(chat("s", max_tokens=16, seed=12))

    assert first.output_ids == again.output_ids
    assert first.output_ids != other.output_ids


def test_eos_from_generation_config_stops_the_row(tiny_model: Path, running: Running, tmp_path: Path) -> None:
    # Given a greedy continuation, and a copy of the model whose eos is one of its tokens
    base = running.one(raw("e", max_tokens=12, temperature=0.0)).output_ids
    k = next(i for i in range(2, len(base)) if base[i] not in base[:i])
    model = Path(shutil.copytree(tiny_model, tmp_path / "eos"))
    gen = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [base[k]]}))

    # When the same request runs on that copy
    other = Running(hf_settings(model))
    try:
        result = other.one(raw("e", max_tokens=12, temperature=0.0))
    finally:
        other.close()

    # Then generation stops at that token, which is kept in the ids and left out of the text
    assert result.output_ids == base[: k + 1]
    assert result.completion_tokens == k + 1
    assert result.finish_reason == "stop"
    tok = load_tokenizer(str(tiny_model))
    assert split_reasoning(tok.decode(base[:k], skip_special_tokens=True), False) == (result.reasoning, result.text)


def test_stop_strings_end_the_text_before_the_stop(tiny_model: Path, running: Running) -> None:
    # Given a greedy continuation and a stop string taken from its middle
    tok = load_tokenizer(str(tiny_model))
    full = running.one(raw("t", max_tokens=24, temperature=0.0))
    text = tok.decode(full.output_ids, skip_special_tokens=True)
    stop = next(text[i : i + 3] for i in range(len(text) // 3, len(text)) if text[i : i + 3].strip())
    expected = text[: text.find(stop)]

    # When the same request carries that stop string
    result = running.one(raw("t", max_tokens=24, temperature=0.0, stop=(stop,)))

    # Then the text ends right before the stop and fewer tokens were generated
    assert split_reasoning(expected, False) == (result.reasoning, result.text)
    assert result.finish_reason == "stop"
    assert result.completion_tokens < full.completion_tokens
    assert result.output_ids == full.output_ids[: result.completion_tokens]


def test_an_over_length_prompt_fails_alone(tiny_model: Path) -> None:
    r = Running(hf_settings(tiny_model, context_length=64))
    try:
        results = r.gen(raw("long", "word " * 200, max_tokens=4), raw("ok", "short", max_tokens=4))
    finally:
        r.close()

    assert isinstance(results[0], RecordError)
    assert "context is 64" in str(results[0])
    assert isinstance(results[1], GenResult) and results[1].completion_tokens == 4


def test_requests_from_many_threads_share_one_loop(running: Running) -> None:
    # Given K=4 slot threads submitting to the engine loop, as Celery's threads pool does
    results: dict[int, list] = {}

    def slot(k: int) -> None:
        results[k] = running.gen(*[chat(f"k{k}-{i}", max_tokens=6) for i in range(6)])

    threads = [threading.Thread(target=slot, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert sorted(results) == [0, 1, 2, 3]
    assert all(isinstance(r, GenResult) for rs in results.values() for r in rs)
    # each ran to its budget or stopped on its own (the tiny model may end a row early)
    assert all(r.completion_tokens == 6 or (r.finish_reason == "stop" and r.completion_tokens < 6)
               for rs in results.values() for r in rs)  # fmt: skip


def test_the_loop_stays_responsive_while_a_batch_runs(running: Running) -> None:
    async def watch() -> float:
        job = asyncio.ensure_future(
            asyncio.gather(*(running.engine.generate(raw(f"w{i}", max_tokens=48)) for i in range(8)))
        )
        worst, last = 0.0, time.monotonic()
        while not job.done():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            worst, last = max(worst, now - last), now
        await job
        return worst

    assert running.lt.run(watch()) < 0.25


def test_a_failed_generate_breaks_the_engine(running: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access")

    monkeypatch.setattr(running.engine.model, "generate", boom)

    first = running.gen(raw("a", max_tokens=3), raw("b", max_tokens=3))
    later = running.gen(raw("c", max_tokens=3))

    assert all(isinstance(r, EngineError) for r in first + later)
    assert "illegal memory access" in str(later[0])


def test_shutdown_fails_what_is_still_queued(tiny_model: Path) -> None:
    r = Running(hf_settings(tiny_model, max_batch=2))
    futures = [r.lt.submit(r.engine.generate(raw(f"q{i}", max_tokens=32))) for i in range(10)]
    time.sleep(0.05)

    r.close()

    outcomes = [f.exception(120) for f in futures]
    assert any(isinstance(e, EngineError) for e in outcomes)
    assert all(e is None or isinstance(e, EngineError) for e in outcomes)


def test_row_sampler_applies_each_rows_own_settings() -> None:
    import torch

    from fleet.records import Sampling

    rows = [
        Sampling(max_tokens=8, temperature=0.0, seed=1),  # greedy
        Sampling(max_tokens=8, temperature=1.0, top_k=1, top_p=1.0, min_p=0.0, seed=2),  # top-1 = greedy
        Sampling(max_tokens=8, temperature=1.0, top_k=0, top_p=0.01, min_p=0.0, seed=3),  # nucleus of one
        Sampling(max_tokens=8, temperature=5.0, top_k=2, top_p=1.0, min_p=0.0, seed=4),  # two candidates
        Sampling(max_tokens=8, temperature=100.0, top_k=0, top_p=1.0, min_p=0.0, seed=5),  # all but padding
        Sampling(max_tokens=8, temperature=100.0, top_k=0, top_p=1.0, min_p=0.999, seed=6),  # min-p keeps the best
    ]
    scores = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]] * len(rows))

    def step(sampler: RowSampler, k: int) -> list[int]:
        """The picks at decode step k (the input has grown by k ids since the first step)."""
        return sampler(torch.zeros((len(rows), 3 + k), dtype=torch.long), scores.clone()).argmax(-1).tolist()

    sampler = RowSampler(rows, vocab=4, device="cpu")  # id 4 is embedding padding
    picks = [step(sampler, k) for k in range(200)]

    assert {p[0] for p in picks} == {p[1] for p in picks} == {p[2] for p in picks} == {0}
    assert {p[3] for p in picks} == {0, 1}
    assert {p[4] for p in picks} == {0, 1, 2, 3}
    assert {p[5] for p in picks} == {0}
    again = RowSampler(rows, vocab=4, device="cpu")
    assert [step(again, k) for k in range(200)] == picks
    # And rows continued after 120 ids draw at output position 120 + k what one run drew there
    continued = RowSampler(rows, vocab=4, device="cpu", prefixes=[120] * len(rows))
    assert [step(continued, k) for k in range(80)] == picks[120:]


def test_row_sampler_penalises_generated_tokens_as_sglang_does() -> None:
    import torch

    from fleet.records import Sampling

    rows = [
        Sampling(max_tokens=8, temperature=0.0, repetition_penalty=2.0, seed=0),  # 3.0 / 2 = 1.5 < 2.0: token 1 wins
        Sampling(max_tokens=8, temperature=0.0, frequency_penalty=0.6, seed=0),  # 3.0 - 2 x 0.6 = 1.8 < 2.0
        Sampling(max_tokens=8, temperature=0.0, presence_penalty=0.6, seed=0),  # 3.0 - 0.6 = 2.4 > 2.0: token 0 stays
        Sampling(max_tokens=8, temperature=0.0, seed=0),  # no penalty
    ]
    sampler = RowSampler(rows, vocab=4, device="cpu")
    prompt = torch.tensor([[0, 0]] * 4)  # prompt tokens are never penalised
    scores = torch.tensor([[3.0, 2.0, 1.0, 0.0]] * 4)
    assert sampler(prompt, scores.clone()).argmax(-1).tolist() == [0, 0, 0, 0]

    generated = torch.cat([prompt, torch.tensor([[0, 0]] * 4)], dim=1)  # token 0 twice since
    assert sampler(generated, scores.clone()).argmax(-1).tolist() == [1, 1, 0, 0]
