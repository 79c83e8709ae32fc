"""`fleet worker`: one supervised worker process per GPU (or group of GPUs), or N for CPU engines."""

from __future__ import annotations

from typing import Annotated

import typer

from fleet.cli.app import (
    BrokerOpt,
    EngineOpt,
    GpusOpt,
    ModelOpt,
    SlotsOpt,
    StoreOpt,
    WorkersOpt,
    app,
    fail,
    run_guarded,
    settings_from,
    setup_logging,
)


@app.command()
def worker(
    gpus: GpusOpt = None,
    gpus_per_worker: Annotated[int | None, typer.Option(
        "--gpus-per-worker", min=1, help="with --gpus: GPUs each worker is pinned to, its engine's tensor parallelism "
        "set to match (a divisor of the GPU count); default: the engine's own setting (sglang.tp_size, "
        "vllm.tensor_parallel_size), 1")] = None,
    workers: WorkersOpt = None,
    host: Annotated[str | None, typer.Option("--host-name", help="host part of worker names")] = None,
    engine: EngineOpt = None, model: ModelOpt = None, broker_url: BrokerOpt = None,
    store_url: StoreOpt = None, slots: SlotsOpt = None,
) -> None:
    """Start and supervise workers against the configured broker and store."""
    setup_logging()
    from fleet.worker.supervisor.launcher import Supervisor, plan_workers

    settings = settings_from(engine=engine, model=model, broker_url=broker_url, store_url=store_url, slots=slots)
    if not settings.broker_url:
        fail("no broker configured: set FLEET_BROKER_URL or pass --broker-url")
    from fleet.store.schemes import scheme_of

    run_guarded(scheme_of, settings.resolved_store_url)  # a store URL no worker could open, before they start
    gpu_list, per_worker = None, 1
    if gpus:
        from fleet.engines.specs import spec_for
        from fleet.errors import FleetError
        from fleet.model.gpus import gpu_groups, parse_gpu_spec

        try:
            gpu_list = parse_gpu_spec(gpus)
            spec = spec_for(settings)
            per_worker = gpus_per_worker or spec.gpus_per_worker(settings)
            gpu_groups(gpu_list, per_worker)
            settings = spec.spanning(settings, per_worker)
        except FleetError as e:
            fail(str(e))
    elif gpus_per_worker:
        fail("--gpus-per-worker needs --gpus (the GPUs to split among the workers)")
    Supervisor(settings, plan_workers(settings, workers, gpu_list, host, per_worker)).run_forever()
