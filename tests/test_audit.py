"""The audit (docs/architecture.md, "Audit"): every record checked against its own token ids, at commit,
at export and by `fleet verify`; a record that fails is named with its chunk and never exported silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.audit.checks import Limits, Vocab, output_problems
from fleet.engines.sim.tokenchain import SimVocab, sim_text_of, sim_tokens
from fleet.model.repetition import RepetitionSettings
from fleet.store import open_store
from fleet.store.layout import result_key
from fleet.store.results import decode_result, encode_result
from tests.conftest import run_fleet
from tests.fleetproc import FAST_SIM, read_jsonl, write_prompts

VOCAB = SimVocab(1000)
AUDIT = Vocab(VOCAB.decode, {VOCAB.eos}, RepetitionSettings(), ends_before_length=True)
LIMITS = Limits(max_tokens=100, stops=None)


def row(ids: list[int], reason: str, **over) -> dict:
    reasoning, answer, in_thinking = sim_text_of(VOCAB, ids)
    return {"id": "r", "sample": 0, "output_ids": ids, "completion_tokens": len(ids), "finish_reason": reason,
            "reasoning": reasoning, "output": answer, "in_thinking": in_thinking, "prompt_tokens": 5} | over


def made(natural: int = 40, max_tokens: int = 100) -> tuple[list[int], str]:
    return sim_tokens(VOCAB, 11, natural, max_tokens)


def test_a_record_as_its_engine_made_it_passes():
    ids, reason = made()
    assert output_problems(row(ids, reason), LIMITS, AUDIT) == []
    cut, why = made(natural=400)
    assert why == "length" and output_problems(row(cut, why), LIMITS, AUDIT) == []


@pytest.mark.parametrize(("what", "broken"), [
    ("continued past its own end", lambda ids: row(ids + ids[3:9], "stop")),
    ("completion_tokens", lambda ids: row(ids, "stop", completion_tokens=len(ids) + 1)),
    ("not what its ids decode to", lambda ids: row(ids, "stop", output="something else")),
    ("not what its ids decode to", lambda ids: row(ids, "stop", in_thinking=True)),
    ("neither an end id nor a stop string", lambda ids: row(ids[:-1], "stop")),
    ("finish reason length at", lambda ids: row(ids[:-1], "length")),
    ("more than its max tokens", lambda ids: row(ids, "stop") | {"output_ids": ids * 3,
                                                                 "completion_tokens": 3 * len(ids)}),
    ("no cycle", lambda ids: row(ids[:-1], "repetition")),
])  # fmt: skip
def test_a_record_that_contradicts_its_ids_is_named(what, broken):
    ids, _ = made()
    problems = output_problems(broken(ids), LIMITS, AUDIT)
    assert any(what in p for p in problems), problems


def test_a_repetition_stop_must_hold_its_cycle_and_its_period():
    ids = [5, 6, 7] * 200
    assert output_problems(row(ids, "repetition", repetition_period=3), Limits(1000, None), AUDIT) == []
    assert any("period 4" in p for p in output_problems(row(ids, "repetition", repetition_period=4),
                                                          Limits(1000, None), AUDIT))


def test_a_stop_string_ending_is_read_from_the_ids():
    # Given a sample that stopped at a stop string: its ids end with the id that completed it
    ids, _ = made(natural=80)
    stop = VOCAB.decode(ids[30:32])
    limits = Limits(100, (stop,))
    cut = ids[:32]
    reasoning, answer, in_thinking = sim_text_of(VOCAB, cut, (stop,))
    good = row(cut, "stop", reasoning=reasoning, output=answer, in_thinking=in_thinking)
    assert output_problems(good, limits, AUDIT) == []
    # And one whose text still holds what follows the stop string is named
    assert output_problems(row(cut, "stop"), limits, AUDIT)


def test_a_length_cut_by_the_context_passes_short_of_max_tokens():
    ids, _ = made(natural=400)
    short = row(ids[:50], "length", prompt_tokens=78)
    assert output_problems(short, Limits(100, None, context=128), AUDIT) == []
    assert output_problems(short, Limits(100, None, context=None), AUDIT)


@pytest.mark.e2e
def test_export_leaves_out_and_names_a_defect_and_verify_fails(tmp_path: Path, clean_env):
    # Given a finished sim job
    prompts = write_prompts(tmp_path / "p.jsonl", 12)
    env = {**FAST_SIM, "FLEET_DATA_DIR": str(tmp_path / "data"), "FLEET_CHUNK_SIZE": "4"}
    assert run_fleet("run", str(prompts), "--job", "a", "--workers", "1", env=env, cwd=tmp_path).returncode == 0
    ok = run_fleet("verify", "--job", "a", env=env, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "12 samples checked against their ids, 12 pass, 0 fail" in ok.stderr.replace("\n", " ")
    # When one stored record is continued past its own end (as a hand-over once did)
    store = open_store(str(tmp_path / "data" / "store"))
    key = result_key("a", 1)
    stats, rows = decode_result(store.get(key), key)
    bad = rows[2]
    bad["output_ids"] = bad["output_ids"] + bad["output_ids"][:5]
    bad["completion_tokens"] = len(bad["output_ids"])
    store.delete(key)
    store.put(key, encode_result(stats, rows))
    # Then verify names it with its chunk and fails
    failed = run_fleet("verify", "--job", "a", env=env, cwd=tmp_path)
    assert failed.returncode == 1
    text = " ".join(failed.stderr.split())
    assert "1 fail" in text and f"chunk 1 record {bad['id']!r}" in text and "continued past its own end" in text
    # And the export leaves it out, names it, counts it and exits 1, naming the flag for a partial export
    out = tmp_path / "o.jsonl"
    exp = run_fleet("export", "--job", "a", "--out", str(out), env=env, cwd=tmp_path)
    assert exp.returncode == 1, exp.stderr
    said = " ".join(exp.stderr.split())
    assert "left out 1: failed the audit" in said and "--allow-defects" in said
    kept = [json.loads(x)["id"] for x in prompts.read_text().splitlines() if json.loads(x)["id"] != bad["id"]]
    assert [r["id"] for r in read_jsonl(out)] == kept
    # And with --allow-defects the same partial export exits 0, saying it is partial
    exp = run_fleet("export", "--job", "a", "--out", str(out), "--allow-defects", env=env, cwd=tmp_path)
    assert exp.returncode == 0, exp.stderr
    said = " ".join(exp.stderr.split())
    assert "partial export (--allow-defects): 1 sample(s) failed the audit and were left out" in said
    assert [r["id"] for r in read_jsonl(out)] == kept
