"""Progress of `fleet enqueue` and `fleet export`: a live rich display on a real terminal
(`script` gives the command a pty), plain lines on a pipe; the core stays UI-free."""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from fleet.cli.liveprogress import live_progress
from fleet.progress import counted
from tests.conftest import ROOT, run_fleet
from tests.fleetproc import FAST_SIM, write_prompts

ANSI = re.compile(r"\x1b\[")


def test_counted_reports_every_n_and_the_end() -> None:
    seen: list[tuple[str, int, int | None]] = []
    assert list(counted(range(2500), lambda *a: seen.append(a), "p", 2500, every=1000)) == list(range(2500))
    assert seen == [("p", 0, 2500), ("p", 1000, 2500), ("p", 2000, 2500), ("p", 2500, 2500)]
    assert list(counted("ab", None, "p")) == ["a", "b"]


def test_rich_display_on_a_terminal_console() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=140)
    with live_progress(console) as report:
        report("write chunks", 0, 5000)
        report("write chunks", 5000, 5000)
    text = out.getvalue()
    assert ANSI.search(text) and "write chunks" in text and "5000/5000" in text and "ETA" in text


def in_a_terminal(args: list[str], env: dict[str, str]) -> str:
    """Run `fleet ARGS` on a pseudo-terminal (util-linux `script`) and return what it showed."""
    cmd = shlex.join([sys.executable, "-m", "fleet", *args])
    res = subprocess.run(
        ["script", "-qec", cmd, "/dev/null"],
        env={**os.environ, **env, "COLUMNS": "160"},
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


@pytest.mark.slow
def test_enqueue_and_export_progress_on_a_pipe_and_a_terminal(tmp_path: Path, redis_server, clean_env) -> None:
    env = {
        **FAST_SIM,
        "FLEET_BROKER_URL": redis_server.url,
        "FLEET_STORE_URL": str(tmp_path / "store"),
        "FLEET_CHUNK_SIZE": "50",
        "PYTHONPATH": str(ROOT),
    }
    prompts = write_prompts(tmp_path / "p.jsonl", 3000)
    # On a pipe: one plain line per phase, no escape codes, no carriage returns
    res = run_fleet("enqueue", str(prompts), "--job", "piped", env=env)
    assert res.returncode == 0, res.stderr
    assert re.search(r"^validate: 3,000 records, [\d,]+ records/s, [\d.]+s done$", res.stderr, re.M), res.stderr
    assert re.search(r"^write chunks: 3,000 records, .* done$", res.stderr, re.M), res.stderr
    assert not ANSI.search(res.stderr) and "\r" not in res.stderr
    # On a terminal: rich's live display with counts, rate and ETA
    shown = in_a_terminal(["enqueue", str(prompts), "--job", "tty"], env)
    assert ANSI.search(shown) and "3000/3000" in shown and "records/s" in shown and "ETA" in shown, shown
    # Export of a finished job (run by real workers through `fleet run`) the same two ways
    local = {k: v for k, v in env.items() if k != "FLEET_BROKER_URL"} | {"FLEET_DATA_DIR": str(tmp_path / "data")}
    small = write_prompts(tmp_path / "s.jsonl", 200)
    assert run_fleet("run", str(small), "--job", "done", "--workers", "1", env=local).returncode == 0
    res = run_fleet("export", "--job", "done", "--out", str(tmp_path / "o.jsonl"), env=local)
    assert res.returncode == 0, res.stderr
    assert re.search(r"^export: 200 records, .* done$", res.stderr, re.M), res.stderr
    assert not ANSI.search(res.stderr)
    shown = in_a_terminal(["export", "--job", "done", "--out", str(tmp_path / "t.jsonl")], local)
    assert ANSI.search(shown) and "200/200" in shown and "ETA" in shown, shown
