"""The typer app and the options every command shares."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from fleet.errors import FleetError
from fleet.settings import Settings, load_settings

app = typer.Typer(
    name="fleet",
    help="Crash-proof batch LLM generation on a fleet of GPUs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)

JobOpt = Annotated[str, typer.Option("--job", "-j", help="job name")]
EngineOpt = Annotated[str | None, typer.Option("--engine", help="sim, hf or sglang")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="model directory")]
BrokerOpt = Annotated[str | None, typer.Option("--broker-url", help="redis:// URL (FLEET_BROKER_URL)")]
StoreOpt = Annotated[str | None, typer.Option("--store-url", help="directory or s3://bucket/prefix")]
ChunkOpt = Annotated[int | None, typer.Option("--chunk-size", help="records per chunk")]
SlotsOpt = Annotated[int | None, typer.Option("--slots", help="K chunks per worker at once")]
DataDirOpt = Annotated[Path | None, typer.Option("--data-dir", help="local runtime directory")]


def settings_from(**flags: Any) -> Settings:
    """Settings with the CLI flags that were given on top of env and fleet.toml."""
    try:
        return load_settings(**flags)
    except Exception as e:  # pydantic ValidationError names the field
        fail(f"invalid settings: {e}")


def fail(message: str, code: int = 2) -> NoReturn:
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


def run_guarded(fn, *args: Any, **kwargs: Any) -> Any:
    """Turn fleet's own errors into a clear message and a non-zero exit, no traceback."""
    try:
        return fn(*args, **kwargs)
    except FleetError as e:
        fail(str(e))


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
