"""The fast tier stays fast: a test that runs it past FAST_LIMIT_S is named at the end of the run.

The fast tier (`-m "not e2e and not slow"`, docs/architecture.md "Tests") is every test that starts no
fleet process, model or bench; a test is kept out of it by `@pytest.mark.slow`. Nothing but a measurement
tells which tests are slow, so a run of the tier lists the ones it measured over the limit, to be marked.
"""

from __future__ import annotations

import pytest

#: seconds (setup, call and teardown together) past which a test does not belong in the fast tier
FAST_LIMIT_S = 2.0


def in_fast_tier(config: pytest.Config) -> bool:
    expr = (config.option.markexpr or "").replace(" ", "")
    return "notslow" in expr and "note2e" in expr


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if not in_fast_tier(config):
        return
    took: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                took[report.nodeid] = took.get(report.nodeid, 0.0) + report.duration
    slow = sorted(((s, n) for n, s in took.items() if s > FAST_LIMIT_S), reverse=True)
    if slow:
        terminalreporter.write_sep("-", f"{len(slow)} test(s) took over {FAST_LIMIT_S:g}s: mark them @pytest.mark.slow")
        for seconds, nodeid in slow:
            terminalreporter.write_line(f"{seconds:6.1f}s {nodeid}")
