"""The SGLang adapter: kwargs built without sglang, and the engine against a stand-in module.

The stand-in (tests/fake_sglang) has sglang 0.5.23's Engine / async_generate contract. A
contract test against the real sglang runs where it is importable (ops/sglang-venv.sh).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from fleet.engines import build_engine
from fleet.engines.base import GenResult, prompt_digest
from fleet.engines.sglang import SglangEngine, engine_kwargs, is_hybrid
from fleet.errors import EngineError, RecordError
from fleet.prompting import load_tokenizer, render_ids
from fleet.settings import Settings
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


@pytest.fixture
def fake_sglang(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
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
    }
    assert "sglang" not in sys.modules


def test_hybrid_models_with_mtp_get_the_extra_buffer(tmp_path: Path) -> None:
    model = hybrid_model(tmp_path)

    assert engine_kwargs(sg_settings(model))["mamba_radix_cache_strategy"] == "extra_buffer"
    assert "mamba_radix_cache_strategy" not in engine_kwargs(sg_settings(model, mtp=False))


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
        results[i] = [f.result(30) for f in futures]

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
    engine = started(loop_thread, sg_settings(tiny_model, mtp=False, engine_kwargs={"fake_tokens": 5}))
    request = chat("m", max_tokens=50, stop=("END",))

    result = loop_thread.run(engine.generate(request))

    [fake] = fake_sglang.instances
    prompt_ids = render_ids(load_tokenizer(str(tiny_model)), request)
    sent = fake.requests[-1]
    assert sent["input_ids"] == prompt_ids
    assert sent["sampling_params"] == {
        "temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "max_new_tokens": 50,
        "stop_token_ids": engine.defaults["eos_token_ids"], "stop": ["END"],
    }  # fmt: skip
    assert isinstance(result, GenResult)
    assert result.finish_reason == "stop"
    assert (result.prompt_tokens, result.completion_tokens) == (len(prompt_ids), 5)
    assert result.reasoning == f"fake reasoning over {len(prompt_ids)} tokens"
    assert result.text == "fake answer of 5 tokens"
    assert len(result.output_ids) == 5 and result.output_ids[-1] == 2
    assert result.meta["cached_tokens"] == len(prompt_ids) // 2
    assert (result.meta["spec_accept_length"], result.meta["spec_verify_ct"]) == (2.5, 2)
    assert result.meta["latency_s"] >= 0


def test_length_finish_and_no_ids_unless_asked(fake_sglang, tiny_model: Path, loop_thread: LoopThread) -> None:
    engine = started(loop_thread, sg_settings(tiny_model, mtp=False))
    request = raw("l", max_tokens=3, top_k=0)
    request.return_output_ids = False

    result = loop_thread.run(engine.generate(request))

    assert (result.finish_reason, result.completion_tokens, result.output_ids) == ("length", 3, None)
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

    async def three() -> list:
        reqs = [raw("long", "word " * 100), raw("aborted", "word " * 12), raw("ok", "short", max_tokens=100)]
        return await asyncio.gather(*(engine.generate(r) for r in reqs), return_exceptions=True)

    long, aborted, ok = loop_thread.run(three())
    engine.context = None  # when fleet cannot know the context, SGLang's own check decides
    refused = loop_thread.submit(engine.generate(raw("refused", "word " * 100))).exception(10)

    assert isinstance(long, RecordError) and "context is 64" in str(long)
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
    outcomes = [f.exception(10) for f in futures]
    calls = fake.calls
    later = loop_thread.submit(engine.generate(chat("after"))).exception(10)

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


# -- the real sglang, where it is installed (ops/sglang-venv.sh) -------------------------------------


@pytest.fixture
def real_server_args() -> type:
    _drop_sglang_modules()
    module = pytest.importorskip("sglang.srt.server_args")
    assert not Path(module.__file__).is_relative_to(FAKE)
    return module.ServerArgs


def validate(server_args: type, kwargs: dict) -> None:
    args = server_args(**kwargs, device="cpu")
    args.resolve_once()
    args.check_server_args()


def test_real_sglang_accepts_what_engine_args_prints(real_server_args: type, tiny_model: Path) -> None:
    from fleet.cli import app

    result = CliRunner().invoke(app, ["engine-args", "--model", str(tiny_model)], env={"FLEET_SGLANG__MTP": "false"})
    assert result.exit_code == 0, result.output

    validate(real_server_args, json.loads(result.stdout))


def test_real_sglang_refuses_what_we_guard_against(real_server_args: type, tiny_model: Path) -> None:
    kwargs = engine_kwargs(sg_settings(tiny_model, mtp=False))
    with pytest.raises(Exception, match="context"):
        validate(real_server_args, {**kwargs, "context_length": 10 * 2048})
    with pytest.raises(Exception, match="needs mamba state"):
        validate(real_server_args, {**kwargs, "mamba_radix_cache_strategy": "extra_buffer"})


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
    # And an id past the model's vocabulary fails this record alone, as SGLang refuses it
    request.input_ids = [5, 10**6]
    with pytest.raises(RecordError, match="vocab size"):
        loop_thread.run(engine.generate(request))
