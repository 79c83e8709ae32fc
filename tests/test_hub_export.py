"""`fleet export --format hf --out hf://datasets/ORG/NAME` (docs/architecture.md, Exports) against
the Hub stand-in (tests/hubserver.py: its write routes as huggingface_hub calls them, atomic
commits, LFS objects kept once verified): the upload lands the local export's folder; a re-run
after the export is killed mid-upload sends nothing twice; a re-export with other shards leaves no
stale one; a commit planned on a head that moved is refused; no token is refused up front."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fleet.errors import TargetUnwritable
from tests.conftest import load_folder, run_fleet
from tests.fleetproc import FAST_SIM, clean_reference, wait_for
from tests.hubserver import HubServer

#: `fleet export` with its Hub-ready shards and row groups made small, so a small job has several
_SMALL_SHARDS = ("import sys; from fleet.export.formats import hf; hf.SHARD_BYTES = int(sys.argv.pop(1)); "
                 "hf.ROW_GROUP_BYTES = hf.SHARD_BYTES // 2; from fleet.cli import main; main()")


def export_cmd(shard_bytes: int, *args: str) -> list[str]:
    return [sys.executable, "-c", _SMALL_SHARDS, str(shard_bytes), *args]


def export(env: dict[str, str], shard_bytes: int, *args: str) -> None:
    done = subprocess.run(export_cmd(shard_bytes, "export", *args), env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def job(tmp: Path, name: str, records: int, hub: HubServer) -> dict[str, str]:
    """A finished sim job of `records` records; the env that reaches its store and the Hub."""
    (tmp / name).mkdir()
    clean_reference(tmp / name, FAST_SIM, name, records)
    return {**os.environ, **FAST_SIM, **hub.env(), "FLEET_DATA_DIR": str(tmp / name / "data"), "TMPDIR": str(tmp)}


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def hub_rows(repo: str, into: Path) -> list[dict]:
    """The dataset's train rows read back as fleet reads an hf:// input: the files its card and
    layout name, downloaded at the commit main names, then loaded by `datasets`."""
    from fleet.producer.datafiles import select
    from fleet.store.hub import SCHEME
    from fleet.store.schemes import StoreOptions

    into.mkdir()
    fetched = SCHEME.fetch(f"hf://datasets/{repo}", into, partial(select, config=None, split="train"),
                           StoreOptions())
    return load_folder(fetched.path, into.parent / "cache")


def data_files(hub: HubServer, repo: str) -> list[str]:
    return sorted(p for p in hub.files(repo) if p.startswith("data/"))


@pytest.mark.e2e
def test_an_export_to_the_hub_lands_whole_and_a_killed_one_resumes_sending_nothing_twice(tmp_path, hub, clean_env):
    # Given a finished job, exported locally as JSONL and as a Hub-ready folder of several shards
    env = job(tmp_path, "gen", 40, hub)
    run_ok = partial(run_fleet, env=env, cwd=tmp_path)
    assert run_ok("export", "--job", "gen", "--out", str(tmp_path / "gen.jsonl")).returncode == 0
    export(env, 3000, "--job", "gen", "--format", "hf", "--out", str(tmp_path / "local"))
    local = folder_files(tmp_path / "local")
    shards = sorted(p for p in local if p.startswith("data/"))
    assert len(shards) >= 3, shards
    # When the export to the Hub is killed (SIGKILL) once one shard is uploaded and others are on their way
    hold = hub.hold("PUT", r"/lfs-upload/.+", after=1)
    proc = subprocess.Popen(export_cmd(3000, "export", "--job", "gen", "--out", "hf://datasets/org/gen"),
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: "org/gen" in hub.repos and len(hub.repos["org/gen"].lfs) >= 1 and hold.waiting >= 1,
                 120, "one shard uploaded and verified, the next one held")
    finally:
        proc.kill()
        proc.wait()
        hold.release()
    # Then nothing landed: the repository is as it was created, no shard in it
    assert [summary for _, summary in hub.repos["org/gen"].log] == ["initial commit"]
    assert data_files(hub, "org/gen") == []
    sent_before = dict(hub.uploads)
    assert len(sent_before) == 1
    # When the export runs again
    export(env, 3000, "--job", "gen", "--out", "hf://datasets/org/gen")
    # Then it sent only what the Hub lacked: every shard's bytes once over both runs, the one
    # uploaded before the kill not again
    assert sorted(hub.uploads.values()) == [1] * len(shards)
    assert set(sent_before) <= set(hub.uploads)
    # And one commit holds the local export's folder, byte for byte, and nothing else of fleet's
    assert len(hub.repos["org/gen"].log) == 2
    remote = hub.files("org/gen")
    assert {k: v for k, v in remote.items() if k != ".gitattributes"} == local
    # And read back as an hf:// input, the dataset has the JSONL export's rows, run facts included
    jsonl = [json.loads(x) for x in (tmp_path / "gen.jsonl").read_text().splitlines()]
    got = hub_rows("org/gen", tmp_path / "back")
    assert [r["id"] for r in got] == [r["id"] for r in jsonl]
    for row, want in zip(got, jsonl, strict=True):
        assert {k: row[k] for k in want if k in row} == {k: want[k] for k in want if k in row}
        assert row["latency_s"] == want["latency_s"] and row["worker"] == want["worker"]
    # And an export of the same rows again changes nothing (no empty commit)
    export(env, 3000, "--job", "gen", "--out", "hf://datasets/org/gen")
    assert len(hub.repos["org/gen"].log) == 2 and sorted(hub.uploads.values()) == [1] * len(shards)


@pytest.mark.e2e
def test_a_re_export_of_a_grown_job_leaves_no_stale_shard(tmp_path, hub, clean_env):
    # Given a job of 16 records exported to the Hub in several shards, and the Hub's card kept beside
    small = job(tmp_path, "small", 16, hub)
    export(small, 2000, "--job", "small", "--out", "hf://datasets/org/out")
    first = data_files(hub, "org/out")
    assert len(first) >= 2, first
    # When a grown job (the same prompts and more) is exported to the same dataset, in more shards
    grown = job(tmp_path, "grown", 48, hub)
    export(grown, 2000, "--job", "grown", "--out", "hf://datasets/org/out")
    # Then the dataset holds the grown job's shards only, named as one export of them
    second = data_files(hub, "org/out")
    n = len(second)
    assert n > len(first) and second == [f"data/train-{i:05d}-of-{n:05d}.parquet" for i in range(n)]
    assert "grown" in hub.files("org/out")["README.md"].decode()
    # When it is exported again in one shard
    export(grown, 10**9, "--job", "grown", "--out", "hf://datasets/org/out")
    # Then that shard is all the dataset holds, with every row of the job once, in order
    assert data_files(hub, "org/out") == ["data/train-00000-of-00001.parquet"]
    assert run_fleet("export", "--job", "grown", "--out", str(tmp_path / "grown.jsonl"), env=grown,
                     cwd=tmp_path).returncode == 0
    want = [json.loads(x)["id"] for x in (tmp_path / "grown.jsonl").read_text().splitlines()]
    assert [r["id"] for r in hub_rows("org/out", tmp_path / "back")] == want
    # And each export was one commit on top of the last
    assert [s.split(":")[0] for _, s in hub.repos["org/out"].log] == ["initial commit"] + ["fleet export"] * 3


@pytest.mark.slow
def test_an_upload_planned_on_a_head_that_moved_is_refused_whole(tmp_path, hub):
    from fleet.store.hub import SCHEME
    from fleet.store.schemes import StoreOptions

    # Given a Hub-ready folder, and its upload held at its commit
    src = tmp_path / "ready"
    (src / "data").mkdir(parents=True)
    pq.write_table(pa.table({"id": ["a", "b"]}), src / "data" / "train-00000-of-00001.parquet")
    (src / "README.md").write_text("---\ntags:\n- fleet\n---\n# ready\n")
    hold = hub.hold("POST", r"/api/datasets/org/race/commit/main", drop=False)
    failed: list[BaseException] = []

    def upload() -> None:
        try:
            SCHEME.send(src, "hf://datasets/org/race", StoreOptions())
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            failed.append(e)

    thread = threading.Thread(target=upload)
    thread.start()
    wait_for(lambda: hold.waiting >= 1, 60, "the upload's commit")
    # When another writer commits to main first, then the held commit goes on
    hub.commit("org/race", {"notes.txt": b"another writer"})
    hold.release()
    thread.join(60)
    # Then the upload is refused as a whole, naming the target, and the other writer's commit stands alone
    assert len(failed) == 1 and isinstance(failed[0], TargetUnwritable), failed
    assert "hf://datasets/org/race" in str(failed[0]) and "412" in str(failed[0])
    assert sorted(hub.files("org/race")) == [".gitattributes", "notes.txt"]
    # And a retry plans on the new head and lands
    SCHEME.send(src, "hf://datasets/org/race", StoreOptions())
    assert sorted(hub.files("org/race")) == [".gitattributes", "README.md", "data/train-00000-of-00001.parquet",
                                             "notes.txt"]


def test_an_export_to_the_hub_without_a_token_is_refused_before_any_request(tmp_path, hub, monkeypatch):
    from huggingface_hub import constants

    from fleet.store.hub import SCHEME
    from fleet.store.schemes import StoreOptions

    # Given no token: none in the environment, none saved
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    # Then the target is refused before any row is read, saying what to set, and the Hub never asked
    with pytest.raises(TargetUnwritable, match="set HF_TOKEN"):
        SCHEME.check_target("hf://datasets/org/x", StoreOptions())
    assert hub.requests == []
