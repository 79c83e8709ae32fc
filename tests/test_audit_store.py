"""The audit against records altered in a real store (docs/architecture.md, "Audit"; issue 44): each
test runs `fleet verify` and `fleet export` as a user does on a finished sim job whose result object
was rewritten the way a bug in fleet, an engine or a storage layer could, and asserts the defect is
named and both commands exit non-zero; the unaltered jobs verify and export with exit 0."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet.engines.sim.tokenchain import SimVocab, sim_text_of
from fleet.store import open_store
from fleet.store.layout import encode_lines, result_key
from fleet.store.results import HEADER, ChunkStats, decode_result
from tests.conftest import run_fleet
from tests.fleetproc import FAST_SIM, read_jsonl

pytestmark = pytest.mark.e2e

VOCAB = SimVocab()
STOP = "the"
RECORDS, CHUNK = 24, 8
Row = dict
Change = Callable[[Row, ChunkStats], object]


def prompts(path: Path) -> Path:
    """Raw prompts and chats, every other one with a stop string of its own."""
    lines = []
    for i in range(RECORDS):
        line: dict = {"id": f"r{i:02d}"}
        if i % 3:
            line["messages"] = [{"role": "user", "content": f"question {i}: tell me something"}]
        else:
            line["prompt"] = f"prompt number {i}"
        if i % 2 == 0:
            line["sampling"] = {"stop": [STOP]}
        lines.append(line)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def conversations(path: Path) -> Path:
    """Two-turn conversations (a given assistant turn, then a user turn) for `--turns all`."""
    lines = [{"id": f"c{i}", "messages": [
        {"role": "user", "content": f"hello {i}"}, {"role": "assistant", "content": "given answer"},
        {"role": "user", "content": f"and then {i}?"}]} for i in range(6)]  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir holding two finished sim jobs fleet made: `a` (stop strings, max tokens cuts) and
    `t` (`--turns all`); each test alters a copy."""
    tmp = tmp_path_factory.mktemp("made")
    with pytest.MonkeyPatch.context() as mp:
        for k in [k for k in os.environ if k.startswith("FLEET_")]:
            mp.delenv(k)
        env = {**FAST_SIM, "FLEET_DATA_DIR": str(tmp / "data"), "FLEET_CHUNK_SIZE": str(CHUNK)}
        for job, source, extra in (("a", prompts(tmp / "p.jsonl"), ["--max-tokens", "24"]),
                                   ("t", conversations(tmp / "c.jsonl"), ["--max-tokens", "80", "--turns", "all"])):
            run = run_fleet("run", str(source), "--job", job, "--workers", "1", *extra, env=env, cwd=tmp)
            assert run.returncode == 0, run.stderr[-3000:]
    return tmp / "data"


def copy(made: Path, tmp_path: Path) -> dict[str, str]:
    shutil.copytree(made, tmp_path / "data")
    return {**FAST_SIM, "FLEET_DATA_DIR": str(tmp_path / "data")}


