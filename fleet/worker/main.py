"""Entry point of one worker process: `python -m fleet.worker.main --name gpu0@host`."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="fleet-worker")
    parser.add_argument("--name", required=True, help="Celery node name, e.g. gpu0@host")
    parser.add_argument("--concurrency", type=int, required=True, help="K chunk slots")
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)

    from fleet.worker.parent import from_env

    from_env()
    from fleet.worker.app import app, settings

    app.worker_main(
        [
            "worker",
            "--pool=threads",
            f"--concurrency={args.concurrency}",
            f"--hostname={args.name}",
            f"--queues={settings.queue}",
            f"--loglevel={args.loglevel}",
            "--task-events",
            "--without-mingle",
        ]
    )


if __name__ == "__main__":
    main()
