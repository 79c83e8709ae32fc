"""`fleet bench --quick` end to end (real redis-server, worker processes, moto S3, the tiny
hf model), checking that every figure is computed and well-formed, not its value; plus
the pure pieces the figures rest on."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import redis

from fleet.bench import MEASUREMENTS
from fleet.bench.feed import feed
from fleet.bench.idealmodel import model_occupancy
from fleet.bench.jobstats import ChunkTiming, JobRun, ideal_makespan_s, occupancy, timeline
from fleet.bench.overhead import chunk_cycles, percentile
from fleet.bench.pairs import SHARED, Lane, Pairs, common_window, front_end_figures, run_pairs, window_prompts
from fleet.bench.procs import below, broker_of, cpu_seconds
from fleet.bench.procs import is_worker as seen_as_worker
from fleet.bench.reference import REFERENCE
from fleet.bench.series import difference, overlap, value_at
from fleet.bench.sharedcore import PERIOD_US, SharedCoreUnavailable, cpu_hierarchy, make_pen, open_pens
from fleet.bench.workerprof import LOOP_THREAD, Sampler, short, thread_group
from fleet.coord.localredis import LocalRedis
from fleet.worker.supervisor.proctree import is_worker
from tests.fleetproc import wait_for

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# `fleet bench` as a user runs it; importing fleet.cli.bench first also registers the
# command where fleet/cli/__init__.py does not import it yet.
FLEET = "import fleet.cli.bench; from fleet.cli import main; main()"


def fleet(*args: str, cwd: Path, timeout: float = 300,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    return subprocess.run([sys.executable, "-c", FLEET, *args], cwd=cwd,
                          env={**base, **(env or {}), "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.mark.slow
def test_quick_bench_computes_every_figure(tmp_path):
    # Given a machine with redis-server, moto and torch (no GPU)
    out = tmp_path / "results"
    # When the quick suite runs
    done = fleet("bench", "--quick", "--out", str(out), cwd=tmp_path, timeout=570)  # ~1 min idle; a busy machine, more
    # Then it succeeds and prints the table
    assert done.returncode == 0, done.stderr[-4000:]
    assert "fleet bench" in done.stdout
    result = json.loads((out / "bench.json").read_text())
    sections = result["sections"]
    assert list(sections) == list(MEASUREMENTS)
    for name, section in sections.items():
        assert section["error"] is None, (name, section["error"])
        assert section["figures"], name
        for f in section["figures"]:
            assert isinstance(f["value"], int | float) and math.isfinite(f["value"]), (name, f)
            assert (f["target"] is None) == (f["ok"] is None), (name, f)
    # And the occupancy runs include K=1 and the derived default, with timelines
    runs = sections["occupancy"]["data"]["runs"]
    assert {r["k"] for r in runs} >= {1} and sum(r["k_derived"] for r in runs) == 1
    for r in runs:
        assert 0 < r["occupancy"] <= 1.0 and 0 < r["model_occupancy"] <= 1.0
        tl = r["timeline"]
        assert len(tl["t_s"]) == len(tl["occupancy"]) == len(tl["chunks_in_flight"]) > 10
    # And every target figure names its verdict, and the reference job is translated
    targets = [(name, f["name"]) for name, s in sections.items() for f in s["figures"] if f["target"]]
    assert {name for name, _ in targets} == {"occupancy", "makespan", "projection", "scaling", "hf"}, targets
    ref = result["meta"]["reference"]
    assert {"occupancy", "makespan", "projection", "scaling", "overhead", "producer", "hf"} <= set(ref)
    assert ref["reference"]["ideal_hours"] == pytest.approx(REFERENCE.ideal_hours, rel=1e-3)
    # And the three plots are real PNGs, and the markdown table has a row per figure
    for png in ("occupancy_timeline.png", "occupancy_vs_kcs.png", "scaling.png"):
        data = (out / png).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, png
    rows = (out / "table.md").read_text().splitlines()
    assert len(rows) == 2 + sum(len(s["figures"]) for s in sections.values())
    # And the worker's own CPU per M tokens is measured at each S, and its profile adds up
    overhead = sections["overhead"]["data"]
    assert [p["S"] for p in overhead["worker_cpu"]] == [16]
    for p in overhead["worker_cpu"]:
        assert p["tokens"] > 0 and 0 < p["fleet_cpu_s_per_mtok"] < p["cpu_s_per_mtok"]
    # And fleet against the bare engine is reported as pairs, their ratios and the median
    hf = sections["hf"]["data"]
    assert len(hf["ratios"]) == len(hf["fleet"]) == len(hf["bare"]) >= 1 and hf["ratio"] == hf["ratios"][0]


@pytest.mark.slow
def test_sglang_bench_refuses_clearly_without_sglang(tmp_path):
    # Given no sglang package here (CPU CI)
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed: this checks the refusal where it is not")
    # When the MTP comparison is asked for, Then it fails with a message that says what is missing
    done = fleet("bench", "--engine", "sglang", cwd=tmp_path)
    assert done.returncode == 2
    assert "needs the sglang package" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_sglang_cpu_bench_refuses_clearly_without_sglang(tmp_path):
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed: this checks the refusal where it is not")
    # When fleet against the bare Engine is asked for on the CPU (the engine kwargs say so)
    env = {"FLEET_SGLANG__ENGINE_KWARGS": '{"device": "cpu"}'}
    done = fleet("bench", "--engine", "sglang", cwd=tmp_path, env=env)
    # Then it says what is missing, before starting anything
    assert done.returncode == 2
    assert "on the CPU needs the sglang package" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "bench-results").exists()


def chunk(index: int, started: float, finished: float, lengths: list[int], step_s: float = 1.0) -> ChunkTiming:
    return ChunkTiming(index, "w", started, finished, sum(lengths), sum(n * step_s for n in lengths), lengths)


def test_occupancy_and_timeline_agree_on_a_known_schedule():
    # Given two workers' worth of slots (2 x 2) and chunks whose work fills half the window
    run = JobRun("j", [chunk(0, 0.0, 4.0, [4, 4]), chunk(1, 0.0, 2.0, [2, 2]), chunk(2, 2.0, 4.0, [2])])
    # Then occupancy is work / (workers x slots x makespan) and the timeline's mean equals it
    assert occupancy(run, workers=2, slots=2) == pytest.approx(14 / 16)
    tl = timeline(run, workers=2, slots=2, bins=8)
    assert sum(tl["occupancy"]) / 8 == pytest.approx(14 / 16, abs=1e-3)
    assert max(tl["chunks_in_flight"]) == pytest.approx(2.0)
    # And the ideal is never shorter than the longest single request
    assert ideal_makespan_s(run, workers=2, slots=2) == pytest.approx(4.0)
    assert ideal_makespan_s(run, workers=8, slots=8) == pytest.approx(4.0)


def test_model_matches_the_design_tables_shape():
    # Given equal lengths, one slot per request and K large enough: a full engine
    assert model_occupancy([[10] * 4] * 6, workers=1, slots=4, k=2) == pytest.approx(1.0)
    # Given one long request per chunk and K=1: the engine waits on the straggler each time
    assert model_occupancy([[10, 1, 1, 1]] * 4, workers=1, slots=4, k=1) == pytest.approx(13 / 40)
    # And more chunks in flight hide the straggler
    assert model_occupancy([[10, 1, 1, 1]] * 8, workers=1, slots=4, k=4) > 0.5


def test_pairs_report_each_ratio_their_median_and_whether_they_repeat():
    # Given three interleaved pairs, one of them 10% off the others
    runs = [{"tok_s": t, "tokens": 100, "seconds": 1.0} for t in (100, 90, 110, 100, 100, 100)]
    pairs = Pairs(fleet=runs[0::2], bare=runs[1::2], prompts=8)
    # Then each pair's ratio, their median and the largest distance from it are reported
    assert pairs.ratios == pytest.approx([100 / 90, 110 / 100, 1.0])
    assert pairs.median == pytest.approx(1.1) and pairs.spread == pytest.approx(1 - 1 / 1.1)
    assert not pairs.repeats and "NOT within 5%" in pairs.figures("r", None, "", "f", "b")[1].note
    # And close pairs repeat; fewer than three never do
    close = Pairs(fleet=runs[3:6], bare=runs[3:6], prompts=8)
    assert close.repeats and close.median == 1.0 and close.cpu_ratios is None
    # And where both sides counted their CPU, tokens per CPU-second are compared too
    fleet_runs, bare_runs = [{**r, "cpu_s": 2.0} for r in runs[3:6]], [{**r, "cpu_s": 1.0} for r in runs[3:6]]
    cpu = Pairs(fleet=fleet_runs, bare=bare_runs, prompts=8)
    assert cpu.cpu_ratios == [0.5, 0.5, 0.5] and cpu.figures("r", None, "", "f", "b")[-1].value == 0.5
    assert not Pairs(fleet=runs[:1], bare=runs[:1], prompts=8).repeats


def test_window_grows_to_the_minimum_in_whole_chunks():
    assert window_prompts(384, seconds=20.0, min_window_s=12, step=64, cap=3072) == 384
    assert window_prompts(384, seconds=4.0, min_window_s=12, step=64, cap=3072) == 1152
    assert window_prompts(100, seconds=4.0, min_window_s=12, step=64, cap=3072) == 320
    assert window_prompts(384, seconds=0.1, min_window_s=12, step=64, cap=3072) == 3072


def test_run_pairs_interleaves_fleet_first_after_one_bare_probe(tmp_path):
    calls: list[tuple[str, int, int]] = []

    def side(name: str, seconds: float):
        def run(n: int, i: int, lane: Lane) -> dict:
            calls.append((name, n, i))
            assert lane == Lane()  # one after the other: nothing around the command, one pass
            return {"tok_s": 10.0, "tokens": n, "seconds": seconds}
        return run

    log = tmp_path / "runs.jsonl"
    pairs = run_pairs(side("fleet", 6.0), side("bare", 3.0), 3, 16, min_window_s=6.0, step=16, log=log,
                      scratch=tmp_path, together=False)  # fmt: skip
    assert calls == [("bare", 16, -1)] + [(s, 32, i) for i in range(3) for s in ("fleet", "bare")]
    assert pairs.prompts == 32 and pairs.probe is not None and pairs.repeats
    assert pairs.how == "one after the other" and pairs.why_apart == "asked for one after the other"
    # And every run is on disk as it ends, in order
    assert [json.loads(line)["side"] for line in log.read_text().splitlines()] == ["probe"] + ["fleet", "bare"] * 3


def test_a_runs_series_are_written_once_in_the_log_where_there_is_one(tmp_path):
    # Given pairs whose runs carry their series (a bare run's progress, fleet's CPU samples)
    def side(name: str):
        def run(n: int, i: int, lane: Lane) -> dict:
            series = {"progress": [[0.0, 0, 0.0], [1.0, n, 0.5]]} if name == "bare" else {"cpu_samples": [[0.0, 0.0]]}
            return {"tok_s": 10.0, "tokens": n, "seconds": 1.0, **series}
        return run

    log = tmp_path / "runs.jsonl"
    logged = run_pairs(side("fleet"), side("bare"), 1, 4, min_window_s=0.5, log=log, together=False).data()
    # Then with a log, the summary names it and keeps each run's totals, not its series again
    assert logged["raw_runs"] == "runs.jsonl" and "raw" not in logged
    assert logged["probe"] == {"tok_s": 10.0, "tokens": 4, "seconds": 1.0}
    assert [set(r) for r in logged["fleet"] + logged["bare"]] == [{"tok_s", "tokens", "seconds"}] * 2
    assert "progress" in log.read_text() and "cpu_samples" in log.read_text()
    # and without one, the summary is the only copy: series and all
    alone = run_pairs(side("fleet"), side("bare"), 1, 4, together=False).data()
    assert "raw_runs" not in alone and alone["bare"][0]["progress"] and alone["fleet"][0]["cpu_samples"]


def test_series_are_read_between_samples_and_refuse_uncovered_windows():
    samples = [(10.0, 1.0), (11.0, 2.0), (13.0, 2.0)]
    assert difference(samples, 10.5, 12.0) == pytest.approx(0.5)
    assert difference(samples, 9.0, 12.0) is None and difference(samples[:1], 10.0, 10.0) is None
    assert value_at(samples, 5.0) == 1.0 and value_at(samples, 99.0) == 2.0
    assert overlap(0.0, 4.0, 1.0, 2.0) == pytest.approx(0.25) and overlap(0.0, 1.0, 2.0, 3.0) == 0.0


def test_the_common_window_is_fleets_steady_state_within_the_bare_run():
    # Given fleet's four chunks (two slots: the last starts at 20) and a bare run from 5 to 40,
    # 100 tokens a second
    ramps = [[0.0, 10.0, 1000], [0.0, 10.0, 1000], [10.0, 20.0, 1000], [20.0, 30.0, 1000]]
    fleet_run = {"prompts": 8, "ramps": ramps, "cpu_samples": [[0.0, 0.0], [40.0, 40.0]]}
    progress = [[5.0 + t, 100.0 * t, 0.5 * t] for t in range(36)]
    f, b = common_window(fleet_run, {"prompts": 8, "progress": progress})
    # Then both are counted from 5 (the bare start) to 20 (fleet's last chunk start), chunks pro rata
    assert f["window"] == b["window"] == [5.0, 20.0] and f["seconds"] == b["seconds"] == 15.0
    assert f["tokens"] == pytest.approx(500 + 500 + 1000) and b["tokens"] == pytest.approx(1500)
    assert f["tok_s"] / b["tok_s"] == pytest.approx(2000 / 1500)
    assert f["cpu_s"] == pytest.approx(15.0) and b["cpu_s"] == pytest.approx(7.5)
    # And where the worker's published tokens were sampled, they count, not the chunks' spread
    published = {**fleet_run, "made_samples": [[0.0, 0.0], [10.0, 500.0], [30.0, 4000.0]]}
    f, _ = common_window(published, {"prompts": 8, "progress": progress})
    assert f["tokens"] == pytest.approx(2250 - 250)
    # And a job of one wave of chunks (no steady state) is counted to its last result
    short = {"prompts": 8, "ramps": ramps[:2], "cpu_samples": []}
    f, b = common_window(short, {"prompts": 8, "progress": progress})
    assert f["window"] == [5.0, 10.0] and f["tokens"] == pytest.approx(1000) and f["cpu_s"] is None
    # And sides that never ran at once are refused, not divided by zero
    with pytest.raises(ValueError, match="never ran at once"):
        common_window(fleet_run, {"prompts": 8, "progress": [[50.0, 0, 0.0], [60.0, 10, 1.0]]})


def test_feed_keeps_a_few_times_the_slots_in_flight_and_replaces_them_until_told_to_stop(tmp_path):
    running, peak, seen = 0, 0, []
    until: Path | None = None
    stop_at = 41

    async def one(i: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        seen.append(i)
        if until is not None and len(seen) == stop_at:
            until.touch()  # told to stop by the request count, whatever the machine's speed
        await asyncio.sleep(0.01 * (1 + i % 3))
        running -= 1
        return 10

    # One pass: every prompt once, IN_FLIGHT_PER_SLOT x slots at a time, every token counted
    # (concurrent ends must not lose any)
    result = asyncio.run(feed(one, 40, slots=2))
    assert result["tokens"] == 400 and peak == result["in_flight"] == 8 and sorted(seen) == list(range(40))
    assert [p[1] for p in result["progress"]] == [10 * k for k in range(41)]
    # Fewer prompts than that: all at once
    seen[:], peak = [], 0
    assert asyncio.run(feed(one, 3, slots=2))["tokens"] == 30 and peak == 3
    # With `until`: each end is replaced by the next request (prompt i % count), still 8 at once,
    # until the file appears (here when the 41st request starts: no request starts after it; those
    # still in flight at the feeder's next look are cancelled, those ended before it counted)
    until, seen[:], peak = tmp_path / "stop", [], 0
    result = asyncio.run(feed(one, 8, 2, until))
    assert peak == 8 and len(seen) == stop_at and sorted(seen) == list(range(stop_at))
    assert 10 * (stop_at - 8) <= result["tokens"] <= 10 * stop_at and result["in_flight"] == 8
    times = [p[0] for p in result["progress"]]
    assert times == sorted(times) and [p[1] for p in result["progress"]] == list(range(0, result["tokens"] + 1, 10))


def test_pens_are_control_group_files_for_either_cgroup_version(tmp_path):
    # cgroup v1: a cpu hierarchy with a CFS quota per period
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    pen = make_pen("a", (0, 1), 1.0, root=v1)
    assert cpu_hierarchy(v1) == (v1 / "cpu", 1) and pen.path == v1 / "cpu" / "a"
    assert (pen.path / "cpu.cfs_quota_us").read_text() == str(PERIOD_US)
    assert (pen.path / "cpu.cfs_period_us").read_text() == str(PERIOD_US)
    assert pen.prefix()[-3:] == [str(pen.path), "0,1", "--"]
    # Uncapped (an engine whose processes spin): no quota, only the equal default weight
    assert (make_pen("u", (0, 1), 1.0, root=v1, capped=False).path / "cpu.cfs_quota_us").read_text() == "-1"
    # cgroup v2: cpu.max "quota period", the controller enabled for children
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory")
    pen = make_pen("b", (3,), 0.5, root=v2)
    assert (pen.path / "cpu.max").read_text() == f"{PERIOD_US // 2} {PERIOD_US}"
    assert (v2 / "cgroup.subtree_control").read_text() == "+cpu"
    assert (make_pen("u", (3,), 0.5, root=v2, capped=False).path / "cpu.max").read_text() == f"max {PERIOD_US}"
    # Neither: a clear reason, which the benchmark prints before running its pairs apart
    (v2 / "cgroup.controllers").write_text("memory")
    with pytest.raises(SharedCoreUnavailable, match="cpu controller"):
        make_pen("c", (0,), 1.0, root=v2)
    with pytest.raises(SharedCoreUnavailable, match="no cpu control group"):
        cpu_hierarchy(tmp_path / "none")


SIDE = """
import json, os, sys, time
from pathlib import Path
out, until = Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None
info = {"cgroup": Path("/proc/self/cgroup").read_text(), "cpus": sorted(os.sched_getaffinity(0))}
began = time.time()
if until is not None:
    until.with_suffix(".started").touch()  # the bare side runs: fleet's side may start
