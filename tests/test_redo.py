"""The second pass (#27): `fleet run --job J2 --redo J` generates J's unfinished rows again, and
`fleet export --job J --job J2` merges them back, each (id, sample) once in J's order; the sim
engine's short max tokens make cut rows, its longer one finishes most of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.errors import FleetError
from fleet.producer.enqueue import prepare_job, prepare_redo
from fleet.settings import Settings
from fleet.store import open_store
from fleet.store.manifest import require_manifest
from fleet.store.results import finished
from tests.conftest import run_fleet
from tests.fleetproc import FAST_SIM, read_jsonl, write_prompts

RECORDS, N = 30, 2


def export(env: dict[str, str], out: Path, *args: str) -> list[dict]:
    done = run_fleet("export", *args, "--out", str(out), "--stable", env=env)
    assert done.returncode == 0, done.stderr
    return read_jsonl(out)


@pytest.mark.e2e
def test_redo_finishes_cut_rows_and_the_merged_export_keeps_each_row_once(tmp_path, redis_server, clean_env):
    # Given a job of 30 records x 2 samples cut at 16 tokens (the sim's mean length is 24)
    prompts = write_prompts(tmp_path / "p.jsonl", RECORDS)
    env = {**FAST_SIM, "FLEET_DATA_DIR": str(tmp_path / "data"), "FLEET_CHUNK_SIZE": "4"}
    base = run_fleet("run", str(prompts), "--job", "base", "--max-tokens", "16", env={**env, "FLEET_SAMPLING__N": "2"})
    assert base.returncode == 0, base.stderr
    ids = [f"r{i:05d}" for i in range(RECORDS)]
    first = export(env, tmp_path / "base.jsonl", "--job", "base")
    unfinished = {(r["id"], r["sample"]) for r in first if not finished(r)}
    assert 0 < len(unfinished) < len(first) == RECORDS * N
    redone_ids = [i for i in ids if (i, 0) in unfinished or (i, 1) in unfinished]

    # When a redo job runs J's unfinished records with a larger max tokens (and no input file)
    redo = run_fleet("run", "--job", "redo1", "--redo", "base", "--max-tokens", "40", env=env)
    assert redo.returncode == 0, redo.stderr

    # Then it is an ordinary job of exactly those records, J's samples per record, its own seed
    store = open_store(str(tmp_path / "data" / "store"))
    base_m, redo_m = require_manifest(store, "base"), require_manifest(store, "redo1")
    assert redo_m.redo_of == "base" and redo_m.input == "redo of base"
    assert redo_m.records == len(redone_ids) and redo_m.samples == len(redone_ids) * N
    assert redo_m.config["seed"] != base_m.config["seed"]
    own = export(env, tmp_path / "redo.jsonl", "--job", "redo1")
    assert [r["id"] for r in own if r["sample"] == 0] == redone_ids
    finished_since = {(r["id"], r["sample"]) for r in own if finished(r)} & unfinished
    assert finished_since, "the redo finished none of J's cut rows"
    assert len(finished_since) < len(unfinished), "40 tokens should leave some rows cut: the merge keeps the later"

    # And the merged export holds each (id, sample) of J once, in J's order, the finished version first
    merged = export(env, tmp_path / "merged.jsonl", "--job", "base", "--job", "redo1")
    assert [(r["id"], r["sample"]) for r in merged] == [(i, s) for i in ids for s in range(N)]
    theirs = {(r["id"], r["sample"]): r for r in own}
    for row, mine in zip(merged, first, strict=True):
        redone = theirs.get((row["id"], row["sample"]))
        assert row == (redone if redone and (finished(redone) or not finished(mine)) else mine)
    assert sum(finished(r) for r in merged) == len(first) - len(unfinished) + len(finished_since)

    # And --only-finished keeps only finished rows, still in J's order
    kept = export(env, tmp_path / "fin.jsonl", "--job", "base", "--job", "redo1", "--only-finished")
    assert kept == [r for r in merged if finished(r)] and len(kept) < len(merged)

    # And `fleet status --job J` says how many of its unfinished samples the redo finished
    status = run_fleet("status", "--job", "base", "--json", env=env)
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    assert st["samples_unfinished"] == len(unfinished)
    assert st["redo_finished"] == len(finished_since)
    chunks = f"{redo_m.chunks}/{redo_m.chunks} chunks done"
    assert st["redo_jobs"] == {"redo1": chunks}
    shown = run_fleet("status", "--job", "base", env={**env, "COLUMNS": "250"})
    text = " ".join((shown.stdout + shown.stderr).split())
    assert f"{len(finished_since)} of {len(unfinished)} unfinished sample(s) finished since by redo1 ({chunks})" in text

    # And running the redo again does nothing; another configuration under its name is refused
    again = run_fleet("run", "--job", "redo1", "--redo", "base", "--max-tokens", "40", env=env)
    assert again.returncode == 0 and "nothing to do" in again.stderr, again.stderr
    other = run_fleet("run", "--job", "redo1", "--redo", "base", "--max-tokens", "30", env=env)
    assert other.returncode != 0 and "max_tokens: 40 -> 30" in " ".join(other.stderr.split())

    # And `fleet enqueue --redo` makes a second redo job (no worker runs it): status names it,
    # and the merge refuses it unfinished unless --allow-incomplete, which changes nothing then
    queued = run_fleet("enqueue", "--job", "redo2", "--redo", "base", env={**env, "FLEET_BROKER_URL": redis_server.url})
    assert queued.returncode == 0 and f"enqueued {redo_m.chunks}" in queued.stderr, queued.stderr
    st = json.loads(run_fleet("status", "--job", "base", "--json", env=env).stdout)
    assert st["redo_jobs"] == {"redo1": chunks, "redo2": f"0/{redo_m.chunks} chunks done"}
    assert st["redo_finished"] == len(finished_since)
    args = ["--job", "base", "--job", "redo1", "--job", "redo2", "--out", str(tmp_path / "three.jsonl")]
    refused = run_fleet("export", *args, env=env)
    n = redo_m.chunks
    assert refused.returncode != 0 and f"job 'redo2' has {n} of {n} chunks without a result" in refused.stderr
    assert export(env, tmp_path / "three.jsonl", *args[:-2], "--allow-incomplete") == merged


@pytest.mark.slow
def test_a_merge_names_only_redo_jobs_and_needs_one_source(tmp_path, clean_env):
    # Given two ordinary jobs in one store
    prompts = write_prompts(tmp_path / "p.jsonl", 6)
    env = {**FAST_SIM, "FLEET_DATA_DIR": str(tmp_path / "data"), "FLEET_CHUNK_SIZE": "3"}
    for job in ("a", "b"):
        assert run_fleet("run", str(prompts), "--job", job, env=env).returncode == 0
    # When b is merged into a as if it were a's redo job, it is refused, naming why
    bad = run_fleet("export", "--job", "a", "--job", "b", "--out", str(tmp_path / "o.jsonl"), env=env)
    assert bad.returncode != 0 and "job 'b' is not a redo job" in " ".join(bad.stderr.split())
    assert not (tmp_path / "o.jsonl").exists()
    # And a run needs an input or --redo, not both
    both = run_fleet("run", str(prompts), "--job", "c", "--redo", "a", env=env)
    assert both.returncode != 0 and "give an input file, or --redo JOB" in " ".join(both.stderr.split())


def test_a_redo_needs_a_complete_job_with_unfinished_rows(tmp_path):
    # Given a job whose chunks have no result yet
    store = open_store(str(tmp_path / "store"))
    settings = Settings(engine="sim", chunk_size=2)
    prepare_job(settings, store, str(write_prompts(tmp_path / "p.jsonl", 5)), "j")
    # When a redo of it is prepared, it is refused and nothing is written
    with pytest.raises(FleetError, match="3 of 3 chunks without a result .*wait for them"):
        prepare_redo(settings, store, "j2", "j")
    assert not list(store.list("j2/")) and not list(store.list("j/redos/"))
    # And a job cannot redo itself
    with pytest.raises(FleetError, match="cannot redo itself"):
        prepare_redo(settings, store, "j", "j")
