"""Flower for fleet's Celery app, started from the one settings object.

Flower talks to the broker with its app's transport options. Started on its own
(`celery flower --broker=...`) it would use kombu's default visibility_timeout of one
hour, and its inspect calls would then hand every chunk running longer than that to a
second worker (docs/architecture.md, Celery facts). Building its app with `make_celery(settings)`
keeps the options identical to the workers'.
"""

from __future__ import annotations

import ipaddress
import logging

from celery import Celery

from fleet.coord.broker import make_celery
from fleet.errors import ConfigError
from fleet.redact import REDACTED, redact_url  # noqa: F401 - re-exported
from fleet.settings import Settings

log = logging.getLogger(__name__)

def is_loopback(address: str) -> bool:
    """True only for addresses no other machine can reach; '' and 0.0.0.0 mean every interface."""
    host = address.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere, treat it as exposed


def _check_basic_auth(value: str) -> None:
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise ConfigError("FLEET_FLOWER_BASIC_AUTH must be user:password, both non-empty")
    if "," in value:
        # Flower splits the option on commas into several credentials.
        raise ConfigError("FLEET_FLOWER_BASIC_AUTH must not contain ',' (Flower splits on it)")


def check_flower_settings(settings: Settings) -> None:
    """Refuse a Flower anyone on the network could drive (it can revoke tasks, stop workers)."""
    if settings.monitor.flower_basic_auth:
        _check_basic_auth(settings.monitor.flower_basic_auth)
    elif not is_loopback(settings.monitor.flower_address):
        raise ConfigError(
            f"refusing to start Flower on {settings.monitor.flower_address or 'every interface'!s} "
            "without authentication: set FLEET_FLOWER_BASIC_AUTH=user:password, or bind to "
            "127.0.0.1 and reach it through an SSH tunnel"
        )


#: Flower's tasks page columns, in order (slugs of flower.views.tasks.TASK_COLUMNS).
TASKS_COLUMNS = "name,state,worker,kwargs,received,started,runtime,retries,exception"


def flower_app(settings: Settings) -> Celery:
    """The Celery app Flower monitors: the workers' app, same broker transport options."""
    return make_celery(settings)


def flower_argv(settings: Settings) -> list[str]:
    """Arguments for `celery flower` on fleet's app, after the safety checks.

    Holds the basic-auth credential when one is set: pass it in-process (`run_flower`),
    never on a command line where `ps` shows it; log `redact_argv(...)` instead.
    """
    check_flower_settings(settings)
    argv = [
        "flower",
        f"--address={settings.monitor.flower_address}",
        f"--port={settings.monitor.flower_port}",
        # Workers restart under the same name; drop the dead entries after a while.
        "--purge_offline_workers=600",
        # The task name is the chunk ("chunk <job>/<index>", send_chunk's shadow name), the
        # worker is gpu<i>@host; kwargs carry the attempt, exception why it failed.
        f"--tasks_columns={TASKS_COLUMNS}",
    ]
    if settings.monitor.flower_basic_auth:
        argv.append(f"--basic_auth={settings.monitor.flower_basic_auth}")
    return argv


def redact_argv(argv: list[str]) -> list[str]:
    return [f"--basic_auth={REDACTED}" if a.startswith("--basic_auth=") else a for a in argv]


def run_flower(settings: Settings) -> int:
    """Run Flower in this process until it is stopped; returns Celery's exit code."""
    argv = flower_argv(settings)
    app = flower_app(settings)
    log.info(
        "Flower on http://%s:%s for broker %s (visibility_timeout %s s), auth %s",
        settings.monitor.flower_address or "0.0.0.0",
        settings.monitor.flower_port,
        redact_url(str(app.conf.broker_url)),
        app.conf.broker_transport_options["visibility_timeout"],
        "basic" if settings.monitor.flower_basic_auth else "none (loopback only)",
    )
    log.debug("flower argv: %s", redact_argv(argv))
    # `celery flower` is a plugin subcommand of Celery's CLI; app.start runs it on this app.
    code = app.start(argv)
    return int(code or 0)
