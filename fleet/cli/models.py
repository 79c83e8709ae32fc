"""Model commands: `fleet tiny-model` (an offline test model) and `fleet engine-args`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from fleet.cli.app import EngineOpt, ModelOpt, app, fail, run_guarded, settings_from
from fleet.cli.flags import gpu_kind


@app.command("tiny-model")
def tiny_model(
    out_dir: Annotated[Path, typer.Argument(help="directory to write the model to")],
    seed: Annotated[int, typer.Option("--seed", help="weight seed; same seed, same files")] = 0,
    hybrid: Annotated[
        bool, typer.Option("--hybrid", help="linear-attention layers, MoE and an MTP layer (for vllm), bf16")
    ] = False,
    loop: Annotated[
        bool, typer.Option("--loop", help="greedy rows fall into an exact 3-token cycle (tests the repetition stop)")
    ] = False,
) -> None:
    """Build a tiny random-weight Qwen3 model (or, --hybrid, a Qwen3.5-shaped hybrid) with no network."""
    if hybrid and loop:
        fail("--loop builds the dense model: drop --hybrid")
    if hybrid:
        from fleet.model.tinyhybrid import build_tiny_hybrid_model

        path = build_tiny_hybrid_model(out_dir, seed=seed)
    else:
        from fleet.model.tinymodel import build_tiny_model

        path = build_tiny_model(out_dir, seed=seed, loop=loop)
    typer.echo(str(path))


@app.command("engine-args")
def engine_args(
    engine: EngineOpt = "sglang",
    model: ModelOpt = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", callback=gpu_kind,
                                 help="GPU kind (h100, h200, b200, ...); default: this host's GPU")
    ] = None,
) -> None:
    """Print, as JSON, the kwargs the worker would pass to its engine (the engine need not be installed).

    sglang: max_running_requests and mem_fraction_static come from the capacity model for that GPU.
    """
    settings = settings_from(engine=engine, model=model)
    from fleet.engines.specs import spec_for

    spec = spec_for(settings)
    kwargs = run_guarded(spec.engine_args, settings, gpu)
    if kwargs is None:
        fail(f"engine {engine!r} takes no engine args")
    typer.echo(json.dumps(kwargs, indent=2, sort_keys=True))
