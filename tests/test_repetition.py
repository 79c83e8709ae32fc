"""The repetition stop's pieces (docs/architecture.md, "Repetition stop").

The watch finds what a brute force finds, whatever the delta sizes, with the smallest
period; `fleet tiny-model --loop` loops under greedy decoding through the hf engine and the
watch stops it with period 3; the default thresholds never fire on the tiny model's sampled
rows (the demo job's shape) nor on millions of tokens of real code and prose, and the tests
print how close those came (`pytest -s`).
"""

from __future__ import annotations

import json
import random
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from fleet.model.repetition import (
    MAX_PERIOD,
    MIN_REPEATS,
    MIN_TOKENS,
    Cycle,
    RepetitionSettings,
    RepetitionWatch,
    watch_for,
)
from fleet.producer.inputs import read_records
from fleet.records import GenRequest, derive_seed, record_sampling
from fleet.settings import load_settings
from tests.fleetproc import check_loops_stopped, loop_job_lines
from tests.modelkit import chat, loop_model_fixture, tiny_model_fixture  # noqa: F401
from tests.test_engines_hf import Running, hf_settings, one_torch_thread  # noqa: F401

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "prompts.jsonl"


def fed(watch: RepetitionWatch, ids: Sequence[int], rng: random.Random, most: int = 40) -> Cycle | None:
    """Feed `ids` in deltas of random sizes, as an engine streams them; the watch's answer."""
    i = 0
    while i < len(ids):
        step = rng.randint(1, most)
        found = watch.feed(ids[i : i + step])
        i += step
        if found is not None:
            return found
    return None


def cover(ids: Sequence[int], period: int) -> int:
    """Tokens the longest p-periodic suffix of `ids` covers (0: its last id does not repeat)."""
    run = 0
    while run < len(ids) - period and ids[-1 - run] == ids[-1 - run - period]:
        run += 1
    return run + period if run else 0


def brute(ids: Sequence[int], s: RepetitionSettings) -> Cycle | None:
    """The first prefix ending in a qualifying cycle, with the smallest period that qualifies there."""
    for n in range(1, len(ids) + 1):
        covers = {p: cover(ids[:n], p) for p in range(1, s.max_period + 1)}
        qualifying = [p for p, c in covers.items() if c >= max(s.min_tokens, s.min_repeats * p)]
        if qualifying:
            period = min(qualifying)
            return Cycle(period=period, start=n - covers[period], tokens=covers[period])
    return None


def longest_cycle(ids: Sequence[int], max_period: int = MAX_PERIOD) -> Cycle | None:
    """The cycle covering the most tokens anywhere in `ids` (ties: the smallest period), among
    those holding two whole copies of their block: how close a text comes to the thresholds.
    Found apart from the watch, by comparing the ids with themselves shifted by each period."""
    import numpy as np

    a, best = np.asarray(ids), None
    for period in range(1, min(max_period, len(a) - 1) + 1):
        # a run of equal[j] from j = s, r long: ids[s : s + r + period] repeat a block of `period`
        edges = np.diff(np.concatenate(([0], (a[period:] == a[:-period]).astype(np.int8), [0])))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        if not len(starts):
            continue
        k = int((ends - starts).argmax())
        run = int(ends[k] - starts[k])
        if run >= period and (best is None or run + period > best.tokens):
            best = Cycle(period=period, start=int(starts[k]), tokens=run + period)
    return best


def test_the_watch_finds_what_a_brute_force_finds_whatever_the_deltas():
    rng = random.Random(7)
    settings = RepetitionSettings(max_period=6, min_tokens=10, min_repeats=3)
    fired = 0
    for case in range(300):
        # Given text from a small alphabet, sometimes with a block repeated inside it
        ids = [rng.randrange(3) for _ in range(rng.randint(1, 60))]
        if case % 2:
            block = [rng.randrange(4) for _ in range(rng.randint(1, 8))]
            ids[rng.randrange(len(ids)) :] = block * rng.randint(1, 6) + ids[: rng.randint(0, 5)]
        # When it is fed in deltas of any size
        found = fed(RepetitionWatch(settings), ids, rng, most=7)
        # Then the watch reports the brute force's cycle
        assert found == brute(ids, settings), ids
        fired += found is not None
    assert 30 < fired < 270


