"""A whole `fleet run --engine sglang` through real worker processes, against the stand-in
with the real Engine's edges (tests/fake_sglang): the scheduler settles on fewer running
requests than asked, basicConfig(force=True) at start, reserved draft tokens, an HTTP-500
abort, top_k 0 and penalty range checks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fleet.worker.process.enginehost import admission_limit
from tests.conftest import run_fleet
from tests.fleetproc import read_jsonl
from tests.modelkit import tiny_model_fixture  # noqa: F401

pytestmark = pytest.mark.e2e

FAKE = Path(__file__).parent / "fake_sglang"
ROOT = Path(__file__).resolve().parents[1]
ASKED, EFFECTIVE, CONTEXT, RESERVED = 64, 6, 160, 4


def test_fleet_run_sglang_with_the_real_engines_edges(tmp_path: Path, tiny_model: Path, clean_env) -> None:
    # Given prompts with per-record penalties (a record's sampling and an OpenAI batch body),
    # one far longer than its max_tokens leaves room for, and one the engine aborts with HTTP 500
    lines = [{"id": f"u{i:02d}", "messages": [{"role": "user", "content": f"Say {i}."}]} for i in range(20)]
    lines += [
        {"id": "sampled", "prompt": "abc", "sampling": {"presence_penalty": 0.5, "top_k": 0}},
        {"custom_id": "batch", "body": {"messages": [{"role": "user", "content": "Hi"}], "frequency_penalty": 0.3}},
        {"id": "long", "prompt": "a b c d e f g h " * 10, "sampling": {"max_tokens": 500}},  # ~80 tokens
        {"id": "aborted", "prompt": "a b c d e f g h " * 16, "sampling": {"max_tokens": 4}},  # ~130
    ]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    journal = tmp_path / "journal.jsonl"
    fake_kwargs = {"fake_effective_running": EFFECTIVE, "fake_abort_over": 100, "fake_step_s": 0.002,
                   "fake_tokens": 12}  # fmt: skip
    env = {
        "FLEET_DATA_DIR": str(tmp_path / "data"),
        "PYTHONPATH": os.pathsep.join([str(FAKE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "FAKE_SGLANG_JOURNAL": str(journal),
        "FLEET_SGLANG__MTP": "true",
        "FLEET_SGLANG__CONTEXT_LENGTH": str(CONTEXT),
        "FLEET_SGLANG__MAX_RUNNING_REQUESTS": str(ASKED),
        "FLEET_SGLANG__ENGINE_KWARGS": json.dumps(fake_kwargs),
        "FLEET_SAMPLING__REPETITION_PENALTY": "1.1",
    }
    # When it runs on one sglang worker
    run = run_fleet("run", str(prompts), "--job", "sg", "--engine", "sglang", "--model", str(tiny_model),
                    "--workers", "1", "--chunk-size", "4", "--max-tokens", "16", env=env, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp_path / "o.jsonl"
    assert run_fleet("export", "--job", "sg", "--out", str(out), env=env).returncode == 0
    rows = {r["id"]: r for r in read_jsonl(out)}
    entries = read_jsonl(journal)
    starts = [e for e in entries if e["event"] == "start"]
    requests = [e for e in entries if e["event"] == "request"]

    # Then one engine served the whole run
    assert len(starts) == 1 and starts[0]["kwargs"]["log_level"] == "warning"
    # And requests in flight were sized from the 6 it really runs, not the 64 asked
    peak_inside = max(e["inside"] for e in requests)
    assert EFFECTIVE < peak_inside <= admission_limit(EFFECTIVE) < admission_limit(ASKED)
    # And every request carried the penalties, top_k never 0
    for e in requests:
        sp = e["sampling_params"]
        assert sp["repetition_penalty"] == 1.1 and "presence_penalty" in sp and "frequency_penalty" in sp
        assert sp["top_k"] != 0
    by_prompt = {e["prompt"]: e["sampling_params"] for e in requests}
    assert any(sp["presence_penalty"] == 0.5 and sp["top_k"] == -1 for sp in by_prompt.values())
    assert any(sp["frequency_penalty"] == 0.3 for sp in by_prompt.values())
    # And the over-long request was clipped to context - prompt - reserved, not failed
    [long_req] = [e for e in requests if 60 < e["prompt"] < 100]
    assert long_req["prompt"] + RESERVED + long_req["sampling_params"]["max_new_tokens"] == CONTEXT
    assert rows["long"]["finish_reason"] in ("stop", "length")
    # And every finished stream was run to its end, none closed at its last output
    assert not [e for e in entries if e["event"] == "closed_after_finish"]
    # And the aborted one is an error row while everything else was generated
    assert rows["aborted"]["finish_reason"] == "error" and "500" in rows["aborted"]["error"]
    assert all(r["finish_reason"] != "error" for k, r in rows.items() if k != "aborted")
    assert len(rows) == len(lines)
    # And fleet's own log lines survived SGLang's logging.basicConfig(force=True)
    logs = "\n".join(p.read_text(errors="replace") for p in (tmp_path / "data").rglob("*.log"))
    assert "engine ready" in logs
    assert f"sglang runs {EFFECTIVE} requests at once, not the {ASKED} asked" in logs
