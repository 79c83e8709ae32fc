"""Credentials never reach logs, status or errors: URLs are printed through redact_url."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "***"
_SECRET_QUERY_KEYS = ("password", "secret", "token", "key")


def redact_url(url: str) -> str:
    """The URL with its password (userinfo or query) replaced, safe to print and log."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:{REDACTED}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        redacted = [(k, REDACTED if any(s in k.lower() for s in _SECRET_QUERY_KEYS) else v) for k, v in pairs]
        query = urlencode(redacted, safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
