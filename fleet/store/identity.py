"""A store's identity on a shared broker: a short digest of its canonical URL.

Two stores on one Redis (two teams, or a host started with another `FLEET_STORE_URL`) must
never see each other's jobs: the broker keeps each store's chunks in a queue of its own and
its jobs under its own id (docs/architecture.md, "Stores on one broker"). The id is a pure
function of the URL, so every process of a store agrees on it without asking anyone.
"""

from __future__ import annotations

import hashlib
from urllib.parse import urlparse

from fleet.store.schemes import local_path, scheme_of

#: hex digits of the id: 48 bits, no collision among the stores one broker could serve
ID_CHARS = 12


def canonical_store_url(url: str) -> str:
    """One spelling per store: a local path (or file://) made absolute with links resolved; a
    bucket URL's scheme and bucket lowercased, its prefix without empty or trailing parts."""
    if scheme_of(url) is None:
        return str(local_path(url).resolve())
    parsed = urlparse(url)
    prefix = "/".join(part for part in parsed.path.split("/") if part)
    return f"{parsed.scheme.lower()}://{parsed.netloc.lower()}/{prefix}"


def store_id(url: str) -> str:
    """The store's id on a broker: the first ID_CHARS hex digits of its canonical URL's SHA-256."""
    return hashlib.sha256(canonical_store_url(url).encode()).hexdigest()[:ID_CHARS]
