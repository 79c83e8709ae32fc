"""A real headless Chromium (Debian's `chromium` package) for pages a person looks at."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars",
)  # fmt: skip


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError("no Chromium: apt-get install -y chromium (.ci/run installs it)")


def render(
    url: str, profile: Path, *, screenshot: Path | None = None, budget_ms: int = 15000, size: str = "1600,900"
) -> str:
    """The DOM after the page's scripts ran (virtual time lets its AJAX calls finish)."""
    argv = [
        chromium(),
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        f"--window-size={size}",
    ]
    if screenshot is not None:
        subprocess.run([*argv, f"--screenshot={screenshot}", url], capture_output=True, timeout=120, check=True)
    res = subprocess.run([*argv, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout
