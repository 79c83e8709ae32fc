"""Operations commands: `fleet plan`, `fleet flower`, `fleet doctor`."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fleet.cli.app import (
    BrokerOpt,
    EngineOpt,
    ModelOpt,
    StoreOpt,
    app,
    fail,
    run_guarded,
    settings_from,
    setup_logging,
)
from fleet.cli.flags import gpu_kind, job_name, model_dir, positive
from fleet.errors import FleetError
from fleet.model.gpus import GPU_TABLE, gpu_spec
from fleet.settings import PLANNED_ENGINE
from fleet.settings.sglang import RadixCache
from fleet.tools.jobplan import (
    DEFAULT_BATCH,
    DEFAULT_BYTES_PER_PARAM,
    ModelFacts,
    Plan,
    make_plan,
    model_facts_from_dir,
)

out = Console()  # results go to stdout; app.console (stderr) carries errors and logs

GPU_KINDS = ", ".join(GPU_TABLE)


# -- fleet plan ----------------------------------------------------------------------------


def _model_facts(
    model: str | None,
    params_b: float | None,
    bytes_per_param: float,
    batch: int,
    kv_bytes_per_token: float | None,
    context: float | None,
    state_mb_per_request: float | None,
    accept_length: float,
) -> ModelFacts | None:
    overrides = {
        "params_b": params_b,
        "bytes_per_param": bytes_per_param,
        "batch": batch,
        "kv_bytes_per_token": kv_bytes_per_token,
        "context_tokens": context,
        "state_bytes_per_request": None if state_mb_per_request is None else state_mb_per_request * 1e6,
        "accept_length": accept_length,
    }
    if model:
        return model_facts_from_dir(model, **overrides)
    if params_b is None:
        return None
    return ModelFacts(**{k: v for k, v in overrides.items() if v is not None})


def _hours(seconds: float) -> str:
    days, rem = divmod(int(round(seconds / 60)), 24 * 60)
    h, m = divmod(rem, 60)
    return f"{seconds / 3600:,.1f} hours" + (f" ({days} d {h} h {m} min)" if days else f" ({h} h {m} min)")


def render_plan(plan: Plan) -> Table:
    spec = gpu_spec(plan.gpu)
    table = Table(title="fleet plan", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    workers = f"; {plan.gpus // plan.gpus_per_worker} workers of {plan.gpus_per_worker} GPUs (tensor parallel)" \
        if plan.gpus_per_worker > 1 else ""
    table.add_row("fleet", f"{plan.gpus} x {plan.gpu} ({spec.hbm_gb:g} GB, {spec.hbm_tb_s:g} TB/s){workers}")
    table.add_row("price", f"${plan.usd_per_gpu_hour:,.2f}/GPU-hour = ${plan.usd_per_hour:,.2f}/hour")
    table.add_row("job shape", plan.shape)
    per_prompt = f" x {plan.prompt_tokens:,.0f} prompt tokens" if plan.prompt_tokens else ""
    table.add_row("prompts", f"{plan.prompts:,}{per_prompt}")
    table.add_row(
        "output tokens",
        f"{plan.total_output_tokens:,.0f} ({plan.total_output_tokens / 1e9:,.2f} B; "
        f"{plan.output_tokens:,.0f} per prompt)",
    )
    basis = "given" if plan.basis == "estimate" else "roofline: a best case"
    table.add_row("throughput", f"{plan.fleet_tok_s:,.0f} tok/s ({plan.tok_s_per_gpu:,.0f} per GPU, {basis})")
    table.add_row("wall time", _hours(plan.wall_s))
    table.add_row("cost", f"${plan.cost_usd:,.2f}")
    table.add_row("$ / M output tokens", f"${plan.usd_per_m_output_tokens:,.3f}")
    roof = plan.roofline
    if roof is not None:
        table.add_row(
            "roofline / GPU",
            f"{roof.tok_s:,.0f} tok/s ({roof.bound} bound; bandwidth {roof.memory_tok_s:,.0f}, "
            f"compute {roof.compute_tok_s:,.0f})",
        )
        table.add_row(
            "decode step",
            f"{roof.bytes_per_step / 1e9:,.1f} GB read ({roof.weight_bytes / 1e9:,.1f} weights + "
            f"{roof.kv_bytes_per_step / 1e9:,.1f} KV/state) = {roof.step_ms:,.2f} ms",
        )
        fits = "fits" if roof.fits else "DOES NOT FIT"
        table.add_row("memory at batch", f"{roof.memory_needed_gb:,.1f} GB of {spec.hbm_gb:g} GB ({fits})")
        if plan.estimate_vs_roofline is not None:
            table.add_row("estimate vs roofline", f"{plan.estimate_vs_roofline:.0%} of the physical limit")
    cap = plan.capacity
    if cap is not None:
        table.add_row(
            "sglang capacity",
            f"{cap['batch']} requests at once per worker (SGLang's limit {cap['max_running_requests']}, KV room for "
            f"{cap['kv_bound_requests']}); weights {cap['weights_gib']:.1f} GiB, KV {cap['kv_kib_per_token']:g} "
            f"KiB/token, state {cap['state_mib_per_slot']:.1f} MiB/slot x {cap['state_slots_per_request']} per "
            f"request, mem_fraction_static {cap['mem_fraction_static']}",
        )
        table.add_row("at that batch", f"{_hours(plan.wall_s)}, ${plan.cost_usd:,.2f}")
    return table


@app.command()
def plan(
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPU count")] = 1,
    gpus_per_worker: Annotated[int, typer.Option(
        "--gpus-per-worker", min=1, help="GPUs each worker spans with tensor parallelism (`fleet worker "
        "--gpus-per-worker`): the capacity and roofline of one engine over that many")] = 1,
    gpu: Annotated[str, typer.Option("--gpu", callback=gpu_kind, help=f"GPU kind: {GPU_KINDS}")] = "b200",
    usd_per_gpu_hour: Annotated[
        float | None, typer.Option("--usd-per-gpu-hour", help="price (FLEET_USD_PER_GPU_HOUR)")
    ] = None,
    prompts: Annotated[
        int | None,
        typer.Option("--prompts", min=0, help="number of prompts (default: the job's, else the reference job's)"),
    ] = None,
    prompt_tokens: Annotated[
        float | None, typer.Option("--prompt-tokens", min=0, help="mean prompt tokens (default: as --prompts)")
    ] = None,
    output_tokens: Annotated[
        float | None,
        typer.Option("--output-tokens", callback=positive, help="mean output tokens (default: as --prompts)"),
    ] = None,
    job: Annotated[
        str | None,
        typer.Option("--job", "-j", callback=job_name, help="plan this job: its samples and measured token means"),
    ] = None,
    store_url: StoreOpt = None,
    tok_s_per_gpu: Annotated[
        float | None,
        typer.Option("--tok-s-per-gpu", callback=positive, help="measured output tok/s per GPU (fleet bench)"),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", callback=model_dir, help="model directory: weights and KV size for the roofline"),
    ] = None,
    params_b: Annotated[
        float | None, typer.Option("--params-b", callback=positive, help="roofline: parameters, billions")
    ] = None,
    bytes_per_param: Annotated[
        float, typer.Option("--bytes-per-param", callback=positive, help="roofline: 2 for BF16, 1 for FP8")
    ] = DEFAULT_BYTES_PER_PARAM,
    batch: Annotated[
        int | None,
        typer.Option("--batch", min=1,
                     help="roofline: running requests per GPU (default: the capacity model's, else 256)"),
    ] = None,
    kv_bytes_per_token: Annotated[
        float | None,
        typer.Option("--kv-bytes-per-token", min=0, help="roofline: KV cache bytes per token"),
    ] = None,
    context: Annotated[
        float | None,
        typer.Option("--context", callback=positive, help="roofline: mean KV tokens (default prompt + output/2)"),
    ] = None,
    state_mb_per_request: Annotated[
        float | None,
        typer.Option("--state-mb-per-request", min=0, help="roofline: recurrent state per request, MB"),
    ] = None,
    accept_length: Annotated[
        float,
        typer.Option("--accept-length", min=1, help="roofline: tokens per step with speculative decoding"),
    ] = 1.0,
    mtp: Annotated[
        bool | None, typer.Option("--mtp/--no-mtp", help="capacity: MTP speculative decoding (FLEET_SGLANG__MTP)")
    ] = None,
    radix: Annotated[
        RadixCache | None, typer.Option("--radix", help="capacity: radix cache auto|on|off (FLEET_SGLANG__RADIX_CACHE)")
    ] = None,
    engine: Annotated[
        str, typer.Option("--engine", help="capacity: the engine whose capacity model sizes the batch")
    ] = PLANNED_ENGINE,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Throughput, wall time and cost of a job on a fleet, next to the roofline.

    With --model, the capacity model (fleet.model.capacity) says how many requests SGLang really
    runs at once on that GPU, and the roofline is taken at that batch.
    """
    from fleet.tools.jobplan import fill_shape, job_shape, reference_shape

    settings = settings_from(model=model, store_url=store_url, engine=engine, usd_per_gpu_hour=usd_per_gpu_hour)
    usd_per_gpu_hour = settings.monitor.usd_per_gpu_hour
    try:
        from fleet.bench.reference import REFERENCE

        base = reference_shape(REFERENCE.prompts, REFERENCE.prompt_tokens, REFERENCE.output_tokens)
        if job:
            from fleet.monitor.status import job_status
            from fleet.store import store_for

            base = job_shape(job_status(store_for(settings), None, job), base)
        shape = fill_shape(base, prompts, prompt_tokens, output_tokens)
        prompts, prompt_tokens, output_tokens = shape.prompts, shape.prompt_tokens, shape.output_tokens
        cap = None
        if model:
            from fleet.engines.specs import spec_for

            cap = spec_for(engine).job_capacity(settings, gpu, prompt_tokens + output_tokens, mtp=mtp, radix=radix,
                                                gpus=gpus_per_worker)
        if batch is None:
            batch = cap.batch if cap is not None and cap.batch else DEFAULT_BATCH
        facts = _model_facts(
            model, params_b, bytes_per_param, batch, kv_bytes_per_token, context,
            state_mb_per_request, accept_length,
        )  # fmt: skip
        result = make_plan(
            gpus=gpus,
            gpu=gpu,
            usd_per_gpu_hour=usd_per_gpu_hour,
            prompts=prompts,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            tok_s_per_gpu=tok_s_per_gpu,
            model=facts,
            capacity=cap.to_dict() if cap is not None else None,
            gpus_per_worker=gpus_per_worker,
        )
        result = replace(result, shape=shape.source)
    except FleetError as e:
        fail(str(e))
        return
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        out.print(render_plan(result))


