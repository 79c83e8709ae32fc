"""`fleet plan` without token figures: the reference job's shape, or a job's own (its samples
and the token means measured over its done chunks), and the plan says which; never a
one-token context."""

from __future__ import annotations

import json
import time
from pathlib import Path

from typer.testing import CliRunner

from fleet.bench.reference import REFERENCE
from fleet.model.capacity import Serving, capacity
from fleet.model.gpus import gpu_spec
from fleet.store.local import LocalStore
from fleet.store.results import ChunkStats, sample_counts
from tests.cliload import cli_app
from tests.test_status import JOB, write_manifest

QWEN = Path(__file__).parent / "fixtures" / "qwen3_6_27b"
CONFIG = json.loads((QWEN / "config.json").read_text())


def plan_json(*args: str, env: dict[str, str] | None = None) -> dict:
    res = CliRunner().invoke(cli_app(), ["plan", "--gpu", "b200", "--json", *args], env=env)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_no_figures_plan_the_reference_jobs_shape_and_say_so() -> None:
    data = plan_json("--model", str(QWEN))
    assert data["shape"].startswith("reference job (902,087 prompts")
    assert (data["prompts"], data["prompt_tokens"], data["output_tokens"]) == (
        REFERENCE.prompts, REFERENCE.prompt_tokens, REFERENCE.output_tokens)
    # the batch is sized for that context, not for one token
    want = capacity(CONFIG, gpu_spec("b200").memory_mib,
                    Serving(context_tokens=REFERENCE.prompt_tokens + REFERENCE.output_tokens))  # fmt: skip
    assert data["capacity"]["kv_bound_requests"] == want.kv_bound_requests < 200
    assert data["capacity"]["batch"] == want.batch


def test_given_figures_win_and_the_rest_is_named() -> None:
    data = plan_json("--model", str(QWEN), "--output-tokens", "500")
    assert data["output_tokens"] == 500 and data["prompt_tokens"] == REFERENCE.prompt_tokens
    assert data["shape"].startswith("given, the rest from the reference job")
    all_given = plan_json("--prompts", "10", "--prompt-tokens", "100", "--output-tokens", "200", "--params-b", "1")
    assert all_given["shape"] == "given"


def test_a_jobs_shape_comes_from_its_manifest_and_done_chunks(tmp_path: Path) -> None:
    # Given a job of 40 samples with one chunk done: 4 samples of 300 prompt and 900 output tokens
    store = LocalStore(str(tmp_path / "store"))
    write_manifest(store, chunks=10, records=40, samples=40)
    env = {"FLEET_STORE_URL": str(tmp_path / "store")}
    before = plan_json("--model", str(QWEN), "--job", JOB, env=env)
    rows = [{"id": f"r{i}", "pos": i, "sample": 0, "prompt_tokens": 300, "completion_tokens": 900,
             "finish_reason": "stop"} for i in range(4)]  # fmt: skip
    from fleet.store.layout import result_key
    from fleet.store.results import encode_result

    stats = {"job": JOB, "chunk": 0, "records": 4, **sample_counts(rows), "started": time.time() - 5,
             "finished": time.time(), "worker": "gpu0@h"}  # fmt: skip
    store.put(result_key(JOB, 0), encode_result(ChunkStats(**stats), rows))
    # When it is planned without token figures
    after = plan_json("--model", str(QWEN), "--job", JOB, env=env)
    # Then the job's samples, and before any chunk is done the reference job's tokens, said so
    assert before["prompts"] == 40 and before["output_tokens"] == REFERENCE.output_tokens
    assert "no chunk done yet" in before["shape"]
    # And once a chunk is done its measured means, sizing the batch for a 1,200-token context
    assert (after["prompts"], after["prompt_tokens"], after["output_tokens"]) == (40, 300, 900)
    assert after["shape"] == f"job {JOB!r} (40 samples; tokens measured over 4)"
    want = capacity(CONFIG, gpu_spec("b200").memory_mib, Serving(context_tokens=1200))
    assert after["capacity"]["kv_bound_requests"] == want.kv_bound_requests
