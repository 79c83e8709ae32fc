"""The real sglang 0.5.23 Engine, on a CPU, through fleet's real worker processes.

One `fleet run --engine sglang` job and one bare `sglang.Engine` (tests/sglang_cpu/bare_engine.py)
serve the assertions here: an engine takes 20-45 s to start on a CPU. One more job runs on two
workers, the first stopped mid-generation, and is compared with that same bare engine. The loader that lets the
CUDA-only kernel package import (tests/sglang_cpu/sitecustomize.py) is on every process's
PYTHONPATH. Runs in the sglang virtualenv (.ci/run); elsewhere it skips.

Each edge the stand-in (tests/fake_sglang) models and a CPU can show is checked against the
real engine here; the ones a CPU cannot show (GPU memory, the state pool) stay the stand-in's.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from fleet.model.reasoning import split_reasoning
from fleet.model.rendering import load_tokenizer, render_ids
from fleet.records import GenRequest, Message, Sampling, prompt_digest
from fleet.worker.process.enginehost import admission_limit
from tests.fleetproc import check_loops_stopped, engine_below, hand_over, loop_job_lines, read_jsonl
from tests.modelkit import loop_model_fixture, tiny_model_fixture  # noqa: F401
from tests.sglangcpu import CPU_KWARGS, CPU_SETTINGS_ENV, have_real_sglang, process_env, run_bare

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not have_real_sglang(), reason="needs the real sglang (ops/sglang-venv.sh)"),
    # real engines on 2 cores shared with other work: the module's job and its bare engine (the
    # first test's setup) took over 600 s beside a load of 10 on a fresh machine
    pytest.mark.timeout(2400),
]

EFFECTIVE = CPU_KWARGS["max_total_tokens"] // 2  #: resolve_max_num_reqs: min(asked, tokens // 2)
ASKED = EFFECTIVE + 104  #: max_running_requests fleet asks: more than the pool holds
GREEDY = 8  #: records compared token for token with the bare engine
MAX_TOKENS = 16
#: the record the scheduler aborts after its first output (tests/sglang_cpu/sitecustomize.py, SGLANG_TEST_ABORT_RID),
#: as its own running timeout aborts one (HTTP 503); the test chooses it, so no other request of a busy machine
#: meets a timeout. It asks for this many tokens, far more than one output carries
LONG_OUTPUT = 2000
CLIPPED_PROMPT = 2036  #: pre-tokenized: 12 tokens of room left in the 2,048-token context, 500 asked
EOS_FREE = 400  #: the bare engine shows that record's prompt gives no EOS this early
STALL_S = 10  #: FLEET_STALL_S of the frozen-scheduler test: longer than any prefill of its prompts here
CONTINUED_MAX_TOKENS = 1800  #: greedy answers to CONTINUED's prompts run this long without an EOS (the bare engine);
#: long enough to outlast the first two polls (0.5 s each) on a fast CPU: an idle 2-core box makes ~850 tokens a
#: second per record here, and at 600 a CI run's records all ended before its SIGTERM
#: the records a worker's SIGTERM stops mid-generation and another worker finishes, and the frozen-scheduler
#: test's (each its own job); the bare engine of `real_job` answers them too
CONTINUED = [{"id": f"c{i}", "messages": [{"role": "user", "content": f"def f{i}(x): return x * {i}"}],
              "sampling": {"temperature": 0, "max_tokens": CONTINUED_MAX_TOKENS}} for i in range(4)]
#: beside them in the hand-over, at the head of each chunk: rows that end early while their chunk runs on
#: (greedy, cut at 24 tokens; sampled under the model's own sampling, ending on its end id at various lengths)
#: and one whose repetition penalty SGLang counts over output ids only: it cannot be continued, so it starts
#: again from token 0
HANDOVER_EXTRA = [
    [{"id": "e0", "prompt": "def g(x):", "sampling": {"temperature": 0, "max_tokens": 24}},
     {"id": "s0", "messages": [{"role": "user", "content": "Question 0?"}], "sampling": {"max_tokens": 200}},
     {"id": "p0", "messages": [{"role": "user", "content": "def p(x): return -x"}],
      "sampling": {"temperature": 0, "repetition_penalty": 1.1, "max_tokens": CONTINUED_MAX_TOKENS}}],
    [{"id": "e1", "prompt": "class B:", "sampling": {"temperature": 0, "max_tokens": 24}},
     *({"id": f"s{i}", "messages": [{"role": "user", "content": f"Question {i}?"}], "sampling": {"max_tokens": 200}}
       for i in (1, 2))],
]


def _procs_with(marker: str) -> list[int]:
    """Live processes whose environment carries `marker` (this job's data directory)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and any(marker in value for value in proc.environ().values()):
                found.append(proc.pid)
    return found


@pytest.fixture(scope="module")
def real_job(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> dict[str, Any]:
    """A job through `fleet run --engine sglang` on one real worker, then the bare engine on
    the same prompt ids; returns what both produced."""
    tmp = tmp_path_factory.mktemp("real-sglang")
    tok = load_tokenizer(str(tiny_model))
    records = [{"id": f"g{i}", "prompt": f"def f{i}(x):\n    return x * {i}"} for i in range(GREEDY - 1)]
    records.append({"id": f"g{GREEDY - 1}", "messages": [{"role": "user", "content": "Say hello."}]})
    records += [
        {"id": "clipped", "input_ids": [5 + i % 1000 for i in range(CLIPPED_PROMPT)], "sampling": {"max_tokens": 500}},
        {"id": "aborted", "prompt": "class A:\n    def run(self):", "sampling": {"max_tokens": LONG_OUTPUT}},
    ]
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    data = tmp / "data"
    env = process_env(
        {
            **CPU_SETTINGS_ENV,
            "FLEET_DATA_DIR": str(data),
            "FLEET_SGLANG__MAX_RUNNING_REQUESTS": str(ASKED),
            "FLEET_SAMPLING__TEMPERATURE": "0",
            "FLEET_RETURN_OUTPUT_IDS": "true",
            "SGLANG_TEST_ABORT_RID": "/aborted/",
        }
    )
    fleet = [sys.executable, "-m", "fleet"]
    began = time.monotonic()
    run = subprocess.run(
        [*fleet, "run", str(prompts), "--job", "real", "--engine", "sglang", "--model", str(tiny_model),
         "--workers", "1", "--chunk-size", "4", "--max-tokens", str(MAX_TOKENS)],
        env=env, cwd=tmp, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    run_s = time.monotonic() - began
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = tmp / "out.jsonl"
    export = subprocess.run([*fleet, "export", "--job", "real", "--out", str(out)], env=env, cwd=tmp,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert export.returncode == 0, export.stderr[-3000:]
    rows = {r["id"]: r for r in read_jsonl(out)}
    deadline = time.monotonic() + 120  # SGLang's processes wind down slower on a busy machine
    while _procs_with(str(data)) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _procs_with(str(data))
    logs = "\n".join(p.read_text(errors="replace") for p in data.rglob("*.log"))

    # The same prompt ids, as fleet renders them, through a bare engine: greedy and probes
    def ids_of(r: dict[str, Any]) -> list[int]:
        request = GenRequest(
            record_id=r["id"], chunk=0, sample=0, sampling=Sampling(max_tokens=1, seed=0), prompt=r.get("prompt"),
            messages=[Message(**m) for m in r["messages"]] if "messages" in r else None,
            input_ids=r.get("input_ids"),
        )  # fmt: skip
        return render_ids(tok, request)

    ids = {r["id"]: ids_of(r) for r in [*records, *CONTINUED]}
    context = 2048  # the tiny model's max_position_embeddings
    greedy = [[ids[f"g{i}"], MAX_TOKENS] for i in range(GREEDY)]
    greedy += [[ids["clipped"], context - len(ids["clipped"])], [ids["aborted"], EOS_FREE]]
    greedy += [[ids[r["id"]], CONTINUED_MAX_TOKENS] for r in CONTINUED]
    kwargs = {"model_path": str(tiny_model), "dtype": "float32", "mem_fraction_static": 0.05,
              "max_running_requests": ASKED, "log_level": "warning", **CPU_KWARGS}  # fmt: skip
    spec = {"kwargs": kwargs, "greedy": greedy, "eos": [2, 0], "context_probe": [5] * (context + 10)}
    bare = run_bare(spec, tmp / "bare.json")
    return {"rows": rows, "ids": ids, "bare": bare, "logs": logs, "left": left, "run_s": run_s,
            "stderr": run.stderr}  # fmt: skip


def test_real_sglang_job_finishes_through_real_workers(real_job: dict[str, Any]) -> None:
    rows = real_job["rows"]
    assert set(rows) == {*(f"g{i}" for i in range(GREEDY)), "clipped", "aborted"}
    assert all(rows[k]["finish_reason"] in ("stop", "length") for k in rows if k != "aborted")
    print(f"fleet run (one real worker, start included): {real_job['run_s']:.1f}s; "
          f"bare engine start {real_job['bare']['start_s']:.1f}s")  # fmt: skip


def test_real_sglang_greedy_records_are_the_bare_engines_tokens(real_job: dict[str, Any]) -> None:
    rows, ids, bare = real_job["rows"], real_job["ids"], real_job["bare"]["greedy"]
    # every answer says how often SGLang retracted it, which fleet keeps per record
    assert all("num_retractions" in r["meta_keys"] for r in bare)
    assert all(rows[f"g{i}"]["retractions"] == 0 for i in range(GREEDY))
    for i in range(GREEDY):
        row = rows[f"g{i}"]
        # the engine saw exactly the ids the bare engine got
        assert row["prompt_digest"] == prompt_digest(ids[f"g{i}"])
        assert row["output_ids"] == bare[i]["output_ids"], f"g{i}"
    # and the over-long record, clipped to the context, too
    assert rows["clipped"]["output_ids"] == bare[GREEDY]["output_ids"]


def test_real_sglang_gate_is_sized_from_what_the_engine_runs(real_job: dict[str, Any]) -> None:
    state = real_job["bare"]["internal_state"]
    # the real scheduler lowers what was asked, and reports it where the engine reads it back
    assert state["effective_max_running_requests_per_dp"] == EFFECTIVE < ASKED
    assert state["token_capacity"] == CPU_KWARGS["max_total_tokens"]
    logs = real_job["logs"]
    assert f"sglang runs {EFFECTIVE} requests at once, not the {ASKED} asked" in logs
    assert f"admission gate {admission_limit(EFFECTIVE)} requests (engine runs {EFFECTIVE})" in logs


def test_real_sglang_over_long_prompt_is_clipped_not_failed(real_job: dict[str, Any]) -> None:
    row, prompt = real_job["rows"]["clipped"], real_job["ids"]["clipped"]
    context = real_job["bare"]["context_length"]
    assert row["prompt_tokens"] == len(prompt) == CLIPPED_PROMPT > context - 500  # 500 asked would not fit
    assert row["finish_reason"] in ("stop", "length")
    # SGLang's scheduler runs to max_req_len - prompt - 1, with max_req_len = context - 1
    # (init_req_max_new_tokens): two short of the context, which is what fleet asks (its record then
    # passes the audit: a length cut that filled the context the engine allowed)
    assert row["prompt_tokens"] + row["completion_tokens"] <= context - 2
    if row["finish_reason"] == "length":
        assert row["prompt_tokens"] + row["completion_tokens"] == context - 2


def test_real_sglang_abort_mid_generation_fails_that_record_alone(real_job: dict[str, Any]) -> None:
    # The bare engine shows this prompt generates on without an EOS, so only the abort ends it
    reference = real_job["bare"]["greedy"][GREEDY + 1]
    assert reference["finish_reason"]["type"] == "length" and len(reference["output_ids"]) == EOS_FREE
    row = real_job["rows"]["aborted"]
    assert row["finish_reason"] == "error", {k: v for k, v in row.items() if k not in ("output_ids", "output")}
    assert "(503)" in row["error"] and "aborted by the test" in row["error"], row["error"]


def test_real_sglang_log_lines_survive_and_shutdown_leaves_no_process(real_job: dict[str, Any]) -> None:
    # SGLang's Engine() calls basicConfig(force=True) in the worker: fleet's lines still reach its log
    assert not real_job["bare"]["host_handler_kept"]  # what the real Engine does to a host's handlers
    assert "engine ready" in real_job["logs"]
    # no worker, scheduler or detokenizer outlives the run
    assert real_job["left"] == []


def test_real_sglang_records_stopped_by_sigterm_are_continued_by_another_worker_token_for_token(
    real_job: dict[str, Any], tiny_model: Path, tmp_path: Path, redis_server: Any, clean_env: None
) -> None:
    # Given a greedy job of four long records in two chunks, against a real Redis; when host A gets
    # SIGTERM while every record is generating, and host B finishes the job (tests/fleetproc.hand_over)
    env = process_env({**CPU_SETTINGS_ENV, "FLEET_ENGINE": "sglang", "FLEET_MODEL": str(tiny_model),
                       "FLEET_BROKER_URL": redis_server.url})  # the store: tests/fleetproc.memory_dir
    records = [*HANDOVER_EXTRA[0], *CONTINUED[:2], *HANDOVER_EXTRA[1], *CONTINUED[2:]]
    done = hand_over(tmp_path, env, redis_server.port, records, timeout=600,  # every record audited against its ids
                     engine=engine_below("sglang::scheduler"))
    by_id = {row["id"]: row for row in done.rows}
    rows = [by_id[r["id"]] for r in CONTINUED]
    # And the rows that ended early are what their run made; the penalised one started again from token 0
    assert [by_id[i]["completion_tokens"] for i in ("e0", "e1")] == [24, 24]
    assert all(by_id[f"s{i}"]["finish_reason"] in ("stop", "length") for i in range(3))
    assert by_id["p0"]["continued_at"] is None and done.restarted == 1 and done.made_twice > 0
    # Then every greedy record equals the bare engine's greedy output for its prompt ids, token for token
    bare = real_job["bare"]["greedy"][GREEDY + 2 :]
    assert [len(b["output_ids"]) for b in bare] == [CONTINUED_MAX_TOKENS] * len(CONTINUED)  # no EOS: they ran long
    for row, b in zip(rows, bare, strict=True):
        assert row["prompt_digest"] == prompt_digest(real_job["ids"][row["id"]])
        assert row["output_ids"] == b["output_ids"], row["id"]
        # And a continued record's text, decoded from all its ids, is the bare engine's (the prompt opened <think>)
        if row.get("continued_at"):
            assert (row["reasoning"], row["output"]) == split_reasoning(b["text"], True), row["id"]


# -- the stand-in's edges, checked against the real engine ---------------------------------------


def _fake() -> Any:
    import importlib.util

    path = Path(__file__).parent / "fake_sglang" / "sglang" / "__init__.py"
    spec = importlib.util.spec_from_file_location("fake_sglang_edges", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_real_sglang_refuses_what_the_stand_in_refuses(real_job: dict[str, Any]) -> None:
    fake, real = _fake(), real_job["bare"]["refusals"]
    context = real_job["bare"]["context_length"]
    manager = fake.TokenizerManager(context, 0, None)
    for name, ids, params in (
        ("over_context", [5] * (context + 10), {"max_new_tokens": 4}),
        ("over_context_with_output", real_job["ids"]["g0"], {"max_new_tokens": context}),
        ("scheduler_input_limit", [5] * (context - 6), {"max_new_tokens": 1}),
    ):
        with pytest.raises(ValueError) as got:
            manager.validate(ids, params)
            manager.scheduler_validate(ids)
        assert real[name]["type"] == "ValueError", real[name]
        assert str(got.value) == real[name]["message"], name
    with pytest.raises(ValueError) as got:
        fake.verify_sampling({"top_k": 0})
    assert real["top_k_zero"]["type"] == "ValueError", real["top_k_zero"]
    assert str(got.value) == real["top_k_zero"]["message"]


def test_real_sglang_reports_an_abort_as_the_engine_maps_it(real_job: dict[str, Any]) -> None:
    from fleet.engines.sglang.engine import finish_reason
    from fleet.errors import RecordError

    aborted = real_job["bare"]["aborted"]
    # an abort without an HTTP status is a finished request whose reason is "abort"
    assert aborted["meta_info"]["finish_reason"]["type"] == "abort", aborted
    assert aborted["output_tokens"] < 1500
    with pytest.raises(RecordError, match="'abort'"):
        finish_reason(aborted["meta_info"])


def test_real_sglang_sync_server_info_fails_on_a_running_loop(real_job: dict[str, Any]) -> None:
    # why fleet awaits get_internal_state on its loop, as the stand-in forces it to
    failed = real_job["bare"]["server_info_on_a_running_loop"]
    assert failed is not None and failed["type"] == "RuntimeError", failed


# -- a frozen scheduler: the engine watchdog (fleet.worker.process.watchdog) -----------------------------


@pytest.mark.timeout(2400)  # three engine starts (the bare one in real_job): 20-45 s each, minutes on loaded cores
def test_real_sglang_frozen_scheduler_is_declared_stalled_the_job_ends_on_its_restart_and_it_dies_with_its_launcher(
    tmp_path: Path, tiny_model: Path, redis_server: Any, clean_env: None, real_job: dict[str, Any]
) -> None:
    from tests.fleetproc import frozen_engine_job

    # Given a greedy job of two chunks on one `fleet worker --engine sglang` host
    env = process_env({**CPU_SETTINGS_ENV, "FLEET_ENGINE": "sglang", "FLEET_MODEL": str(tiny_model),
                       "FLEET_BROKER_URL": redis_server.url, "FLEET_SAMPLING__TEMPERATURE": "0"})  # fmt: skip
    # When its scheduler is frozen (SIGSTOP) mid-generation; then it is declared stalled, killed, and
    # the job ends on the restarted engine, each record once (tests/fleetproc.py);
    # and when the launcher is then killed with SIGKILL, no process of the restarted engine (its scheduler and
    # detokenizer below the worker) outlives it
    rows = frozen_engine_job(tmp_path, env, "s", "sglang::scheduler", CONTINUED, STALL_S, lease_s=10,
                             launcher_kill=("sglang::scheduler", "sglang::detokenizer"))
    # and the greedy records equal the bare engine's uninterrupted ones
    bare = real_job["bare"]["greedy"][GREEDY + 2 :]
    assert [row["output_ids"] for row in rows] == [g["output_ids"] for g in bare]
    assert all(g["finish_reason"]["type"] == "length" for g in bare)  # no EOS: each ran to its max tokens


# -- the repetition stop on the real engine (fleet.model.repetition) -----------------------------


def test_real_sglang_job_on_the_loop_model_stops_greedy_loops_and_never_sampled_rows(
    tmp_path: Path, loop_model: Path, clean_env: None
) -> None:
    # Given a job on the loop model: 4 greedy records, 4 sampled ones, 1,024 tokens allowed
    lines = loop_job_lines()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = process_env({**CPU_SETTINGS_ENV, "FLEET_DATA_DIR": str(tmp_path / "data"), "FLEET_RETURN_OUTPUT_IDS": "true"})
    fleet = [sys.executable, "-m", "fleet"]
    # When it runs through a real worker on SGLang, whose stream reports every 16 tokens
    run = subprocess.run([*fleet, "run", str(prompts), "--job", "loops", "--engine", "sglang", "--model",
                          str(loop_model), "--workers", "1", "--chunk-size", "4", "--max-tokens", "1024"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = tmp_path / "o.jsonl"
    export = subprocess.run([*fleet, "export", "--job", "loops", "--out", str(out)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert export.returncode == 0, export.stderr[-3000:]
    rows = {r["id"]: r for r in read_jsonl(out)}
    status = subprocess.run([*fleet, "status", "--job", "loops", "--json"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    # Then the greedy rows are stopped as loops and the sampled ones never (tests/fleetproc.py)
    check_loops_stopped(rows, json.loads(status.stdout)["records_repetition"])
