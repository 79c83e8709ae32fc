"""`fleet worker`: one supervised worker process per GPU, or N for CPU engines."""

from __future__ import annotations

from typing import Annotated

import typer

from fleet.cli.app import (
    BrokerOpt,
    EngineOpt,
    ModelOpt,
    SlotsOpt,
    StoreOpt,
    app,
    fail,
    settings_from,
    setup_logging,
)


@app.command()
def worker(
    gpus: Annotated[str | None, typer.Option("--gpus", help="'all' or '0,1,4': one pinned worker per GPU")] = None,
    workers: Annotated[int | None, typer.Option("--workers", "-w", help="CPU worker processes")] = None,
    host: Annotated[str | None, typer.Option("--host-name", help="host part of worker names")] = None,
    engine: EngineOpt = None, model: ModelOpt = None, broker_url: BrokerOpt = None,
    store_url: StoreOpt = None, slots: SlotsOpt = None,
) -> None:
    """Start and supervise workers against the configured broker and store."""
    setup_logging()
    from fleet.worker.launcher import Supervisor, plan_workers

    settings = settings_from(engine=engine, model=model, broker_url=broker_url, store_url=store_url, slots=slots)
    if not settings.broker_url:
        fail("no broker configured: set FLEET_BROKER_URL or pass --broker-url")
    gpu_list = None
    if gpus:
        from fleet.errors import FleetError
        from fleet.model.gpus import parse_gpu_spec

        try:
            gpu_list = parse_gpu_spec(gpus)
        except FleetError as e:
            fail(str(e))
    Supervisor(settings, plan_workers(settings, workers, gpu_list, host)).run_forever()
