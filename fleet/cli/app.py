"""The typer app and the options every command shares."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from typer.core import TyperGroup

from fleet.cli.flags import gpu_indexes, job_name, model_dir
from fleet.errors import FleetError, ServiceUnreachable, TargetUnwritable
from fleet.settings import ENGINE_SECTIONS, Settings, load_settings
from fleet.settings.sections import LEGACY_NAMES

#: click's UsageError as typer raises it (its BadParameter's base), whichever click typer uses
UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


class OneLineErrors(TyperGroup):
    """A bad flag (a value out of range, not one of the choices, a missing path, an unknown option)
    is one line naming the flag and its value, exit 2, like a bad setting (`settings_from`): not
    typer's usage box. Raised while a command's flags are parsed, so before anything runs."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # a group given no command prints its help
                raise
            fail(flag_error(e), code=getattr(e, "exit_code", 2))


def flag_error(e: Any) -> str:
    """`--workers -3: Input should be greater than or equal to 1`: the flag, the value given, why.
    Click's own line for the rest (a missing option, an unknown one)."""
    param, cause = getattr(e, "param", None), e.__cause__
    option = max(param.opts, key=len) if getattr(param, "param_type_name", "") == "option" else None
    if isinstance(cause, ValidationError) and cause.errors():
        err = cause.errors()[0]
        why = err["msg"].removeprefix("Value error, ")
        return f"{option} {err['input']}: {why}" if option else f"{err['input']!r}: {why}"
    if isinstance(cause, FleetError):  # fleet's own rule: its message names the value
        return f"{option}: {cause}" if option and not str(cause).startswith(option) else str(cause)
    return e.format_message()


app = typer.Typer(
    name="fleet",
    cls=OneLineErrors,
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

JobOpt = Annotated[str, typer.Option("--job", "-j", help="job name", callback=job_name)]
EngineOpt = Annotated[str | None, typer.Option("--engine", help=", ".join(ENGINE_SECTIONS))]
ModelOpt = Annotated[str | None, typer.Option("--model", help="model directory (or an ORG/NAME hub id)",
                                              callback=model_dir)]
GpusOpt = Annotated[str | None, typer.Option("--gpus", help="'all' or '0,1': one pinned worker per GPU",
                                             callback=gpu_indexes)]
BrokerOpt = Annotated[str | None, typer.Option("--broker-url", help="redis:// URL (FLEET_BROKER_URL)")]
ConfigOpt = Annotated[str | None, typer.Option(
    "--config", help="dataset config (a Hub dataset's or a dataset folder's); default: the default one")]
SplitOpt = Annotated[str | None, typer.Option("--split", help="dataset split (default train)")]
RevisionOpt = Annotated[str | None, typer.Option(
    "--revision", help="Hub dataset revision: a branch, tag or commit (default main; a resumed job: its commit)")]
ColumnsOpt = Annotated[list[str] | None, typer.Option(
    "--columns", help="FIELD=COLUMN: read fleet's field from a column of another name (e.g. id=uuid); repeatable")]


def input_flags(config: str | None, split: str | None, revision: str | None,
                columns: list[str] | None) -> dict[str, Any]:
    """The dataset flags as settings (FLEET_INPUT__*): only those given."""
    given: dict[str, Any] = {k: v for k, v in (("config", config), ("split", split), ("revision", revision)) if v}
    if columns:
        pairs = [c.split("=", 1) for c in columns]
        bad = [c for c, p in zip(columns, pairs, strict=True) if len(p) != 2 or not all(x.strip() for x in p)]
        if bad:
            fail(f"--columns {bad[0]!r}: give FIELD=COLUMN, e.g. id=uuid")
        given["columns"] = {f.strip(): c.strip() for f, c in pairs}
    return given


StoreOpt = Annotated[str | None, typer.Option("--store-url", help="directory, s3://bucket/prefix or gs://bucket/prefix")]
ChunkOpt = Annotated[int | None, typer.Option("--chunk-size", help="records per chunk")]
SlotsOpt = Annotated[int | None, typer.Option("--slots", help="K chunks per worker at once")]
WorkersOpt = Annotated[int | None, typer.Option("--workers", "-w", min=1, help="CPU worker processes")]
TurnsOpt = Annotated[str | None, typer.Option(
    "--turns", help="last (default) or all: generate every assistant turn of a conversation (FLEET_TURNS)")]
DataDirOpt = Annotated[Path | None, typer.Option("--data-dir", help="local runtime directory")]


#: CLI flags that set a setting of another name or a nested one, by the flag's parameter name: its
#: path in the settings
NESTED_FLAGS: dict[str, tuple[str, ...]] = {
    "max_tokens": ("sampling", "max_tokens"),
    "port": ("monitor", "flower_port"),  # `fleet flower --port`
    "address": ("monitor", "flower_address"),
    "usd_per_gpu_hour": ("monitor", "usd_per_gpu_hour"),
    **{name: ("input", name) for name in ("config", "split", "revision", "columns")},
}


def settings_from(**flags: Any) -> Settings:
    """Settings with the CLI flags that were given on top of env and fleet.toml. A flag is a setting:
    it goes through the same validation as its environment variable, and a bad value is one line
    naming the flag, before anything starts."""
    given = {name: value for name, value in flags.items() if value is not None}
    values: dict[str, Any] = {}
    for name, value in given.items():
        *parents, leaf = NESTED_FLAGS.get(name, (name,))
        node = values
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    try:
        settings = load_settings(**values)
    except ValidationError as e:
        fail("; ".join(setting_error(err, given) for err in e.errors()))
    loaded[:] = [settings]
    return settings


def setting_error(err: Any, given: dict[str, Any]) -> str:
    """One validation error, named as the user set it: the flag, else the environment variable."""
    loc = tuple(str(part) for part in err["loc"])
    flag = next((name for name in given if NESTED_FLAGS.get(name, (name,)) == loc[: len(NESTED_FLAGS.get(
        name, (name,)))]), None)  # fmt: skip
    where = f"--{flag.replace('_', '-')} {given[flag]}" if flag else env_name(loc)
    return f"{where}: {err['msg'].removeprefix('Value error, ')}"


def env_name(loc: tuple[str, ...]) -> str:
    """The variable that set a setting: its section's name, or the flat one of before sections where
    only that one is set (FLEET_METRICS_PORT for monitor.metrics_port)."""
    name = f"FLEET_{'__'.join(loc).upper()}"
    old = next((f"FLEET_{flat.upper()}" for flat, path in LEGACY_NAMES.items() if path == loc[:2]), None)
    return old if old and name not in os.environ and old in os.environ else name


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
