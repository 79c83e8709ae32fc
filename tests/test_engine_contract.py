"""The stream contract every engine keeps (fleet/engines/base.py), run on each of them: the sim, hf on the
tiny model, SGLang's stand-in (tests/fake_sglang), the server engine on a stand-in server speaking
vLLM's and SGLang's APIs (tests/serverstub.py), and where they are installed the real vLLM and the
server engine on a real `vllm serve` (the vLLM stage of .ci/run). What differs between engines is in
their own test modules; what must not is here.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fleet.audit.checks import Limits, Vocab, output_problems
from fleet.engines.specs import build_engine
from fleet.errors import AccessRefused, EngineUnavailable, RecordError
from fleet.model.endings import reported_text
from fleet.model.reasoning import split_reasoning
from fleet.records import GenRequest
from fleet.settings import RepetitionSettings, Settings
from tests.modelkit import LoopThread, raw, tiny_model_fixture, tiny_sampling  # noqa: F401
from tests.vllmserve import SERVED_VLLM

FAKE = Path(__file__).parent / "fake_sglang"
ENGINES = ["sim", "hf", "sglang-stand-in", "server-vllm", "server-sglang", "vllm", "server-real-vllm"]
#: the embedded real vLLM's engine in these tests: the CPU build, bounded, compiled (the default). The server engine
#: runs on the session's `vllm serve` of the tiny model (tests/vllmserve.py, SERVED_VLLM: the same but eager and
#: 24 at once), which test_engines_vllm's served tests share: one server start for both
REAL_VLLM = {"dtype": "float32", "kv_cache_memory_bytes": 64 << 20, "max_num_seqs": 8, "stream_interval": 4}


class Harness:
    """One started engine on its own loop thread, and how to look inside it where a test must."""

    def __init__(self, name: str, engine: Any, loop: LoopThread, stub: Any = None, fake: Any = None):
        self.name, self.engine, self.loop, self.stub, self.fake = name, engine, loop, stub, fake
        #: the real server's log, where it says which requests it aborted
        self.log: Path | None = None

    def collect(self, request: GenRequest, close_after: int | None = None) -> tuple[list[int], Any, int]:
        """(ids streamed, the result, deltas) of one request; with close_after, the stream is closed after
        that many deltas, as the worker closes one it stops."""

        async def run() -> tuple[list[int], Any, int]:
            ids, result, n = [], None, 0
            stream = self.engine.stream(request)
            try:
                async for delta in stream:
                    ids += delta.ids
                    result = delta.result or result
                    n += 1
                    if close_after is not None and n >= close_after:
                        break
            finally:
                await stream.aclose()
            return ids, result, n

        return self.loop.run(run(), timeout=300)


def request(rid: str, max_tokens: int = 40, **sampling: Any) -> GenRequest:
    req = raw(rid, "def main():\n    return", max_tokens=max_tokens, temperature=0.0, **sampling)
    req.request_id = f"{rid}/req"
    return req


@pytest.fixture(params=ENGINES, scope="module")
def harness(request: pytest.FixtureRequest, tiny_model: Path) -> Iterator[Harness]:
    """Each engine started once for every test of this module (vLLM's take a minute each on 2 cores)."""
    name = request.param
    lt = LoopThread()
    stub, fake, server, log = None, None, None, None
    patch = pytest.MonkeyPatch()
    try:
        if name == "sim":
            settings = Settings(engine="sim", sim={"mean_output_tokens": 45, "sigma": 0.2, "step_s": 0.0,
                                                   "stream_interval": 4})
        elif name == "hf":
            pytest.importorskip("torch")
            settings = Settings(engine="hf", model=str(tiny_model), hf={"stream_interval": 4, "max_batch": 4})
        elif name == "sglang-stand-in":
            for mod in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
                patch.delitem(sys.modules, mod)
            patch.syspath_prepend(str(FAKE))
            import sglang as fake

            fake.instances.clear()
            settings = Settings(engine="sglang", model=str(tiny_model),
                                sglang={"mtp": False, "stream_interval": 4, "engine_kwargs": {"fake_tokens": 30}})
        elif name.startswith("server-") and name != "server-real-vllm":
            from fleet.model.rendering import load_tokenizer
            from tests.serverstub import Stub

            tok = load_tokenizer(str(tiny_model))
            stub = Stub(tok, eos=tok.eos_token_id or 2, api=name.removeprefix("server-"), dev_mode=True)
            server, url = stub.run()
            settings = Settings(engine="server", model=str(tiny_model), server={"base_url": url, "retries": 2})
        elif name == "vllm":
            pytest.importorskip("vllm")
            settings = Settings(engine="vllm", model=str(tiny_model), vllm=REAL_VLLM)
        else:  # the server engine on a real `vllm serve`: the session's (tests/conftest.py), which tells its
            # max_num_seqs and logs the requests it aborts
            pytest.importorskip("vllm")
            from tests.vllmserve import SERVED_KEY

            served = request.getfixturevalue("vllm_served")
            log = served.log
            patch.setenv("FLEET_TEST_VLLM_KEY", SERVED_KEY)
            settings = Settings(engine="server", model=str(tiny_model),
                                server={"base_url": served.url, "api_key_env": "FLEET_TEST_VLLM_KEY"})
        engine = build_engine(settings)
        lt.run(engine.start(), timeout=900)
        harness = Harness(name, engine, lt, stub, fake)
        harness.log = log
        yield harness
        lt.run(engine.shutdown(), timeout=120)
    finally:
        if server is not None:  # a stand-in's (the session's `vllm serve` lives on)
            server.shutdown()
        lt.close()
        if fake is not None:  # the stand-in leaves no module behind for tests that check sglang is not imported
            for mod in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
                del sys.modules[mod]
        patch.undo()


@pytest.mark.slow
def test_deltas_carry_only_new_ids_and_the_result_covers_them_all(harness: Harness) -> None:
    ids, result, n = harness.collect(request("a"))
    assert result is not None and n >= 2, "the stream came in one piece"
    assert ids == result.output_ids and result.completion_tokens == len(ids) <= 40
    assert result.finish_reason in ("stop", "length")
    assert result.finish_reason == "stop" or len(ids) == 40


def test_a_continued_request_streams_what_follows_its_prefix_and_ends_as_one_run(harness: Harness) -> None:
    whole_ids, whole, _ = harness.collect(request("c", max_tokens=60))
    assert len(whole_ids) > 12, "too short a sample to continue"
    continued = request("c", max_tokens=60)
    continued.prefix_ids = whole.output_ids[:11]
    if harness.engine.restart_reason(continued):
        pytest.skip(f"{harness.name} restarts such a sample: {harness.engine.restart_reason(continued)}")
    new_ids, result, _ = harness.collect(continued)
    assert new_ids == whole.output_ids[11:]
    assert (result.output_ids, result.finish_reason) == (whole.output_ids, whole.finish_reason)
    assert (result.reasoning, result.text) == (whole.reasoning, whole.text)


def test_a_stop_string_ends_the_sample_at_its_first_place_in_the_text(harness: Harness) -> None:
    """The text ends before the stop string's first place, the ids with the one that completed it
    (vLLM is asked for its own text only then: fleet.engines.wire.vllm_sampling)."""
    _, whole, _ = harness.collect(request("t", max_tokens=40))
    if whole.reasoning is not None:
        pytest.skip(f"{harness.name} split the text at a </think>; the stop string needs it whole")
    text = whole.text
    at = next((k for k in range(len(text) // 3, len(text) - 3)
               if text[k:k + 3].strip() and text.find(text[k:k + 3]) == k), None)  # fmt: skip
    assert at is not None, f"no stop string to pick in {text!r}"
    _, stopped, _ = harness.collect(request("t", max_tokens=40, stop=(text[at:at + 3],)))
    assert (stopped.text, stopped.finish_reason) == (text[:at], "stop")
    assert stopped.output_ids == whole.output_ids[:len(stopped.output_ids)]
    assert stopped.completion_tokens == len(stopped.output_ids) < len(whole.output_ids)
    assert text[at:at + 3] in harness.engine.decode(stopped.output_ids)


def test_a_prefix_that_already_ends_its_sample_is_never_continued(harness: Harness) -> None:
    whole_ids, whole, _ = harness.collect(request("e", max_tokens=24))
    ended = request("e", max_tokens=24)
    ended.prefix_ids = whole.output_ids
    ending = harness.loop.run(harness.engine.ended(ended))
    if whole.finish_reason == "length":
        assert ending is not None and (ending.reason, ending.length) == ("length", 24)
    else:
        assert ending is not None and ending.reason == "stop"


def test_a_closed_stream_ends_its_request_inside_the_engine(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    # Long enough to be running still when the stream is closed after its first delta: a real server
    # notices the closed connection at its next write, and a request that ended first is never aborted
    # (vLLM's CPU build makes a few hundred tokens a second on the tiny model; its context is 2,048).
    # The stub's 400 tokens take 8 s: at its usual 2 ms a token (0.8 s) they ended before a client starved
    # beside a one-core hog (four tests at a time on 2 cores) had read its first delta and closed the stream.
    if harness.stub is not None:
        monkeypatch.setattr(harness.stub, "step_s", 0.02)
    req = request("x", max_tokens={"sim": 40, "server-real-vllm": 1900}.get(harness.name, 400))
    req = replace(req, sampling=replace(req.sampling, stop=None))
    ids, result, n = harness.collect(req, close_after=1)
    assert result is None and n == 1
    if harness.stub is not None:  # the server saw its client go and stopped generating
        from tests.fleetproc import wait_for

        wait_for(lambda: "x/req" in harness.stub.aborted, 30, "the server to abort the request")
        assert "x/req" not in harness.stub.finished
    elif harness.name == "sglang-stand-in":
        [fake] = harness.fake.instances
        assert "x/req" in fake.tokenizer_manager.aborted
    elif harness.name == "vllm":
        from tests.fleetproc import wait_for

        async def unfinished() -> int:
            return harness.engine._engine.get_num_unfinished_requests()

        wait_for(lambda: harness.loop.run(unfinished()) == 0, 30, "vLLM to abort the request")
    elif harness.name == "server-real-vllm":  # vLLM's server aborts a request whose client went away
        from tests.fleetproc import wait_for

        assert harness.log is not None
        log = harness.log  # the abort's own line names the request (a line that only names it is no abort)
        wait_for(lambda: re.search(r"Aborted request\(s\) \S*x/req", log.read_text()) is not None, 30,
                 "vllm serve to abort the request")
    # the engine goes on serving
    _, after, _ = harness.collect(request("after", max_tokens=8))
    assert after is not None and after.completion_tokens <= 8


def test_a_prompt_that_leaves_no_room_fails_its_record_alone(harness: Harness) -> None:
    if harness.name == "sim":
        pytest.skip("the sim has no context")
    budget = harness.engine.context_budget
    assert budget
    long = GenRequest(record_id="long", chunk=0, sample=0,
                      sampling=tiny_sampling("long", temperature=0.0, max_tokens=8),
                      input_ids=[10 + i % 200 for i in range(budget + 5)], return_output_ids=True)
    with pytest.raises(RecordError):
        harness.collect(long)
    _, after, _ = harness.collect(request("ok", max_tokens=8))
    assert after is not None


def test_a_request_that_fills_the_context_ends_where_fleet_asked_and_passes_the_audit(harness: Harness) -> None:
    """What fleet asks (the context budget) and what the audit takes a length cut at the context by are
    one number, the tokens the engine really runs a request to (SGLang's scheduler: two short of its
    context): a record clipped by the context is made whole and never flagged a defect."""
    if harness.name == "sim":
        pytest.skip("the sim has no context")
    budget = harness.engine.context_budget
    assert budget
    near = GenRequest(
        record_id="full",
        chunk=0,
        sample=0,
        sampling=tiny_sampling("full", temperature=0.0, max_tokens=64),
        input_ids=[10 + i % 200 for i in range(budget - 6)],
        return_output_ids=True,
    )
    ids, result, _ = harness.collect(near)
    assert result is not None and result.prompt_tokens == budget - 6 and ids == result.output_ids
    assert result.prompt_tokens + result.completion_tokens <= budget
    if result.finish_reason == "length":  # cut by the context, at exactly what fleet asked for
        assert result.completion_tokens == 6
    assert audit(harness, result, Limits(64, None, budget)) == []


def audit(harness: Harness, result: Any, limits: Limits) -> list[str]:
    """What the record audit finds wrong with a result kept as its row."""
    row = {
        "output_ids": result.output_ids,
        "finish_reason": result.finish_reason,
        "output": result.text,
        "completion_tokens": result.completion_tokens,
        "prompt_tokens": result.prompt_tokens,
        "reasoning": result.reasoning,
        "in_thinking": result.in_thinking,
    }
    return output_problems(row, limits, Vocab(harness.engine.decode, harness.engine.end_ids(), RepetitionSettings()))


def cut_inside_a_character(tokenizer: Any) -> list[int]:
    """Prompt ids whose text ends inside a UTF-8 character: a line with multi-byte characters, its ids
    cut at the last place where they decode to a replacement mark (the tiny tokenizer is a byte-level
    BPE: a character it never merged is several ids, one byte or two each)."""
    ids = tokenizer.encode("def main():\n    return 'naïve café, 中文'", add_special_tokens=False)
    cut = max(k for k in range(1, len(ids)) if tokenizer.decode(ids[:k]).endswith("\ufffd"))
    return ids[:cut]


def test_a_prompt_cut_inside_a_character_keeps_the_text_its_output_ids_decode_to(harness: Harness) -> None:
    """vLLM's server detokenizes every request from the prompt's ids on (its completions API has no
    `detokenize`): after a prompt cut inside a character its streamed text begins with the prompt's own
    bytes. The record keeps what its ids say, on every engine."""
    if harness.name == "sim":
        pytest.skip("the sim has no tokenizer")
    # Given a pre-tokenized prompt whose ids end inside a UTF-8 character
    prompt = cut_inside_a_character(harness.engine.tokenizer)
    cut = GenRequest(record_id="cut", chunk=0, sample=0, sampling=tiny_sampling("cut", temperature=0.0, max_tokens=16),
                     input_ids=prompt, return_output_ids=True)
    # When it runs
    ids, result, _ = harness.collect(cut)
    # Then the record's text is what its own output ids decode to, and it passes the audit
    assert result is not None and ids == result.output_ids and len(ids) > 1
    assert result.prompt_tokens == len(prompt)
    _, text, _ = reported_text(ids, result.finish_reason, harness.engine.end_ids(), None, harness.engine.decode)
    assert (result.reasoning, result.text) in (split_reasoning(text, True), split_reasoning(text, False))
    assert audit(harness, result, Limits(16, None, harness.engine.context_budget)) == []


def test_the_server_engine_runs_no_more_at_once_than_its_server_says(harness: Harness) -> None:
    """vLLM's server tells its max_num_seqs on /server_info (served with VLLM_SERVER_DEV_MODE=1), SGLang's its
    effective max running requests on /server_info: a worker keeps no more in flight than that."""
    if not harness.name.startswith("server-"):
        pytest.skip("the embedded engines' read-back is theirs (their own test modules)")
    told = SERVED_VLLM["max_num_seqs"] if harness.stub is None else harness.stub.running
    assert harness.engine.asked_running > told
    assert harness.engine.max_running == told and harness.engine.kv_tokens


# -- the server engine's own edges, on the stand-in -----------------------------------------------------


@pytest.fixture
def stub_server(tiny_model: Path) -> Iterator[tuple[Any, Harness]]:
    from fleet.model.rendering import load_tokenizer
    from tests.serverstub import Stub

    tok = load_tokenizer(str(tiny_model))
    stub = Stub(tok, eos=tok.eos_token_id or 2)
    server, url = stub.run()
    lt = LoopThread()
    settings = Settings(engine="server", model=str(tiny_model), server={"base_url": url, "retries": 2})
    engine = build_engine(settings)
    lt.run(engine.start())
    try:
        yield stub, Harness("server-vllm", engine, lt, stub)
    finally:
        lt.run(engine.shutdown())
        server.shutdown()
        lt.close()


def test_the_server_engine_sends_token_ids_and_what_fleet_samples_with(stub_server) -> None:
    stub, h = stub_server
    h.collect(request("s", max_tokens=12, stop=("END",)))
    sent = stub.requests[-1]
    assert sent["path"] == "/v1/completions" and sent["model"] == "tiny" and sent["return_token_ids"] is True
    assert isinstance(sent["prompt"], list) and sent["max_tokens"] == 12 and sent["stop"] == ["END"]
    assert sent["stop_token_ids"] == h.engine.eos_ids and sent["request_id"] == "s/req"
    assert h.engine.facts.api == "vllm" and h.engine.context == stub.context


@pytest.mark.slow
def test_a_5xx_is_sent_again_and_a_storm_of_them_is_the_server_down(stub_server) -> None:
    stub, h = stub_server
    stub.fail_next = 2  # within the 2 retries: the record is made
    _, result, _ = h.collect(request("r1", max_tokens=8))
    assert result is not None and len([r for r in stub.requests if r.get("request_id") == "r1/req"]) == 3
    stub.fail_next = 3  # past them: the server is down, an infrastructure fault, not the record's
    with pytest.raises(EngineUnavailable, match="500"):
        h.collect(request("r2", max_tokens=8))
    assert h.engine._dead is None  # nothing broken: the next request goes out
    _, after, _ = h.collect(request("r3", max_tokens=8))
    assert after is not None


def test_a_connection_lost_mid_stream_is_the_server_down_and_a_refused_one_too(stub_server, tiny_model) -> None:
    stub, h = stub_server
    stub.drop_after = 1
    with pytest.raises(EngineUnavailable, match="out of reach"):
        h.collect(request("d", max_tokens=40))
    # a server that refuses connections (nothing listens): down, not the record's fault
    import httpx

    engine = build_engine(Settings(engine="server", model=str(tiny_model),
                                   server={"base_url": "http://127.0.0.1:9", "retries": 1}))
    engine.facts, engine.context, engine._loop = h.engine.facts, h.engine.context, h.loop.loop
    engine.tokenizer, engine.eos_ids = h.engine.tokenizer, h.engine.eos_ids
    engine._engine = httpx.AsyncClient(base_url="http://127.0.0.1:9")
    with pytest.raises(EngineUnavailable, match="out of reach.*ConnectError"):
        Harness("gone", engine, h.loop).collect(request("g", max_tokens=8))


def test_a_bad_request_fails_its_record_alone(stub_server) -> None:
    stub, h = stub_server
    h.engine.context = None  # fleet cannot tell: the server's own check decides
    long = GenRequest(record_id="long", chunk=0, sample=0,
                      sampling=tiny_sampling("long", temperature=0.0, max_tokens=8),
                      input_ids=[10] * (stub.context + 1), return_output_ids=True)
    with pytest.raises(RecordError, match="400.*maximum context length"):
        h.collect(long)


@pytest.mark.slow
def test_the_identity_names_the_served_model_and_a_server_that_lists_several_must_be_told(tiny_model) -> None:
    from fleet.engines.identity import engine_identity
    from fleet.errors import ConfigError
    from fleet.model.rendering import load_tokenizer
    from tests.serverstub import Stub

    tok = load_tokenizer(str(tiny_model))
    stub = Stub(tok, eos=2, api="sglang", root="/models/qwen")
    server, url = stub.run()
    try:
        settings = Settings(engine="server", model=str(tiny_model), server={"base_url": url})
        identity = engine_identity(settings)
        assert identity["server"] == {"api": "sglang", "model": "tiny", "root": "/models/qwen", "revision": "default"}
        assert identity["model"]["revision"] is not None or "chat_template_sha256" in identity["model"]
        stub.root = "/models/other"  # another model behind the same URL is another engine
        assert engine_identity(settings) != identity
        with pytest.raises(ConfigError, match="not server.model"):
            engine_identity(Settings(engine="server", model=str(tiny_model),
                                     server={"base_url": url, "model": "other"}))
    finally:
        server.shutdown()


def test_the_openai_api_restarts_a_stopped_sample_instead_of_continuing_it(tiny_model) -> None:
    from fleet.model.rendering import load_tokenizer
    from tests.serverstub import Stub

    tok = load_tokenizer(str(tiny_model))
    stub = Stub(tok, eos=tok.eos_token_id or 2, api="vllm")
    server, url = stub.run()
    lt = LoopThread()
    engine = build_engine(Settings(engine="server", model=str(tiny_model),
                                   server={"base_url": url, "api": "openai"}))
    try:
        lt.run(engine.start())
        h = Harness("server-openai", engine, lt, stub)
        ids, result, _ = h.collect(request("o", max_tokens=30))
        sent = stub.requests[-1]
        assert isinstance(sent["prompt"], str) and "return_token_ids" not in sent
        # the ids are the text encoded again: they decode to the record's text
        assert result.output_ids == ids and result.text.strip() in tok.decode(ids, skip_special_tokens=True)
        continued = request("o", max_tokens=30)
        continued.prefix_ids = ids[:5]
        assert "text" in (engine.restart_reason(continued) or "")
        lt.run(engine.shutdown())
    finally:
        server.shutdown()
        lt.close()


def stub_settings(tiny_model: Path, url: str, **server: Any) -> Settings:
    return Settings(engine="server", model=str(tiny_model),
                    server={"base_url": url, "api_key_env": "FLEET_TEST_SERVER_KEY", **server})


@pytest.mark.parametrize("api", ["vllm", "sglang"])
def test_a_key_the_server_refuses_fails_the_start_at_once_with_what_to_fix(
    tiny_model: Path, api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from fleet.engines.identity import engine_identity
    from fleet.model.rendering import load_tokenizer
    from tests.serverstub import Stub

    # Given a server behind an API key (vLLM guards its /v1 paths, SGLang every path but health and metrics)
    tok = load_tokenizer(str(tiny_model))
    stub = Stub(tok, eos=tok.eos_token_id or 2, api=api, api_key="right")
    server, url = stub.run()
    lt = LoopThread()
    settings = stub_settings(tiny_model, url, start_timeout_s=5)
    try:
        for key, said in ((None, "asks for an API key"), ("wrong", "refuses the API key")):
            if key is None:
                monkeypatch.delenv("FLEET_TEST_SERVER_KEY", raising=False)
            else:
                monkeypatch.setenv("FLEET_TEST_SERVER_KEY", key)
            # When a worker's engine starts, and when a job starts (its engine identity is asked of the server)
            began = time.monotonic()
            with pytest.raises(AccessRefused) as started:
                lt.run(build_engine(settings).start())
            with pytest.raises(AccessRefused) as enqueued:
                engine_identity(settings)
            # Then both fail at once, without waiting out start_timeout_s, in one line that says what to set
            assert time.monotonic() - began < 4
            for e in (started.value, enqueued.value):
                assert said in str(e) and "$FLEET_TEST_SERVER_KEY" in str(e) and "401" in str(e)
                assert "\n" not in str(e)
        # And with the key it asks for, the engine starts
        monkeypatch.setenv("FLEET_TEST_SERVER_KEY", "right")
        engine = build_engine(settings)
        lt.run(engine.start())
        lt.run(engine.shutdown())
    finally:
        server.shutdown()
        lt.close()


def test_a_request_refused_for_its_permission_or_model_quarantines_its_chunk_at_once(stub_server) -> None:
    from fleet.coord.retry import Action, History, RetryPolicy

    stub, h = stub_server
    # Given a server that forbids the completions path to fleet's key (403)
    stub.forbidden = ("/v1/completions",)
    # When a request goes out, Then it fails with what to fix, sent once (no retry passes a 403)
    with pytest.raises(AccessRefused, match=r"forbids /v1/completions .*403 Forbidden") as forbidden:
        h.collect(request("f", max_tokens=8))
    assert len([r for r in stub.requests if r.get("request_id") == "f/req"]) == 1
    # Given the server now serves another model under its name (vLLM's 404 NotFoundError)
    stub.forbidden, stub.model = (), "other"
    with pytest.raises(AccessRefused, match=r"model 'tiny'.*404 The model `tiny` does not exist.*FLEET_SERVER__MODEL"
                       ) as unknown:  # fmt: skip
        h.collect(request("m", max_tokens=8))
    # Then the retry policy quarantines the chunk at once, no requeue with backoff
    for e in (forbidden.value, unknown.value):
        assert RetryPolicy().decide(e, History()).action is Action.QUARANTINE
    assert h.engine._dead is None  # the engine itself is whole


@pytest.mark.parametrize("dev_mode", [False, True])
def test_a_vllm_server_tells_its_running_limit_only_in_dev_mode(tiny_model: Path, dev_mode: bool) -> None:
    from fleet.model.rendering import load_tokenizer
    from tests.serverstub import Stub

    # Given a vLLM server running 5 requests at once, served with or without VLLM_SERVER_DEV_MODE=1
    tok = load_tokenizer(str(tiny_model))
    stub = Stub(tok, eos=tok.eos_token_id or 2, running=5, kv_tokens=2048, dev_mode=dev_mode)
    server, url = stub.run()
    lt = LoopThread()
    engine = build_engine(stub_settings(tiny_model, url))
    try:
        # When the engine starts
        lt.run(engine.start())
        # Then it runs what /server_info says where the server has it, else what fleet asked; its KV tokens
        # come from /server_info or /metrics
        assert engine.max_running == (5 if dev_mode else engine.asked_running)
        assert engine.kv_tokens == 2048
        lt.run(engine.shutdown())
    finally:
        server.shutdown()
        lt.close()