# -- fleet flower --------------------------------------------------------------------------


@app.command()
def flower(
    broker_url: BrokerOpt = None,
    address: Annotated[str | None, typer.Option("--address", help="bind address (FLEET_FLOWER_ADDRESS)")] = None,
    port: Annotated[int | None, typer.Option("--port", help="port (FLEET_FLOWER_PORT)")] = None,
) -> None:
    """Flower for this app with the workers' broker settings; basic auth off loopback.

    The credential comes from FLEET_FLOWER_BASIC_AUTH (user:password), never a flag.
    """
    from fleet.monitor.flower import run_flower

    setup_logging()
    settings = settings_from(broker_url=broker_url, address=address, port=port)
    code = run_guarded(run_flower, settings)
    raise typer.Exit(code or 0)


# -- fleet doctor --------------------------------------------------------------------------


@app.command()
def doctor(
    broker_url: BrokerOpt = None,
    store_url: StoreOpt = None,
    engine: EngineOpt = None,
    model: ModelOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    gpus: Annotated[int | None, typer.Option("--gpus", min=1, help="the planned fleet's GPUs (as for `fleet plan`): "
                                             "fails if the broker's maxclients has no room for their workers")] = None,
) -> None:
    """Pre-flight: broker, store, GPUs, model files and engine args. Exit 1 when one fails."""
    from fleet.tools.doctor import run_checks

    settings = settings_from(broker_url=broker_url, store_url=store_url, engine=engine, model=model)
    checks = run_checks(settings, gpus)
    if as_json:
        rows = [{"name": c.name, "ok": c.ok, "skipped": c.skipped, "detail": c.detail} for c in checks]
        typer.echo(json.dumps(rows, indent=2))
    else:
        table = Table(title="fleet doctor", title_justify="left")
        table.add_column("check", style="bold")
        table.add_column("status")
        table.add_column("detail", overflow="fold")
        style = {"ok": "green", "FAIL": "bold red", "skipped": "dim"}
        for c in checks:
            table.add_row(c.name, f"[{style[c.status]}]{c.status}[/]", c.detail)
        out.print(table)
    if not all(c.ok for c in checks):
        raise typer.Exit(1)
