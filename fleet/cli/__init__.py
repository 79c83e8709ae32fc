"""The `fleet` console script. Each module of this package adds its commands to one app."""

from __future__ import annotations

from fleet.cli.app import app, fail_unreachable

# Importing the command modules registers their commands on `app`.
from fleet.cli import bench, joboptions, jobs, models, monitoring, ops, workers  # noqa: E402,F401  isort: skip


def main() -> None:
    from fleet.tools.preflight import connection_errors

    try:
        app()
    except connection_errors() as e:  # evaluated as the error escapes: the stores this run used
        fail_unreachable(e)


__all__ = ["app", "main"]