def alter(env: dict[str, str], job: str, pick: Callable[[Row], bool], change: Change) -> Row:
    """Rewrite the first stored row `pick` takes with `change` (which may return a new ChunkStats header), in place
    in the store's result object, as a bug would have written it; returns the row as it was."""
    store = open_store(str(Path(env["FLEET_DATA_DIR"]) / "store"))
    for index in range(RECORDS // CHUNK):
        key = result_key(job, index)
        if not store.exists(key):
            break
        stats, rows = decode_result(store.get(key), key)
        assert stats is not None
        for i, row in enumerate(rows):
            if pick(row):
                before = json.loads(json.dumps(row))
                new = change(rows[i], stats)
                stats = new if isinstance(new, ChunkStats) else stats
                store.delete(key)
                store.put(key, encode_lines([{HEADER: 1, **stats.model_dump(exclude_unset=True)}, *rows]))
                return before
    raise AssertionError(f"no row of job {job!r} to alter")


def stored(env: dict[str, str], job: str) -> list[Row]:
    store = open_store(str(Path(env["FLEET_DATA_DIR"]) / "store"))
    keys = [result_key(job, i) for i in range(RECORDS // CHUNK)]
    return [row for key in keys if store.exists(key) for row in decode_result(store.get(key), key)[1]]


def audited(env: dict[str, str], job: str, tmp_path: Path) -> tuple[int, str, int, str, list[dict]]:
    """`fleet verify` and `fleet export` as the user runs them: their exit codes, their words (one line)
    and the rows exported."""
    verify = run_fleet("verify", "--job", job, env=env, cwd=tmp_path)
    out = tmp_path / "o.jsonl"
    export = run_fleet("export", "--job", job, "--out", str(out), env=env, cwd=tmp_path)
    for done in (verify, export):
        assert "Traceback" not in done.stderr, done.stderr
    rows = read_jsonl(out) if out.exists() else []
    return verify.returncode, " ".join(verify.stderr.split()), export.returncode, " ".join(export.stderr.split()), rows


def assert_named(env: dict[str, str], job: str, tmp_path: Path, row: Row, *words: str) -> None:
    """Both commands name the row (its job, chunk and id) with `words`, and exit 1; the export leaves
    it out and names --allow-defects."""
    verify_rc, verify, export_rc, export, rows = audited(env, job, tmp_path)
    name = f"job {job!r} chunk {row['chunk']} record {row['id']!r} sample {row.get('sample', 0)}:"
    for said in (verify, export):
        assert name in said and all(w in said for w in words), said
    assert verify_rc == 1, verify
    assert export_rc == 1 and "--allow-defects" in export, export
    assert row["id"] not in [r["id"] for r in rows]


def text_of(ids: list[int], stops: tuple[str, ...] | None = None) -> dict:
    """The fields the sim reports for `ids`: text cut before the first stop string, split at </think>."""
    reasoning, answer, in_thinking = sim_text_of(VOCAB, ids, stops)
    return {"output_ids": ids, "output": answer, "reasoning": reasoning, "in_thinking": in_thinking,
            "completion_tokens": len(ids)}


def test_the_jobs_fleet_made_verify_and_export_with_exit_0(made: Path, tmp_path: Path, clean_env):
    # Given the jobs as fleet made them (stop strings, cuts at max tokens, conversations)
    env = copy(made, tmp_path)
    rows = {job: stored(env, job) for job in ("a", "t")}
    reasons = {r["finish_reason"] for r in rows["a"]}
    by_string = [r for r in rows["a"] if r["finish_reason"] == "stop" and r["output_ids"][-1] != VOCAB.eos]
    assert {"stop", "length"} <= reasons and by_string, reasons
    # When each is verified and exported, Then every sample is checked and passes, exit 0
    for job, samples in (("a", RECORDS), ("t", 6)):
        verify_rc, verify, export_rc, export, exported = audited(env, job, tmp_path)
        assert verify_rc == 0 and export_rc == 0, verify + export
        for said in (verify, export):
            assert f"{samples} samples checked against their ids, {samples} pass, 0 fail" in said, said
            assert "not checked" not in said and "defect" not in said
        assert len(exported) == samples


def test_ids_run_on_past_their_stop_string(made: Path, tmp_path: Path, clean_env):
    # Given a sample its stop string ended, its ids extended past it, its text as the engine reports
    # those ids (cut before the first stop string) and its counts updated
    env = copy(made, tmp_path)

    def extend(row: Row, stats: ChunkStats) -> None:
        row.update(text_of(row["output_ids"] + [5, 6, 7], (STOP,)))

    row = alter(env, "a", lambda r: r["finish_reason"] == "stop" and r["output_ids"][-1] != VOCAB.eos, extend)
    # Then verify and export name it as continued past its stop string, and exit 1
    assert_named(env, "a", tmp_path, row, "stop string at", "continued past its own end")


def test_a_length_row_whose_last_id_is_the_end_id(made: Path, tmp_path: Path, clean_env):
    # Given a sample cut at max tokens whose last id is made the end id (text and counts to match)
    env = copy(made, tmp_path)

    def end(row: Row, stats: ChunkStats) -> None:
        row.update(text_of(row["output_ids"][:-1] + [VOCAB.eos]))

    row = alter(env, "a", lambda r: r["finish_reason"] == "length", end)
    # Then the sim, which reports an end id on its last allowed id as stop, makes it a defect
    assert_named(env, "a", tmp_path, row, "finish reason length, but its end id ends it there")


def test_a_row_without_its_ids_where_the_job_keeps_them(made: Path, tmp_path: Path, clean_env):
    # Given a job that keeps output ids (the default), one of whose rows lost them
    env = copy(made, tmp_path)
    row = alter(env, "a", lambda r: r["finish_reason"] == "stop", lambda r, s: r.update(output_ids=None))
    # Then it is a defect, not a row "not checked"
    assert_named(env, "a", tmp_path, row, "output_ids: missing, and the job keeps them")


def test_the_top_level_of_a_conversation_is_its_last_turn(made: Path, tmp_path: Path, clean_env):
    # Given a `--turns all` record whose top-level output, ids and counts were rewritten (its turns intact)
    env = copy(made, tmp_path)

    def rewrite(row: Row, stats: ChunkStats) -> None:
        row.update(output="anything at all", output_ids=[1, 2, 3], completion_tokens=3, prompt_tokens=7)

    row = alter(env, "t", lambda r: r["finish_reason"] == "stop" and len(r["turns"]) == 2, rewrite)
    # Then the top level is named as not its last turn's
    assert_named(env, "t", tmp_path, row, "output, output_ids, prompt_tokens, completion_tokens: the top level "
                                          "is not its last turn's")


def test_a_wrong_prompt_count_cannot_move_the_context_check(made: Path, tmp_path: Path, clean_env):
    # Given a sample truncated to 5 ids and called a length cut, whose prompt_tokens was raised so that
    # prompt + output fill the context its result's header records
    env = copy(made, tmp_path)

    def truncate(row: Row, stats: ChunkStats) -> ChunkStats:
        row.update(text_of(row["output_ids"][:5]), finish_reason="length", prompt_tokens=500)
        return stats.model_copy(update={"context": 505})

    row = alter(env, "a", lambda r: r["finish_reason"] == "stop" and len(r["output_ids"]) > 10, truncate)
    # Then its prompt_tokens is held to its prompt, and the cut to the context that prompt leaves
    assert_named(env, "a", tmp_path, row, f"prompt_tokens: 500, its prompt is {row['prompt_tokens']} tokens",
                 "finish reason length at 5 output ids")


def test_a_manifest_without_its_sampling(made: Path, tmp_path: Path, clean_env):
    # Given a job whose manifest lost its sampling section
    env = copy(made, tmp_path)
    path = Path(env["FLEET_DATA_DIR"]) / "store" / "a" / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["config"]["sampling"]
    path.write_text(json.dumps(manifest))
    # Then no sample can be checked: each is named, and verify and export exit 1 (the export writes them,
    # unverified, and says so)
    verify_rc, verify, export_rc, export, rows = audited(env, "a", tmp_path)
    for said in (verify, export):
        assert f"0 samples checked against their ids, 0 pass, 0 fail, {RECORDS} not checked" in said, said
        assert "not checked: the job's manifest holds no sampling.max_tokens" in said
    assert verify_rc == 1 and export_rc == 1, verify + export
    assert f"{RECORDS} could not be checked and were written unverified" in export and "--allow-defects" in export
    assert len(rows) == RECORDS


@pytest.mark.parametrize(("change", "words"), [
    (lambda r, s: r.pop("finish_reason"), "finish_reason: field required"),
    (lambda r, s: r.update(output_ids="12 34"), "output_ids: input should be a valid list (holds str '12 34')"),
])  # fmt: skip
def test_a_malformed_row_is_a_named_defect_not_a_traceback(made: Path, tmp_path: Path, clean_env, change, words):
    # Given a row missing its finish reason, or whose ids are not a list
    env = copy(made, tmp_path)
    row = alter(env, "a", lambda r: r["finish_reason"] == "stop", change)
    # Then both commands name its field and what is wrong, with no traceback, and exit 1
    assert_named(env, "a", tmp_path, row, words)


def test_filters_the_user_asked_for_are_not_defects(made: Path, tmp_path: Path, clean_env):
    # Given the job as fleet made it, When it is exported with --only-finished
    env = copy(made, tmp_path)
    out = tmp_path / "f.jsonl"
    done = run_fleet("export", "--job", "a", "--out", str(out), "--only-finished", env=env, cwd=tmp_path)
    # Then the cut rows are left out and counted, and the export exits 0: the user asked for it
    said = " ".join(done.stderr.split())
    assert done.returncode == 0, said
    kept = read_jsonl(out)
    assert 0 < len(kept) < RECORDS and all(r["finish_reason"] == "stop" for r in kept)
    assert f"left out {RECORDS - len(kept)}: not finished (--only-finished" in said


def test_a_result_that_cannot_be_read_is_named_not_a_traceback(made: Path, tmp_path: Path, clean_env):
    # Given a job one of whose result objects a storage layer garbled
    env = copy(made, tmp_path)
    store = open_store(str(Path(env["FLEET_DATA_DIR"]) / "store"))
    store.delete(result_key("a", 1))
    store.put(result_key("a", 1), b"\x28\xb5\x2f\xfd garbage")
    # Then both commands name its chunk and its records as not checked, exit 1, and the export holds the rest
    verify_rc, verify, export_rc, export, rows = audited(env, "a", tmp_path)
    for said in (verify, export):
        assert f"job 'a' chunk 1: its {CHUNK} record(s) not checked: a/results/000001 cannot be decoded" in said, said
    assert verify_rc == 1 and export_rc == 1 and len(rows) == RECORDS - CHUNK