def test_a_loop_after_text_is_stopped_at_the_threshold_with_its_smallest_period():
    # Given 100 tokens of text, then a 3-token block written as a 6-token one, back to back
    text = list(range(100, 200))
    ids = text + [7, 8, 9, 7, 8, 9] * 200
    # When a watch is fed one token at a time, and another the whole output at once
    watch = RepetitionWatch()
    stopped_at = next(n for n in range(1, len(ids) + 1) if watch.feed(ids[n - 1 : n]) is not None)
    at_once = RepetitionWatch().feed(ids)
    # Then both find period 3 from the end of the text, as soon as it covers MIN_TOKENS
    assert watch.found == at_once == Cycle(period=3, start=100, tokens=MIN_TOKENS)
    assert stopped_at == 100 + MIN_TOKENS
    # and the cycle stays found
    assert watch.feed([1, 2, 3]) == watch.found


def test_blocks_up_to_max_period_and_only_with_enough_copies():
    block = list(range(MAX_PERIOD))
    # A 64-token block stops at MIN_REPEATS copies; a 65-token one is never looked for
    assert RepetitionWatch().feed(block * 20) == Cycle(MAX_PERIOD, 0, MIN_REPEATS * MAX_PERIOD)
    assert RepetitionWatch().feed(list(range(MAX_PERIOD + 1)) * 20) is None
    # With a raised bound a long block needs min_repeats copies, not only min_tokens
    wide = RepetitionSettings(max_period=128, min_tokens=64, min_repeats=4)
    assert RepetitionWatch(wide).feed(list(range(100)) * 5) == Cycle(100, 0, 400)
    assert RepetitionWatch(wide).feed([1, 2] * 40) == Cycle(2, 0, 64)
    # and a run one token short of the threshold does not stop
    assert RepetitionWatch().feed([5] * (MIN_TOKENS - 1)) is None


def test_the_settings_travel_with_the_job(monkeypatch):
    from fleet.engines.specs import job_config

    # Given the environment that sets the stop's thresholds, and one that turns it off
    monkeypatch.setenv("FLEET_REPETITION__MIN_TOKENS", "300")
    on = load_settings()
    monkeypatch.setenv("FLEET_REPETITION__ENABLED", "false")
    off = load_settings()
    # Then the job's configuration records them, and a worker reads back the same stop
    assert on.repetition.min_tokens == 300 and not off.repetition.enabled
    assert RepetitionSettings.of_job(job_config(on)) == on.repetition
    assert "repetition" not in job_config(off)
    assert watch_for(RepetitionSettings.of_job(job_config(off))) is None
    assert RepetitionSettings.of_job({}).enabled is False


# -- the tiny models ------------------------------------------------------------------------


def generated(model: Path, requests: list[GenRequest]) -> list[list[int]]:
    """Output ids of each request, through the hf engine as a worker runs it."""
    running = Running(hf_settings(model, max_batch=16))
    try:
        results = running.gen(*requests)
    finally:
        running.close()
    assert all(not isinstance(r, BaseException) and r.output_ids is not None for r in results), results
    return [r.output_ids for r in results]  # type: ignore[union-attr]


@pytest.mark.slow
def test_the_loop_model_loops_greedily_and_the_watch_stops_it(loop_model: Path):
    # Given the loop model's greedy rows, long enough to pass the threshold
    prompts = ["Explain prime numbers.", "What is 6 times 7?", "Write a poem.", "Hi"]
    rows = generated(loop_model, [chat(f"g{i}", p, temperature=0, max_tokens=MIN_TOKENS + 64)
                                  for i, p in enumerate(prompts)])
    rng = random.Random(0)
    for row in rows:
        # Then each row is one exact 3-token cycle from soon after its start to its last token
        loop = longest_cycle(row)
        assert loop is not None and loop.period == 3 and loop.start <= 8, loop
        assert loop.start + loop.tokens == len(row) == MIN_TOKENS + 64
        # and the watch, fed its deltas, stops it with period 3 once it covers MIN_TOKENS
        assert fed(RepetitionWatch(), row, rng) == Cycle(period=3, start=loop.start, tokens=MIN_TOKENS)


@pytest.mark.slow
def test_the_loop_model_sampled_does_not_loop(loop_model: Path):
    # Given the loop model's rows under its own sampling defaults
    rows = generated(loop_model, [chat(f"s{i}", f"Question {i}?", max_tokens=MIN_TOKENS) for i in range(8)])
    longest = max((longest_cycle(r) for r in rows), key=lambda c: c.tokens if c else 0)
    print(f"\nloop model, sampled: {sum(map(len, rows))} tokens, longest cycle {longest}")
    # Then no row holds a long exact cycle, and the stop never fires
    assert longest is None or longest.tokens < MIN_TOKENS // 8
    assert all(RepetitionWatch().feed(r) is None for r in rows)


