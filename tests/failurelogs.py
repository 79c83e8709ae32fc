"""A failed test says why in a run's last lines: the tail of every log its processes wrote.

A test that starts workers, a `vllm serve` or an engine keeps their logs under its own tmp_path
(`*.log`); when it fails, the tail of each (the newest first) rides on its report (user_properties,
which pytest-xdist carries back from its workers), and the terminal summary prints them after every
failure's traceback, so whoever reads the end of a CI log sees the test, the process and its last
words without rerunning (docs/architecture.md, "Tests").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

#: lines kept from the end of each log, and logs kept per failed test (newest first)
TAIL_LINES = 25
MAX_LOGS = 4
SECTION = "process logs"


def log_tails(root: Path) -> list[tuple[str, str]]:
    """(path, last lines) of the newest `*.log` files below `root`."""
    logs = sorted((p for p in root.rglob("*.log") if p.is_file()), key=lambda p: p.stat().st_mtime, reverse=True)
    out = []
    for path in logs[:MAX_LOGS]:
        lines = path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
        out.append((str(path.relative_to(root)), "\n".join(lines)))
    return out


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if not report.failed or not isinstance(tmp, Path) or not tmp.exists():
        return
    tails = log_tails(tmp)
    if tails:
        report.user_properties.append((SECTION, "\n".join(f"--- {name} (last {TAIL_LINES} lines)\n{text}"
                                                           for name, text in tails)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """After the tracebacks, before the short summary: each failed test's process logs."""
    for report in terminalreporter.stats.get("failed", []):
        for name, text in getattr(report, "user_properties", []):
            if name == SECTION:
                terminalreporter.write_sep("-", f"{SECTION}: {report.nodeid}")
                terminalreporter.write_line(text)
