"""The typer app and the options every command shares."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from fleet.errors import FleetError, ServiceUnreachable, TargetUnwritable
from fleet.settings import Settings, load_settings

app = typer.Typer(
    name="fleet",
    help="Crash-proof batch LLM generation on a fleet of GPUs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(stderr=True)
#: exit status of a command that could not reach the broker or the store, or write its output
EXIT_UNREACHABLE = 3
#: the settings this command loaded, so an error handler can name the service's URL
loaded: list[Settings] = []

JobOpt = Annotated[str, typer.Option("--job", "-j", help="job name")]
EngineOpt = Annotated[str | None, typer.Option("--engine", help="sim, hf, sglang or vllm")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="model directory")]
BrokerOpt = Annotated[str | None, typer.Option("--broker-url", help="redis:// URL (FLEET_BROKER_URL)")]
StoreOpt = Annotated[str | None, typer.Option("--store-url", help="directory or s3://bucket/prefix")]
ChunkOpt = Annotated[int | None, typer.Option("--chunk-size", help="records per chunk")]
SlotsOpt = Annotated[int | None, typer.Option("--slots", help="K chunks per worker at once")]
TurnsOpt = Annotated[str | None, typer.Option(
    "--turns", help="last (default) or all: generate every assistant turn of a conversation (FLEET_TURNS)")]
DataDirOpt = Annotated[Path | None, typer.Option("--data-dir", help="local runtime directory")]


def settings_from(**flags: Any) -> Settings:
    """Settings with the CLI flags that were given on top of env and fleet.toml."""
    try:
        settings = load_settings(**flags)
    except Exception as e:  # pydantic ValidationError names the field
        fail(f"invalid settings: {e}")
    loaded[:] = [settings]
    return settings


def fail(message: str, code: int = 2) -> NoReturn:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def run_guarded(fn, *args: Any, **kwargs: Any) -> Any:
    """Turn fleet's own errors into a clear message and a non-zero exit, no traceback."""
    try:
        return fn(*args, **kwargs)
    except (ServiceUnreachable, TargetUnwritable) as e:
        fail(str(e), code=EXIT_UNREACHABLE)
    except FleetError as e:
        fail(str(e))


def preflight(settings: Settings, *, broker: bool = False, store: bool = False) -> None:
    """Reach the services a command needs before it does anything (one line if one is down)."""
    from fleet.store import store_for
    from fleet.tools.preflight import ping_broker, ping_store

    if broker:
        run_guarded(ping_broker, settings)
    if store:
        run_guarded(ping_store, run_guarded(store_for, settings))


def fail_unreachable(exc: BaseException) -> NoReturn:
    """A connection error that escaped a command (a service lost mid-run): one line, no traceback."""
    from fleet.tools.preflight import unreachable

    message = unreachable(exc, loaded[0] if loaded else None)
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise SystemExit(EXIT_UNREACHABLE)


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
