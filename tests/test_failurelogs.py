"""A failed run's last lines name the test and show its processes' last words (tests/failurelogs.py); the fast
tier names a test that runs it past its limit (tests/fasttier.py); the long tests start first (tests/longfirst.py)."""

from __future__ import annotations

import pytest

INNER = '''
from pathlib import Path

def test_a_worker_dies(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "host-a.log").write_text("\\n".join(f"host-a line {i}" for i in range(200)))
    (logs / "host-b.log").write_text("engine ready\\nTraceback: the engine died")
    assert False, "the job did not finish"

def test_passes_quietly(tmp_path: Path) -> None:
    (tmp_path / "quiet.log").write_text("nothing to see")
'''


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_failed_tests_logs_come_after_its_traceback(pytester: pytest.Pytester, workers: list[str]) -> None:
    # Given a test that writes its worker logs under tmp_path and then fails
    pytester.makepyfile(test_inner=INNER)
    # When the run ends, with the plugin on (serially, or through pytest-xdist's workers)
    result = pytester.runpytest_subprocess("-p", "tests.failurelogs", "-ra", *workers)
    # Then its last lines hold each log's tail, named, after the traceback and before the summary
    out = result.stdout.str()
    assert result.ret == 1
    header = out.index("process logs: test_inner.py::test_a_worker_dies")
    assert out.index("AssertionError") < header < out.index("short test summary info")
    tail = out[header:]
    assert "logs/host-b.log" in tail and "Traceback: the engine died" in tail
    assert "host-a line 199" in tail and "host-a line 175" in tail and "host-a line 174" not in tail
    assert "nothing to see" not in out  # a passing test's logs stay out


SLOW_INNER = '''
import time

def test_quick() -> None:
    pass

def test_dawdles() -> None:
    time.sleep(2.5)
'''


@pytest.mark.slow
@pytest.mark.parametrize("markexpr", ["not e2e and not slow", ""], ids=["fast-tier", "whole-suite"])
def test_the_fast_tier_names_a_test_that_runs_past_its_limit(pytester: pytest.Pytester, markexpr: str) -> None:
    # Given an unmarked test that takes 2.5 s
    pytester.makepyfile(test_inner=SLOW_INNER)
    # When the fast tier runs it (or the whole suite does)
    result = pytester.runpytest_subprocess("-p", "tests.fasttier", *(["-m", markexpr] if markexpr else []))
    out = result.stdout.str()
    assert result.ret == 0
    # Then the fast tier names it, and only it, to be marked slow; the whole suite does not ask
    if markexpr:
        assert "1 test(s) took over 2s: mark them @pytest.mark.slow" in out
        assert "test_inner.py::test_dawdles" in out and "test_inner.py::test_quick" not in out
    else:
        assert "took over" not in out


ORDER_SHORT = '''
def test_short_module_first() -> None:
    pass
'''

ORDER_LONG = '''
import pytest

SETUPS = []

@pytest.fixture(scope="module", params=["a", "b"])
def engine(request):
    SETUPS.append(request.param)
    return request.param

def test_short_in_a_long_module(engine) -> None:
    pass

@pytest.mark.slow
def test_long(engine) -> None:
    pass

@pytest.mark.e2e
def test_last_sets_up_each_engine_once() -> None:
    assert SETUPS == ["a", "b"]
'''


def test_a_module_with_a_long_test_starts_first_whole_and_sets_up_each_fixture_value_once(
    pytester: pytest.Pytester,
) -> None:
    # Given a short module collected first, and a long one whose module-scoped fixture has two values
    pytester.makepyfile(test_a_short=ORDER_SHORT, test_b_long=ORDER_LONG)
    pytester.makeini("[pytest]\nmarkers =\n    slow: long\n    e2e: long\n")
    # When the plugin orders the run
    result = pytester.runpytest_inprocess("-p", "tests.longfirst", "-v")
    # Then the long module runs first, in the order pytest gave it: each fixture value set up once
    ran = [line.split("::")[1].split(" ")[0] for line in result.outlines if "::" in line and "PASSED" in line]
    assert ran == ["test_short_in_a_long_module[a]", "test_long[a]", "test_short_in_a_long_module[b]",
                   "test_long[b]", "test_last_sets_up_each_engine_once", "test_short_module_first"]  # fmt: skip
    assert result.ret == 0
