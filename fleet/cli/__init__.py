"""The `fleet` console script. Each module of this package adds its commands to one app."""

from __future__ import annotations

from fleet.cli.app import app

# Importing the command modules registers their commands on `app`.
from fleet.cli import bench, jobs, models, ops, workers  # noqa: E402,F401  isort: skip


def main() -> None:
    app()


__all__ = ["app", "main"]