while (until is not None and not until.exists() and time.time() - began < 60) or time.time() - began < 1:
    time.sleep(0.05)  # fleet's side (no stop file): a one-second job
end = time.time()
info["ramps"] = [[began, end, 100], [began + 0.6 * (end - began), end, 100]]
info["progress"] = [[began - 1, 0, 0.0], [end + 1, 1000, 1.0]]
out.write_text(json.dumps(info))
"""


@pytest.mark.slow
def test_pairs_run_both_sides_at_once_each_in_its_own_pen(tmp_path):
    # Given control groups can be made here (root, a cpu controller)
    try:
        with open_pens(("probe",)):
            pass
    except SharedCoreUnavailable as e:
        pytest.skip(f"no control groups here: {e}")
    script = tmp_path / "side.py"
    script.write_text(SIDE)
    seen: dict[str, list[dict]] = {"fleet": [], "bare": []}

    def side(name: str):
        def run(n: int, i: int, lane: Lane) -> dict:
            out = tmp_path / f"{name}-{i}.json"
            until = [str(lane.until)] if lane.until else []
            if name == "fleet":  # beside a bare side already running, however slowly it started
                started = tmp_path / f"pair-{i}.started"
                wait_for(started.exists, 120, f"pair {i}'s bare side to start", interval=0.01)
            subprocess.run([*lane.prefix(), sys.executable, str(script), str(out), *until], check=True, timeout=90)
            info = json.loads(out.read_text())
            seen[name].append(info)
            if name == "fleet":
                time.sleep(0.5)  # the bare side must still be running: it stops only after fleet's end
            return {"prompts": n, **info}
        return run

    # When three pairs run together
    pairs = run_pairs(side("fleet"), side("bare"), 3, 8, scratch=tmp_path)
    # Then each side ran in its own control group, on the same CPUs, at the same time
    assert pairs.how == SHARED and pairs.why_apart is None and len(pairs.raw) == 3
    for f, b in zip(seen["fleet"], seen["bare"], strict=True):
        fleet_group = [line for line in f["cgroup"].splitlines() if "fleet-bench-" in line]
        bare_group = [line for line in b["cgroup"].splitlines() if "fleet-bench-" in line]
        assert fleet_group and bare_group and fleet_group != bare_group
        assert "-fleet" in fleet_group[0] and "-bare" in bare_group[0]
        assert f["cpus"] == b["cpus"] and len(f["cpus"]) == 1
    # And the bare side ran until fleet was done (its stop file), and both were counted over the
    # window they shared: fleet's first to last chunk start, 0.6 of its first chunk's run
    for f, b in zip(pairs.fleet, pairs.bare, strict=True):
        assert f["window"] == b["window"] and f["tokens"] == pytest.approx(60)
    # And the control groups are gone afterwards
    base = cpu_hierarchy()[0]
    for line in seen["fleet"][0]["cgroup"].splitlines() + seen["bare"][0]["cgroup"].splitlines():
        if "fleet-bench-" in line:
            assert not (base / line.rsplit("/", 1)[1]).exists()


def test_a_fleet_runs_broker_is_found_by_the_title_redis_server_gives_itself(tmp_path):
    # Given a real redis-server started by a process of its own, as `fleet run` starts one (redis
    # rewrites its own title)
    server = LocalRedis(tmp_path / "r", persist=False)
    (tmp_path / "r").mkdir()
    parent = subprocess.Popen(["bash", "-c", '"$@" & wait', "bash", *server.argv()])
    try:
        # When the processes below that parent are read as a benchmark reads a `fleet run`'s
        wait_for(lambda: broker_of(below(parent.pid).values()) is not None, 60, "redis-server's title")
        found = broker_of(below(parent.pid).values())
        # Then its client reaches that server, found by the port in its title
        assert found is not None and found.connection_pool.connection_kwargs["port"] == server.port
        wait_for(lambda: ping(found), 60, "redis-server to answer")
        found.close()
    finally:
        for proc in psutil.Process(parent.pid).children(recursive=True):
            proc.kill()
        parent.wait(timeout=30)
    assert broker_of(["python -m fleet", "python -m fleet.worker.main --name cpu0@h"]) is None


def ping(client) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_worker_processes_are_found_as_started_and_as_celery_retitles_them():
    assert is_worker(b"/venv/bin/python\0-m\0fleet.worker.main\0--name\0cpu0@h\0")
    assert is_worker(b"[celeryd: cpu0@h:MainProcess] -active- (--name cpu0@h --concurrency 2)")
    assert not is_worker(b"VLLM::EngineCore") and not is_worker(b"/usr/bin/redis-server\0127.0.0.1:6379\0")
    # and the benches, from outside, find them the same way in the command lines psutil gives
    assert seen_as_worker("/venv/bin/python -m fleet.worker.main --name cpu0@h")
    assert seen_as_worker("[celeryd: cpu0@h:MainProcess] -active- (--name cpu0@h --concurrency 2)")
    assert not seen_as_worker("/venv/bin/python -m fleet worker --workers 2")  # the launcher


def test_front_end_figures_take_the_bare_loops_cpu_off_fleets_per_token():
    # Given two pairs' windows: the worker used 3 s and 4 s of CPU for 64,000 tokens, the bare loop
    # 1 s and 2 s for 32,000 (its window's share), 64 tokens a request
    fleet = [{"tokens": 64_000, "cpu_s": 3.0}, {"tokens": 64_000, "cpu_s": 4.0}]
    bare = [{"tokens": 32_000, "cpu_s": 1.0}, {"tokens": 32_000, "cpu_s": 2.0}]
    figures = {f.name: f for f in front_end_figures(fleet, bare, 64)}
    # Then each side's median CPU per token, and fleet's extra per token: 46.875 - 31.25 and
    # 62.5 - 62.5 us, median 7.8 us, 0.5 ms a request
    assert figures["fleet worker CPU per output token"].value == pytest.approx(3.5 / 64_000 * 1e6, abs=0.01)
    assert figures["bare loop CPU per output token"].value == pytest.approx(1.5 / 32_000 * 1e6, abs=0.01)
    assert figures["fleet's extra CPU per request"].value == pytest.approx(7.8125 * 64 / 1000, abs=1e-3)
    assert "7.8 us per token" in figures["fleet's extra CPU per request"].note
    # and none where a side did not count its CPU (a window the samples missed)
    assert front_end_figures([{**fleet[0], "cpu_s": None}], bare[:1], 64) == []


@pytest.mark.slow
def test_worker_cpu_reads_a_process_own_time_and_children():
    # Given a child that spins for a CPU-second of its own, then waits
    spin = "import sys, time\nend = time.process_time() + 1\nwhile time.process_time() < end: pass\nprint(flush=True)\n"
    child = subprocess.Popen([sys.executable, "-c", spin + "sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline()
        # Then its own CPU is counted, at least the second it spun, and not this process's
        assert cpu_seconds(child.pid) >= 1.0
        assert cpu_seconds(os.getpid()) > 0
        # and it is found under this process with its command line
        assert "sys.stdin.read()" in below(os.getpid())[child.pid]
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
def test_sampler_charges_busy_threads_and_profiles_the_engine_loop(tmp_path):
    # Given a sampler counting while its gate file exists, and a busy engine loop in its thread
    gate = tmp_path / "prof.on"
    sampler = Sampler(gate, interval_s=0.002)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name=LOOP_THREAD, daemon=True)
    thread.start()

    async def busy() -> None:
        end = time.thread_time() + 0.6  # the loop thread's own CPU: as long as a busy machine takes
        while time.thread_time() < end:
            sum(i * i for i in range(2000))
            await asyncio.sleep(0)

    try:
        gate.touch()
        sampler.thread.start()
        # the sampler sees the gate, and enables cProfile on the loop it found
        wait_for(lambda: sampler.loop is not None, 60, "the sampler to find the engine loop", interval=0.01)
        asyncio.run_coroutine_threadsafe(busy(), loop).result(timeout=300)
        gate.unlink()
        report = sampler.report()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    # Then the loop's thread carries the CPU, within the process total, and cProfile saw the coroutine
    assert report["threads_s"][LOOP_THREAD] > 0.1
    assert report["attributed_cpu_s"] <= report["process_cpu_s"] - report["sampler_cpu_s"] + 0.05
    assert any("test_bench.py" in name for name in report["loop_cprofile"]["by_self_s"])
    assert report["loop_cprofile"]["by_area_self_s"]


@pytest.mark.slow
def test_a_real_fleet_worker_is_profiled_from_outside_the_product(tmp_path):
    from fleet.bench.workercpu import job_for, profiled, shape_for

    # Given a small sim job for one `fleet worker` of 8 slots
    job = job_for("prof", shape_for(8, 4000, 60, 8), 64)
    # When it runs with the profiler's start-up hook on the workers' PYTHONPATH
    report = profiled(job, tmp_path, tmp_path / "prof.json", 8, 8)
    # Then the worker process (not its launcher) was sampled over the job: its engine loop's thread
    # carries CPU, cProfile saw the loop, and the sampler's own CPU is within the process's
    assert report["samples"] > 10 and report["tokens"] > 0
    assert report["threads_s"][LOOP_THREAD] > 0 and report["loop_cprofile"]["by_area_self_s"]
    assert 0 < report["sampler_cpu_s"] < report["process_cpu_s"]
    assert "cpu0@bench ready." in (tmp_path / "prof" / "workers.log").read_text()


@pytest.mark.slow
def test_the_store_cost_is_counted_from_a_real_workers_metrics(tmp_path):
    from fleet.bench.storecost import RUN_CHUNKS, requests_per_gpu_hour

    # When the store cost is measured at 16 slots, 128-record chunks, a checkpoint every 30 s
    cost = requests_per_gpu_hour(tmp_path, 16, 128, 30.0)
    measured = cost["measured"]["counts"]
    # Then a real `fleet worker` ran the chunks (its launcher's log says its worker was ready)
    assert "cpu0@bench ready." in (tmp_path / "storecost" / "workers.log").read_text()
    # and its metrics counted, per chunk, one input read, one result check and write, one batched
    # delete of its checkpoints, and the checkpoint flushes the run made
    assert cost["measured"]["chunks"] == RUN_CHUNKS
    for request in ("GET chunks", "HEAD results", "PUT results", "DeleteObjects partial"):
        assert measured[request] == RUN_CHUNKS, (request, measured)
    assert measured["PUT partial"] >= 2 * RUN_CHUNKS and "partial" in cost["measured"]["listed"]
    # and no other listing per chunk: the results only by the stall watch at the job's end, if its round came
    # before the counts were read (CI on 767965a), counted per job and left out of the hour's requests
    assert set(cost["measured"]["listed"]) <= {"partial", "results"} and measured.get("LIST results", 0) <= 1
    assert "LIST results" not in cost["per_gpu_hour"]
    # And the hour's flushes are the reference's K chunks flushing every 30 s
    assert cost["per_gpu_hour"]["PUT partial"] == 16 * 3600 / 30.0 and cost["usd_per_gpu_hour"] > 0


def test_profile_names_are_short_and_pools_grouped():
    assert thread_group("ThreadPoolExecutor-0_13") == "ThreadPoolExecutor-N_N"
    assert short("/x/.venv/lib/python3.11/site-packages/celery/app/trace.py") == "celery/app/trace.py"
    assert short("/work/wt/fleet/worker/run/generate.py") == "fleet/worker/run/generate.py"
    assert short("/usr/lib/python3.11/asyncio/tasks.py") == "asyncio/tasks.py"


def test_percentile_and_cycles():
    assert chunk_cycles([3.0, 1.0, 2.0, 4.5]) == [1.0, 1.0, 1.5]
    values = [float(i) for i in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0


def test_reference_job_in_hours_and_dollars():
    # 902,087 x 1,818 tokens at 6 x 3,000 tok/s
    assert REFERENCE.ideal_hours == pytest.approx(25.31, abs=0.01)
    assert REFERENCE.chunk_gpu_s == pytest.approx(310.27, abs=0.01)
    half = REFERENCE.at_efficiency(0.5)
    assert half["hours"] == pytest.approx(2 * REFERENCE.ideal_hours, abs=0.01)
    assert half["extra_usd"] == pytest.approx(REFERENCE.cost(REFERENCE.ideal_hours), abs=1)


@pytest.mark.slow
def test_control_plane_bench_runs_fleets_coordination_for_simulated_workers(tmp_path):
    # Given a real redis-server, a real worker for Celery's own share, and simulated workers
    out = tmp_path / "results"
    # When the quick control-plane bench runs (two levels, another K, a restart and a wipe, the looks, an idle end)
    done = fleet("bench", "control-plane", "--quick", "--out", str(out), cwd=tmp_path, timeout=900)
    # Then it prints the table and writes every figure, each a number
    assert done.returncode == 0, done.stderr[-4000:]
    section = json.loads((out / "control-plane.json").read_text())["sections"]["control-plane"]
    assert section["error"] is None
    for f in section["figures"]:
        assert isinstance(f["value"], int | float) and math.isfinite(f["value"]), f
    data = section["data"]
    assert [lv["workers"] for lv in data["levels"]] == [10, 40] and [lv["k"] for lv in data["by_k"]] == [32]
    for level in [*data["levels"], *data["by_k"]]:
        # the simulated workers renewed their leases (beats), one reaper led the rounds, and the broker
        # counted their commands; the Celery stand-in sent what the real worker was measured to send
        assert level["beat_ms"]["n"] > level["workers"] and level["round_s"]["n"] >= 1
        assert level["broker"]["by_command"]["evalsha"] > 0 and level["celery_sent_per_s"] > 0
        # the probe's own share was measured alone (its beats' scripts), and is less than the level's
        probe = level["probe_broker"]
        assert probe["by_command"]["evalsha"] > 0 and 0 < probe["commands"] < level["broker"]["commands"]
    assert data["celery"]["patterns"] == ["/0.celery.pidbox"]
    # And after the restart every worker came back, and after the wipe every chunk is done,
    # running or queued again (fleet enqueue rebuilt the queue from the store)
    last = data["levels"][-1]
    assert last["reconnect"]["beat_back"] == last["reconnect"]["workers"] == 40
    wipe = last["wipe"]
    assert wipe["enqueued"] + wipe["running"] + wipe["done"] == wipe["chunks"]
    # And beside the largest level and the other K, the job exporter was scraped and a real Flower knew
    # every simulated worker from its events, through the restart, none of the broker's connections refused
    for level in (last, *data["by_k"]):
        looks = level["looks"]
        assert looks["scrapes"] >= 1 and looks["flower_workers"] == level["workers"] and looks["refreshes"] >= 1
        assert 0 < looks["peak_connections"] <= level["connections"]["maxclients"] // 2
    assert last["restart"]["refused"] == 0 and last["lost_in_restart"] == 0
    # and the broker restarted under the other K too: every worker's beat back, none refused, no lease lost
    for level in data["by_k"]:
        assert level["restart"]["refused"] == 0 and level["lost_in_restart"] == 0
        assert level["reconnect"]["beat_back"] == level["reconnect"]["workers"] == level["workers"]
    # And at a job's end the idle workers polled for a straggler (one EXISTS over the queue's lists each)
    idle = data["idle"]
    assert idle["idle"] and idle["broker"]["by_command"]["exists"] >= idle["workers"] / 2 * 0.5
    # And the store's requests per GPU-hour came from a real worker's counts of its store requests
    store = data["store"]
    assert store["measured"]["chunks"] == 4 and store["per_gpu_hour"]["PUT partial"] > 0
    assert store["measured"]["listed"] == ["partial"]


@pytest.mark.slow
def test_proctreecost_prints_each_read_both_ways_and_leaves_no_process_behind():
    # Given the process-tree bench, run with a mark every process it starts inherits
    mark = f"proctreecost-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "FLEET_TEST_MARK": mark}
    # When it measures with no other processes and with 30 held elsewhere
    out = subprocess.run([sys.executable, "-m", "tests.proctreecost", "--others", "0,30"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    # Then each read is timed both ways at each count, with the launcher's tick
    for read in ("children(launcher)", "look at one process", "tree tag of one process"):
        rows = [line for line in out.stdout.splitlines() if line.strip().startswith(read)]
        assert len(rows) == 2 and all(" ms   psutil " in row for row in rows), out.stdout
    assert out.stdout.count("launcher reap tick:") == 2
    # and none of the processes it started (its 8 workers, the holder and its 30) outlives it
    left = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("FLEET_TEST_MARK") == mark:
                left.append(proc.pid)
        except psutil.Error:
            continue
    assert not left, left


def test_preemption_schedule_is_a_seeded_poisson_process_per_host_shared_by_every_notice():
    from fleet.bench.preemptschedule import draw

    # Given a seed, 3 hosts and a mean lifetime of 1 h
    lives = {n: draw(7, 3, 3600.0, n, 120.0, 2_000_000.0) for n in (0.0, 30.0)}
    # When the schedule is drawn twice, and for another notice
    again = draw(7, 3, 3600.0, 0.0, 120.0, 2_000_000.0)
    # Then it is the same schedule, with the same boots and SIGTERMs whatever the notice: only the SIGKILL moves
    assert lives[0.0] == again
    at = {n: {(h.slot, h.n): h for h in lives[n]} for n in lives}
    assert at[0.0].keys() == at[30.0].keys() and len(at[0.0]) > 1000
    for key in at[0.0]:
        a, b = at[0.0][key], at[30.0][key]
        assert (a.boot, a.term) == (b.boot, b.term)
        assert b.kill - b.term == 30.0 and a.kill == a.term
    # And lifetimes are exponential with the mean asked for, each replacement booting the delay after the SIGTERM
    spans = [h.term - h.boot for h in lives[0.0]]
    assert len(spans) > 1000 and sum(spans) / len(spans) == pytest.approx(3600, rel=0.08)
    by_slot = sorted(lives[30.0], key=lambda h: (h.slot, h.n))
    for prev, nxt in zip(by_slot, by_slot[1:], strict=False):
        if prev.slot == nxt.slot:
            assert nxt.boot == pytest.approx(prev.term + 120.0)
    # And another seed draws other lives
    assert draw(8, 3, 3600.0, 0.0, 120.0, 2_000_000.0) != again


@pytest.mark.slow
def test_preemption_bench_pays_each_gpu_second_to_one_part_and_runs_the_three_resume_modes(tmp_path):
    # Given the reduced sweep: 2 hosts preempted with a 30 s notice (SIGTERM, SIGKILL after it) on a seeded
    # schedule, mean life 30 min, each preemption held until the host runs samples (Profile.mid_sample)
    out = tmp_path / "results"
    # When `fleet bench preemption --quick` runs it, with the uninterrupted run and the three resume modes
    done = fleet("bench", "preemption", "--quick", "--out", str(out), cwd=tmp_path, timeout=570)
    # Then it succeeds and prints fleet's ratio beside the peers', with the breakdown
    assert done.returncode == 0, done.stderr[-4000:]
    for name in ("fleet (token)", "row restart", "chunk restart", "made twice", "hand over", "waiting"):
        assert name in done.stdout, name
    data = json.loads((out / "preemption.json").read_text())["sections"]["preemption"]["data"]
    assert (out / "preemption.png").read_bytes()[:8] == PNG_MAGIC
    runs, base = data["runs"], data["base"]
    assert [r["mode"] for r in runs] == ["token", "row", "chunk"]
    # And every run's paid GPU-seconds (each host's life from boot) are the sum of the parts measured
    # apart (metrics, store): what none of them explains is under 3 % of what was paid
    for r in [base, *runs]:
        parts = r["parts_gpu_s"]
        assert r["finished"] and r["paid_gpu_s"] > 0
        assert sum(parts.values()) == pytest.approx(r["paid_gpu_s"])
        assert abs(parts["unaccounted"]) < 0.03 * r["paid_gpu_s"], (r["mode"], parts, r["paid_gpu_s"])
        assert parts["engine_starts"] > 0 and parts["useful"] > 0 and parts["waiting"] >= 0
        assert r["kept_tokens"] == base["kept_tokens"]  # one job: the same records, whatever stopped it
    # And the uninterrupted run stopped nothing (its end-of-job helpers may continue from the owners'
    # checkpoints); the three modes met the same schedule, which stopped hosts
    assert base["preempted"] == 0
    # (the drawn lives: a mid-sample hold moves a slot's later boots, so they may boot in another order)
    lives = [{(h["slot"], h["n"]): h for h in r["schedule"]} for r in runs]
    common = set.intersection(*(set(x) for x in lives))
    assert len(common) >= 2 and all(x[k] == lives[0][k] for x in lives for k in common)
    assert all(r["preempted"] >= 1 for r in runs)
    # And, its preemptions landing mid-sample by construction (each host's first signal waits until its metrics
    # show samples running with tokens made, however slow this machine), fleet continued stopped samples from
    # their own tokens, as the store's results say, while the peers' modes continued none and made theirs again
    token, row, chunk = runs
    assert token["continued_tokens"] > 0, token
    assert row["continued_tokens"] == chunk["continued_tokens"] == 0
    assert row["parts_gpu_s"]["made_twice"] > 0 and chunk["parts_gpu_s"]["made_twice"] > 0
    assert row["made_tokens"] > row["kept_tokens"] and chunk["made_tokens"] > chunk["kept_tokens"]
