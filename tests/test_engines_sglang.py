"""The SGLang adapter: kwargs built without sglang, and the engine against a stand-in module.

The stand-in (tests/fake_sglang) has sglang 0.5.23's Engine / async_generate contract. A
contract test against the real sglang runs where it is importable (ops/sglang-venv.sh).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from fleet.engines.sglang.engine import SglangEngine, engine_kwargs
from fleet.engines.specs import build_engine
from fleet.errors import ConfigError, EngineError, RecordError
from fleet.metrics import ENGINE_MAX_RUNNING
from fleet.model.config import is_hybrid
from fleet.model.reasoning import split_reasoning
from fleet.model.rendering import load_tokenizer, render_ids
from fleet.records import GenResult, prompt_digest
from fleet.settings import Settings
from fleet.worker.process.enginehost import EngineHost, admission_limit
from tests.modelkit import LoopThread, chat, loop_thread_fixture, raw, tiny_model_fixture  # noqa: F401

FAKE = Path(__file__).parent / "fake_sglang"
ROOT = Path(__file__).resolve().parents[1]


def sg_settings(model: Path | str, **sglang) -> Settings:
    return Settings(engine="sglang", model=str(model), sglang=sglang)


def hybrid_model(tmp_path: Path, arch: str = "Qwen3_5ForConditionalGeneration") -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": "qwen3_5"}))
    return tmp_path


def _drop_sglang_modules() -> None:
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]


@pytest.fixture(name="fake_sglang")
def fake_sglang_fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(FAKE))
    import sglang

    assert Path(sglang.__file__).is_relative_to(FAKE)
    sglang.instances.clear()
    yield sglang
    _drop_sglang_modules()


# -- engine_kwargs: pure, no sglang ---------------------------------------------------------------


def test_default_kwargs_are_bf16_mtp_and_an_explicit_running_limit(tiny_model: Path) -> None:
    kwargs = engine_kwargs(sg_settings(tiny_model))

    assert kwargs == {
        "model_path": str(tiny_model.resolve()),
        "dtype": "bfloat16",
        "tp_size": 1,
        "max_running_requests": 256,
        "speculative_algorithm": "NEXTN",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "log_level": "warning",
        "incremental_streaming_output": True,
        "stream_interval": 16,
    }
    assert "sglang" not in sys.modules


def test_hybrid_models_run_without_the_radix_cache_unless_prompts_share_prefixes(tmp_path: Path) -> None:
    model = hybrid_model(tmp_path)

    # Unique prompts, one sample each: radix off, 1 state slot per request instead of 5
    kwargs = engine_kwargs(sg_settings(model))
    assert kwargs["disable_radix_cache"] is True
    assert "mamba_radix_cache_strategy" not in kwargs  # SGLang resolves it; fleet never forces it
    # Shared prefixes, or n > 1: radix on, and the state pool's share of memory is explicit
    shared = engine_kwargs(sg_settings(model, shared_prefixes=True))
    assert "disable_radix_cache" not in shared and shared["mamba_full_memory_ratio"] == 0.9
    n4 = Settings(engine="sglang", model=str(model), sampling={"n": 4})
    assert "disable_radix_cache" not in engine_kwargs(n4)
    assert "disable_radix_cache" not in engine_kwargs(sg_settings(model, radix_cache="on"))


def test_hierarchical_cache_without_the_radix_cache_is_refused_at_start(tmp_path: Path) -> None:
    model = hybrid_model(tmp_path)
    with pytest.raises(ConfigError, match="enable_hierarchical_cache needs the radix cache"):
        engine_kwargs(sg_settings(model, enable_hierarchical_cache=True))
    assert engine_kwargs(sg_settings(model, enable_hierarchical_cache=True, radix_cache="on"))[
        "enable_hierarchical_cache"
    ]


def test_hybrid_is_read_from_the_config() -> None:
    assert is_hybrid({"architectures": ["Qwen3NextForCausalLM"]})
    assert is_hybrid({"architectures": ["X"], "text_config": {"layer_types": ["linear_attention", "full_attention"]}})
    assert not is_hybrid({"architectures": ["Qwen3ForCausalLM"], "layer_types": ["full_attention"]})
    assert not is_hybrid({})


def test_optional_fields_appear_only_when_set(tiny_model: Path) -> None:
    kwargs = engine_kwargs(
        sg_settings(
            tiny_model, mtp=False, max_running_requests=64, mem_fraction_static=0.85, context_length=1024,
            chunked_prefill_size=4096, enable_hierarchical_cache=True, hicache_ratio=2.0,
            hicache_write_policy="write_through", deterministic=True, tp_size=2,
            engine_kwargs={"log_level": "info", "max_running_requests": 96},
        )
    )  # fmt: skip

    assert kwargs == {
        "model_path": str(tiny_model.resolve()),
        "dtype": "bfloat16",
        "tp_size": 2,
        "max_running_requests": 96,  # engine_kwargs pass through last
        "mem_fraction_static": 0.85,
        "context_length": 1024,
        "chunked_prefill_size": 4096,
        "enable_hierarchical_cache": True,
        "hicache_ratio": 2.0,
        "hicache_write_policy": "write_through",
        "enable_deterministic_inference": True,
        "log_level": "info",
        "incremental_streaming_output": True,
        "stream_interval": 16,
    }
    assert "hicache_size" not in engine_kwargs(sg_settings(tiny_model, hicache_size=64))


def test_a_model_that_is_not_here_is_passed_as_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    kwargs = engine_kwargs(sg_settings("org/not-downloaded-model"))
    assert kwargs["model_path"] == "org/not-downloaded-model"
    assert "mamba_radix_cache_strategy" not in kwargs


def test_cli_prints_the_kwargs_as_json(tiny_model: Path) -> None:
    from fleet.cli import app

    result = CliRunner().invoke(app, ["engine-args", "--engine", "sglang", "--model", str(tiny_model)])

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == engine_kwargs(sg_settings(tiny_model))


@pytest.mark.slow
def test_cli_engine_args_never_imports_sglang(tiny_model: Path) -> None:
    code = (
        "import sys; from fleet.cli import main; sys.argv=['fleet','engine-args','--model',sys.argv[1]];"
        "\ntry:\n main()\nexcept SystemExit: pass\nassert 'sglang' not in sys.modules"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tiny_model)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["dtype"] == "bfloat16"


# -- SglangEngine against the stand-in -----------------------------------------------------------


def started(lt: LoopThread, settings: Settings) -> SglangEngine:
    engine = build_engine(settings)
    assert isinstance(engine, SglangEngine)
    lt.run(engine.start())
    return engine


def test_engine_is_built_once_on_the_loop_thread(fake_sglang, tiny_model: Path, loop_thread: LoopThread) -> None:
    settings = sg_settings(tiny_model, mtp=False, engine_kwargs={"fake_step_s": 0})

    engine = started(loop_thread, settings)

    [fake] = fake_sglang.instances
    assert fake.thread is loop_thread.thread
    assert fake.loop is loop_thread.loop
    assert fake.kwargs == {k: v for k, v in engine_kwargs(settings).items() if not k.startswith("fake_")}
    assert engine.max_running == 256


def test_k_slots_share_one_engine_and_keep_it_full(fake_sglang, tiny_model: Path, loop_thread: LoopThread) -> None:
    # Given S=16 engine slots, chunks of C=16, and the derived K = ceil(16 x 16 / 16) = 16 (max_slots 32)
    settings = sg_settings(tiny_model, mtp=False, max_running_requests=16, engine_kwargs={"fake_step_s": 0.002})
    settings.chunk_size = 16
    k = settings.resolved_slots()
    assert k == 16
    engine = started(loop_thread, settings)
    results: dict[int, list] = {}

    # When K slot threads each submit a chunk's requests to the one loop
    def slot(i: int) -> None:
        futures = [loop_thread.submit(engine.generate(chat(f"{i}-{j}", max_tokens=8))) for j in range(8)]
        results[i] = [f.result(120) for f in futures]

    threads = [threading.Thread(target=slot, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    # Then one engine served all of them, as many at once as it has slots
    [fake] = fake_sglang.instances
    assert sum(len(r) for r in results.values()) == fake.calls == k * 8
    assert fake.peak == 16


def test_default_k_follows_the_engines_slots() -> None:
    settings = Settings(engine="sglang", chunk_size=512, sglang={"max_running_requests": 256})
    assert settings.resolved_slots() == 8  # K x C = 16 x S
    settings = Settings(engine="sglang", chunk_size=256, sglang={"max_running_requests": 256})
    assert settings.resolved_slots() == 16


def test_meta_info_and_sampling_are_mapped(fake_sglang, tiny_model: Path, loop_thread: LoopThread) -> None:
    engine = started(loop_thread, sg_settings(tiny_model, mtp=False,
                                              engine_kwargs={"fake_tokens": 5, "fake_retractions": 2}))  # fmt: skip
    request = chat("m", max_tokens=50, stop=("END",))

    result = loop_thread.run(engine.generate(request))

    [fake] = fake_sglang.instances
    prompt_ids = render_ids(load_tokenizer(str(tiny_model)), request)
    sent = fake.requests[-1]
    assert sent["input_ids"] == prompt_ids
    assert sent["sampling_params"] == {
        "temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "max_new_tokens": 50,
        "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "stop_token_ids": engine.eos_ids, "stop": ["END"],
    }  # fmt: skip
    assert isinstance(result, GenResult)
    assert result.finish_reason == "stop"
    assert (result.prompt_tokens, result.completion_tokens) == (len(prompt_ids), 5)
    assert len(result.output_ids) == 5 and result.output_ids[-1] == 2
    # the text is SGLang's detokenizer's, joined from the stream's pieces: what the ids decode to
    decoded = load_tokenizer(str(tiny_model)).decode(result.output_ids, skip_special_tokens=True)
    assert decoded and (result.reasoning, result.text) in {split_reasoning(decoded, opened) for opened in (True, False)}
    assert result.meta["cached_tokens"] == len(prompt_ids) // 2
    assert (result.meta["spec_accept_length"], result.meta["spec_verify_ct"]) == (2.5, 2)
    assert result.meta["latency_s"] >= 0
    assert result.meta["retractions"] == 2  # meta_info num_retractions


def test_length_finish_and_top_k_off(fake_sglang, tiny_model: Path, loop_thread: LoopThread) -> None:
    engine = started(loop_thread, sg_settings(tiny_model, mtp=False))
    request = raw("l", max_tokens=3, top_k=0)
    request.return_output_ids = False

    result = loop_thread.run(engine.generate(request))

    # the engine always hands back the ids (the worker checkpoints them); the record keeps them only when asked
    assert (result.finish_reason, result.completion_tokens, len(result.output_ids)) == ("length", 3, 3)
    sent = fake_sglang.instances[0].requests[-1]["sampling_params"]
    assert sent["top_k"] == -1  # SGLang's "no top-k"
    assert "sampling_seed" not in sent  # seeds need enable_deterministic_inference


def test_seeds_are_sent_only_with_deterministic_inference(fake_sglang, tiny_model: Path, loop_thread) -> None:
    engine = started(loop_thread, sg_settings(tiny_model, mtp=False, deterministic=True))

    loop_thread.run(engine.generate(chat("d", max_tokens=2, seed=1234)))

    [fake] = fake_sglang.instances
    assert fake.kwargs["enable_deterministic_inference"] is True
    assert fake.requests[-1]["sampling_params"]["sampling_seed"] == 1234


def test_over_length_and_aborted_records_fail_alone(fake_sglang, tiny_model: Path, loop_thread) -> None:
    settings = sg_settings(tiny_model, mtp=False, context_length=64, engine_kwargs={"fake_abort_over": 30})
    engine = started(loop_thread, settings)
    # The tiny tokenizer is trained on the running Python's stdlib source, so token counts
    # differ between Python builds: size the aborted prompt (over 30 tokens, within 64) by it.
    tok = load_tokenizer(str(tiny_model))
    words = next(n for n in range(1, 64) if len(tok("word " * n)["input_ids"]) > 30)
    assert len(tok("word " * words)["input_ids"]) < 48

    async def three() -> list:
        reqs = [raw("long", "word " * 100), raw("aborted", "word " * words), raw("ok", "short", max_tokens=100)]
        return await asyncio.gather(*(engine.generate(r) for r in reqs), return_exceptions=True)

    long, aborted, ok = loop_thread.run(three())
    engine.context = None  # when fleet cannot know the context, SGLang's own check decides
    refused = loop_thread.submit(engine.generate(raw("refused", "word " * 100))).exception(120)

    # SGLang runs a request to two short of its 64-token context (its scheduler's clip): 62 is what fits
    assert isinstance(long, RecordError) and "context is 62" in str(long)
    assert isinstance(aborted, RecordError) and "fake abort" in str(aborted)
    assert isinstance(ok, GenResult)
    assert fake_sglang.instances[0].requests[-1]["sampling_params"]["max_new_tokens"] < 64  # fits the context
    assert isinstance(refused, RecordError) and "longer than the model's context length" in str(refused)


def test_a_dead_engine_is_an_engine_error(fake_sglang, tiny_model: Path, loop_thread: LoopThread) -> None:
    engine = started(loop_thread, sg_settings(tiny_model, mtp=False, engine_kwargs={"fake_step_s": 0.05}))
    [fake] = fake_sglang.instances
    futures = [loop_thread.submit(engine.generate(chat(f"x{i}"))) for i in range(4)]
    time.sleep(0.1)

    fake.crash("scheduler process exited with code -9")
    outcomes = [f.exception(120) for f in futures]
    calls = fake.calls
    later = loop_thread.submit(engine.generate(chat("after"))).exception(120)

    assert all(isinstance(e, EngineError) for e in outcomes)
    assert isinstance(later, EngineError) and "code -9" in str(later)
    assert fake.calls == calls  # a dead engine is not asked again


def test_a_request_from_another_loop_is_refused(fake_sglang, tiny_model: Path, loop_thread: LoopThread) -> None:
    engine = started(loop_thread, sg_settings(tiny_model, mtp=False))

    with pytest.raises(EngineError, match="other than the one it started on"):
        asyncio.run(engine.generate(chat("wrong-loop")))


def test_start_failures_are_engine_errors(fake_sglang, tiny_model: Path, loop_thread, monkeypatch) -> None:
    failing = build_engine(sg_settings(tiny_model, engine_kwargs={"fake_fail_start": True}))
    with pytest.raises(EngineError, match="CUDA out of memory"):
        loop_thread.run(failing.start())

    monkeypatch.setitem(sys.modules, "sglang", None)  # not installed
    with pytest.raises(EngineError, match="needs the sglang package"):
        loop_thread.run(build_engine(sg_settings(tiny_model)).start())


def test_shutdown_shuts_the_engine_down(fake_sglang, tiny_model: Path, loop_thread: LoopThread) -> None:
    engine = started(loop_thread, sg_settings(tiny_model, mtp=False))

    loop_thread.run(engine.shutdown())

    assert fake_sglang.instances[0].shut_down
    with pytest.raises(EngineError):
        loop_thread.run(engine.generate(chat("late")))


# -- the real engine's edges (each one read from sglang 0.5.23's source into the stand-in) ----------


def test_fleets_log_lines_survive_sglangs_basicconfig(fake_sglang, tiny_model: Path, loop_thread, caplog) -> None:
    # Given fleet's own handler on the root logger at INFO
    root = logging.getLogger()
    mine = logging.StreamHandler()
    root.addHandler(mine)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        # When the engine starts (the real one calls basicConfig(level=ERROR, force=True))
        engine = started(loop_thread, sg_settings(tiny_model, mtp=False))
        # Then fleet's handler and level are back, and SGLang was asked for warnings
        assert mine in root.handlers and root.level == logging.INFO
        assert fake_sglang.instances[0].kwargs["log_level"] == "warning"
        assert engine.max_running == 256
    finally:
        root.removeHandler(mine)
        root.setLevel(level)


def test_the_effective_running_limit_is_read_back_and_warned(fake_sglang, tiny_model: Path, caplog) -> None:
    # Given an engine whose scheduler settles on 12 of the 64 requests asked
    settings = sg_settings(tiny_model, mtp=False, max_running_requests=64,
                           engine_kwargs={"fake_effective_running": 12, "fake_step_s": 0.002})  # fmt: skip
    host = EngineHost(build_engine(settings))
    with caplog.at_level(logging.WARNING, logger="fleet.engines.sglang.engine"):
        host.start(timeout_s=60)
    try:
        # Then S, and the admission gate sized from it, follow the effective value
        assert host.engine.max_running == 12
        assert host.gate is not None and host.gate._value == admission_limit(12)
        assert ENGINE_MAX_RUNNING._value.get() == 12  # the Prometheus gauge shows the real S
        assert any("runs 12 requests at once, not the 64 asked" in r.message and "max_running_requests" in r.message
                   for r in caplog.records)  # fmt: skip
        # And what is submitted beyond it queues inside the engine, never running more than 12
        futures = [host.submit(host.engine.generate(chat(f"e{i}", max_tokens=8))) for i in range(30)]
        assert all(isinstance(f.result(120), GenResult) for f in futures)
        assert fake_sglang.instances[0].peak == 12
    finally:
        host.stop()


def test_with_mtp_the_reserved_draft_tokens_are_left_out_of_the_budget(fake_sglang, tiny_model, loop_thread) -> None:
    # Given MTP (NEXTN: 3 steps x topk 1, 4 draft tokens -> 4 reserved) and a 64-token context
    settings = sg_settings(tiny_model, context_length=64, engine_kwargs={"fake_step_s": 0})
    engine = started(loop_thread, settings)
    request = raw("near-limit", "word " * 10, max_tokens=1000)

    # When a record asks for more than fits
    result = loop_thread.run(engine.generate(request))

    # Then it is clipped to context - prompt - reserved (SGLang would refuse one more), not failed
    sent = fake_sglang.instances[0].requests[-1]
    assert engine.reserved_tokens == 4
    assert len(sent["input_ids"]) + 4 + sent["sampling_params"]["max_new_tokens"] == 64
    assert result.finish_reason in ("stop", "length")


def test_an_http_status_abort_fails_the_record_and_the_engine_lives_on(fake_sglang, tiny_model, loop_thread) -> None:
    engine = started(loop_thread, sg_settings(tiny_model, mtp=False, engine_kwargs={"fake_abort_over": 20}))

    aborted = loop_thread.submit(engine.generate(raw("big", "word " * 40))).exception(120)
    after = loop_thread.run(engine.generate(raw("small", "hi", max_tokens=4)))

    assert isinstance(aborted, RecordError) and "(500)" in str(aborted)
    assert isinstance(after, GenResult)


def test_penalties_reach_sglang_and_top_k_zero_never_does(fake_sglang, tiny_model: Path, loop_thread) -> None:
    engine = started(loop_thread, sg_settings(tiny_model, mtp=False))
    sampling = {"repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.25, "top_k": 0}
    request = raw("p", "hello", max_tokens=4, **sampling)

    loop_thread.run(engine.generate(request))

    sent = fake_sglang.instances[0].requests[-1]["sampling_params"]
    assert (sent["repetition_penalty"], sent["presence_penalty"], sent["frequency_penalty"]) == (1.1, 0.5, -0.25)
    assert sent["top_k"] == -1
    with pytest.raises(ValueError, match="top_k must be -1"):  # what the stand-in, like SGLang, does with 0
        fake_sglang.verify_sampling({"top_k": 0})


# -- the real sglang, where it is installed (ops/sglang-venv.sh) -------------------------------------


@pytest.fixture
def real_server_args() -> type:
    _drop_sglang_modules()
    module = pytest.importorskip("sglang.srt.server_args")
    assert not Path(module.__file__).is_relative_to(FAKE)
    return module.ServerArgs


def validate(server_args: type, kwargs: dict) -> None:
    from fleet.engines.sglang.spec import validate_server_args

    validate_server_args(server_args, {**kwargs, "device": "cpu"})


def test_real_sglang_accepts_what_engine_args_prints(real_server_args: type, tiny_model: Path) -> None:
    from fleet.cli import app

    result = CliRunner().invoke(app, ["engine-args", "--model", str(tiny_model)], env={"FLEET_SGLANG__MTP": "false"})
    assert result.exit_code == 0, result.output

    before = dict(os.environ)
    validate(real_server_args, json.loads(result.stdout))
    # SGLang's resolve writes SGLANG_* variables into os.environ; fleet's check puts them back, so no
    # engine started later by this process inherits them
    assert dict(os.environ) == before


def test_real_sglang_refuses_what_we_guard_against(real_server_args: type, tiny_model: Path) -> None:
    kwargs = engine_kwargs(sg_settings(tiny_model, mtp=False))
    with pytest.raises(Exception, match="context"):
        validate(real_server_args, {**kwargs, "context_length": 10 * 2048})
    with pytest.raises(Exception, match="needs mamba state"):
        validate(real_server_args, {**kwargs, "mamba_radix_cache_strategy": "extra_buffer"})


QWEN = Path(__file__).parent / "fixtures" / "qwen3_6_27b"


def test_real_sglang_has_every_arg_and_param_the_stand_in_accepts(real_server_args: type) -> None:
    import inspect

    from sglang.srt.sampling.sampling_params import SamplingParams

    fake = _fake_module()
    real_fields = set(inspect.signature(real_server_args).parameters)
    assert real_fields >= fake.SERVER_ARGS, fake.SERVER_ARGS - real_fields
    values = {"max_new_tokens": 8, "stop": ["x"], "stop_token_ids": [2], "temperature": 1.0, "top_p": 1.0,
              "top_k": -1, "min_p": 0.0, "sampling_seed": 1, "ignore_eos": False, "skip_special_tokens": True,
              "no_stop_trim": False, "n": 1, "repetition_penalty": 1.0, "presence_penalty": 0.0,
              "frequency_penalty": 0.0}  # fmt: skip
    assert set(values) == fake.SAMPLING_PARAMS
    SamplingParams(**values).verify(1000)  # an unknown keyword would be a TypeError


def test_real_sglang_refuses_top_k_zero_and_takes_what_fleet_sends(real_server_args: type) -> None:
    from sglang.srt.sampling.sampling_params import SamplingParams

    from fleet.engines.wire import sglang_sampling as sampling_params
    from fleet.records import Sampling

    sent = sampling_params(
        Sampling(temperature=0.7, top_p=0.9, top_k=0, min_p=0.0, repetition_penalty=1.05, presence_penalty=1.5,
                 frequency_penalty=-0.5, max_tokens=64, seed=0),
        64, [2], False,
    )  # fmt: skip
    SamplingParams(**sent).verify(1000)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(**{**sent, "top_k": 0}).verify(1000)


def test_real_sglang_reads_back_what_the_engine_reads(real_server_args: type) -> None:
    import inspect

    from sglang.srt.managers.scheduler_components import internal_state, memory_usage
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    # awaited on fleet's loop: Engine.get_server_info would run_until_complete on a running loop
    assert inspect.iscoroutinefunction(TokenizerManager.get_internal_state)
    source = inspect.getsource(internal_state)
    assert 'state["effective_max_running_requests_per_dp"]' in source and 'state["memory_usage"]' in source
    assert '"token_capacity"' in inspect.getsource(memory_usage)


def test_real_sglang_refuses_the_hierarchical_cache_without_radix(real_server_args: type, tiny_model) -> None:
    kwargs = engine_kwargs(sg_settings(tiny_model, mtp=False))
    with pytest.raises(Exception, match="hierarchical-cache and disable-radix-cache"):
        validate(real_server_args, {**kwargs, "enable_hierarchical_cache": True, "disable_radix_cache": True})


def test_real_sglang_accepts_the_qwen36_kwargs_fleet_plans(real_server_args: type) -> None:
    # Radix off (fleet's default for unique prompts), MTP off and on: valid even on a CPU
    for mtp in (False, True):
        kwargs = engine_kwargs(sg_settings(QWEN, mtp=mtp), "h200")
        assert kwargs["disable_radix_cache"] is True and "mamba_radix_cache_strategy" not in kwargs
        validate(real_server_args, kwargs)
    # Radix on: SGLang resolves the strategy to extra_buffer itself (overlap scheduler), which
    # needs GPU state snapshots; a CPU can only show that it gets that far and no further.
    radix = engine_kwargs(sg_settings(QWEN, mtp=False, radix_cache="on"), "h200")
    assert "mamba_radix_cache_strategy" not in radix and radix["mamba_full_memory_ratio"] == 0.9
    with pytest.raises(AssertionError, match="extra_buffer requires platform support"):
        validate(real_server_args, radix)


def _fake_module() -> ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location("fake_sglang_surface", FAKE / "sglang" / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pre_tokenized_ids_are_sent_as_given(fake_sglang, tiny_model: Path, loop_thread: LoopThread) -> None:
    # Given a pre-tokenized request whose ids are not any template's rendering
    engine = started(loop_thread, sg_settings(tiny_model, mtp=False))
    request = raw("p", max_tokens=4)
    request.prompt, request.input_ids = None, [5, 900, 17, 3]
    # When it is generated
    result = loop_thread.run(engine.generate(request))
    # Then SGLang got exactly those ids, and the record counts and fingerprints them
    assert fake_sglang.instances[0].requests[-1]["input_ids"] == [5, 900, 17, 3]
    assert result.prompt_tokens == 4 and result.meta["prompt_digest"] == prompt_digest([5, 900, 17, 3])
    # And an id past the model's vocabulary fails this record alone, checked by fleet: SGLang
    # does not check it, and its scheduler's death would take the worker with it
    calls = fake_sglang.instances[0].calls
    request.input_ids = [5, 10**6]
    vocab = json.loads((tiny_model / "config.json").read_text())["vocab_size"]
    with pytest.raises(RecordError, match=rf"outside the model's vocab size \({vocab}\)"):
        loop_thread.run(engine.generate(request))
    assert fake_sglang.instances[0].calls == calls


def test_a_stream_carries_only_new_ids_and_a_continued_request_ends_as_one_run(
        fake_sglang, tiny_model: Path, loop_thread: LoopThread) -> None:
    # Given the engine with incremental streaming every 4 tokens, and one request run in one go
    engine = started(loop_thread, sg_settings(tiny_model, mtp=False, stream_interval=4, engine_kwargs={
        "fake_tokens": 30}))

    async def collect(req):
        deltas = [d async for d in engine.stream(req)]
        return [i for d in deltas for i in d.ids], deltas[-1].result, len(deltas)

    whole_ids, whole, n = loop_thread.run(collect(raw("c", max_tokens=100, top_k=0)))
    assert whole_ids == whole.output_ids and len(whole_ids) == 30 and n > 2
    # When it is continued after 11 of its ids
    cont = raw("c", max_tokens=100, top_k=0)
    cont.prefix_ids = whole.output_ids[:11]
    new_ids, result, _ = loop_thread.run(collect(cont))
    # Then SGLang got prompt + prefix with max tokens lowered, the stream only what follows,
    # and the result covers the whole sample
    sent = fake_sglang.instances[0].requests[-1]
    assert sent["input_ids"][-11:] == whole.output_ids[:11]
    assert sent["sampling_params"]["max_new_tokens"] == 100 - 11
    assert new_ids == whole.output_ids[11:]
    assert (result.output_ids, result.completion_tokens, result.finish_reason) == (whole.output_ids, 30, "stop")