def demo_requests(max_tokens: int = 256) -> list[GenRequest]:
    """The demo job's requests (README: examples/prompts.jsonl, --max-tokens 256), as a worker builds them."""
    return [
        GenRequest(
            record_id=r.id, chunk=0, sample=0, sampling=record_sampling({"max_tokens": max_tokens}, r,
                                                                           derive_seed(0, r.id, 0)),
            messages=r.messages, prompt=r.prompt, input_ids=r.input_ids, return_output_ids=True,
        )
        for r in read_records(EXAMPLES)
    ]


@pytest.mark.slow
def test_the_stop_never_fires_on_the_tiny_models_sampled_rows(tiny_model: Path):
    # Given the demo job's sampled rows from the tiny model
    rows = generated(tiny_model, demo_requests())
    rng = random.Random(1)
    longest = max((longest_cycle(r) for r in rows), key=lambda c: c.tokens if c else 0)
    print(f"\ntiny model, demo job: {len(rows)} rows, {sum(map(len, rows))} tokens, longest cycle {longest}")
    # Then none is stopped, and none comes within a quarter of the threshold
    assert len(rows) == 64 and sum(map(len, rows)) > 64 * 100
    assert all(fed(RepetitionWatch(), r, rng) is None for r in rows)
    assert longest is None or longest.tokens < MIN_TOKENS // 4


#: bytes of standard-library source taken (modules by name), beside every package's licence and readme
STDLIB_BYTES = 2_000_000


def healthy_texts() -> Iterator[tuple[str, str]]:
    """Real code and prose on every machine with the venv: standard-library modules, and the
    licences and readmes (METADATA) of the installed packages; about 4 MB."""
    paths = sysconfig.get_paths()
    taken = 0
    for path in sorted(Path(paths["stdlib"]).glob("*.py")):
        if taken >= STDLIB_BYTES:
            break
        text = path.read_text(encoding="utf-8", errors="replace")
        taken += len(text)
        yield path.name, text
    for path in sorted(Path(paths["purelib"]).glob("*.dist-info/**/*")):
        if path.is_file() and path.name.upper().startswith(("LICENSE", "COPYING", "METADATA", "README")):
            yield f"{path.parent.name}/{path.name}", path.read_text(encoding="utf-8", errors="replace")


@pytest.mark.slow
def test_the_stop_never_fires_on_real_code_and_prose(tiny_model: Path):
    from fleet.model.rendering import load_tokenizer

    tok = load_tokenizer(str(tiny_model))
    rng = random.Random(2)
    checked, worst = 0, (Cycle(1, 0, 0), "")
    for name, text in healthy_texts():
        # Given each file as one output, in the tiny model's tokens (about 3 per word)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        checked += len(ids)
        # Then the stop never fires on it
        assert fed(RepetitionWatch(), ids, rng, most=200) is None, name
        longest = longest_cycle(ids)
        if longest and longest.tokens > worst[0].tokens:
            worst = (longest, name)
    print(f"\nhealthy text: {checked} tokens checked, longest cycle {worst[0]} in {worst[1]}")
    # and about two million tokens came no closer to it than three quarters
    assert checked > 1_500_000
    assert worst[0].tokens <= MIN_TOKENS * 3 // 4, worst


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_job_on_the_loop_model_stops_greedy_loops_and_never_sampled_rows(loop_model: Path, tmp_path: Path,
                                                                           clean_env):
    # Given a job on the loop model: 4 greedy records and 4 sampled ones, 2,048 tokens allowed
    from tests.conftest import run_fleet

    prompts = tmp_path / "p.jsonl"
    lines = loop_job_lines()
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = {"FLEET_DATA_DIR": str(tmp_path / "data"), "FLEET_HF__THREADS": "1"}
    # When it runs through real workers
    done = run_fleet("run", str(prompts), "--job", "loops", "--engine", "hf", "--model", str(loop_model),
                     "--max-tokens", "2048", "--chunk-size", "4", "--workers", "1", env=env, cwd=tmp_path, timeout=540)
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out.jsonl"
    assert run_fleet("export", "--job", "loops", "--out", str(out), env=env, cwd=tmp_path).returncode == 0
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    status = json.loads(run_fleet("status", "--job", "loops", "--json", env=env, cwd=tmp_path).stdout)
    # Then every greedy row ended within a few hundred tokens, marked as a loop of period 3, and no sampled
    # row was marked; the job counts the loops (tests/fleetproc.py)
    check_loops_stopped(rows, status["records_repetition"])
    # and --only-finished leaves them out
    kept = tmp_path / "kept.jsonl"
    assert run_fleet("export", "--job", "loops", "--out", str(kept), "--only-finished", env=env,
                     cwd=tmp_path).returncode == 0
    assert not {r["id"] for r in map(json.loads, kept.read_text().splitlines())} & {f"g{i}" for i in range(4)}
