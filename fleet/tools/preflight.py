"""Reach the broker and the store before a command does anything, and say in one line
what failed when a service is down, mid-run as well as up front.

`ping_broker` / `ping_store` raise BrokerUnreachable / StoreUnreachable with the redacted
URL, the cause and what to check; `unreachable` turns a connection error that escaped a
command (the broker lost mid-run) into the same kind of line. The CLI calls both; the core
modules stay free of it.
"""

from __future__ import annotations

import redis
from kombu.exceptions import OperationalError

from fleet.errors import BrokerUnreachable, ConfigError, ServiceUnreachable, StoreUnreachable
from fleet.redact import redact_url
from fleet.settings import Settings
from fleet.store import Store
from fleet.store.schemes import BucketScheme, loaded_schemes, scheme_of

#: A down service answers a connect at once (refused) or never; either way a few seconds tell.
PING_TIMEOUT_S = 5
BROKER_HINT = "check FLEET_BROKER_URL and that redis-server runs there and is reachable from this host"
#: Errors that mean "the broker is not there", as they escape from redis-py and kombu.
BROKER_ERRORS = (redis.ConnectionError, redis.TimeoutError, OperationalError)


def connection_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean "a service is not there": the broker's, and each object store's this process
    used (its scheme's `lost_errors`: botocore's for s3://, google's for gs://)."""
    return BROKER_ERRORS + tuple(e for scheme in loaded_schemes() for e in scheme.lost_errors())


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def broker_unreachable(url: str, exc: BaseException) -> BrokerUnreachable:
    if isinstance(exc, redis.AuthenticationError) or (
        isinstance(exc, redis.ResponseError) and "NOAUTH" in str(exc).upper()
    ):
        return BrokerUnreachable(
            f"broker {redact_url(url)} refused the login ({_cause(exc)}): check the password in FLEET_BROKER_URL"
        )
    return BrokerUnreachable(f"cannot reach the broker at {redact_url(url)} ({_cause(exc)}): {BROKER_HINT}")


def ping_broker(settings: Settings) -> None:
    """One PING without retries: raises BrokerUnreachable saying why."""
    if not settings.broker_url:
        raise ConfigError("no broker configured: set FLEET_BROKER_URL (redis://host:port/db)")
    client = redis.Redis.from_url(
        settings.broker_url, socket_connect_timeout=PING_TIMEOUT_S, socket_timeout=PING_TIMEOUT_S
    )
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as e:
        raise broker_unreachable(settings.broker_url, e) from None
    finally:
        client.close()


def ping_store(store: Store) -> None:
    """For a bucket store (s3://, gs://), one quick lookup of its bucket without the store's own
    minutes of retries (fleet.store.schemes); a local directory's errors are already one clear line."""
    scheme = scheme_of(store.url)
    if isinstance(scheme, BucketScheme):
        scheme.ping(store, PING_TIMEOUT_S)


def store_scheme(settings: Settings) -> BucketScheme | None:
    """The object store the settings name (None for a local directory or a URL that names none)."""
    try:
        scheme = scheme_of(settings.resolved_store_url)
    except ConfigError:
        return None
    return scheme if isinstance(scheme, BucketScheme) else None


def unreachable(exc: BaseException, settings: Settings | None) -> ServiceUnreachable:
    """A connection error that escaped a command, as the one line a person needs."""
    for scheme in [*loaded_schemes(), *([store_scheme(settings)] if settings else [])]:
        if scheme is not None and isinstance(exc, scheme.lost_errors()):
            url = redact_url(settings.resolved_store_url) if settings else "the store"
            return StoreUnreachable(f"lost the store {url} ({_cause(exc)}): {scheme.hint}")
    url = settings.broker_url if settings and settings.broker_url else ""
    err = broker_unreachable(url, exc)
    return BrokerUnreachable(str(err).replace("cannot reach", "lost", 1)) if url else err
