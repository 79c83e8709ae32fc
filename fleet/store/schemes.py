"""The one object layer (docs/architecture.md, Objects): a URL's scheme picks the module that turns
it into what the store, an input and an export need. A further scheme (Azure, say) is one module
with a `Scheme` subclass named SCHEME, and one line in SCHEMES.

A bucket scheme (s3://, gs://) is built on its store: an input object is a download from the store
at the bucket's root, an export an upload to it, so each cloud's client is built in one module.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlparse

from fleet.errors import ConfigError
from fleet.store.base import Store

#: scheme -> module whose SCHEME says everything about it; imported when a URL names it
SCHEMES: dict[str, str] = {
    "s3": "fleet.store.s3",
    "gs": "fleet.store.gcs",
    "hf": "fleet.store.hub",
}


@dataclass(frozen=True)
class StoreOptions:
    """How a store's client retries and when a put goes in parts (settings.store_client.max_attempts, ...)."""

    max_attempts: int = 10
    multipart_threshold_mb: int = 64


class Listing(ABC):
    """The files of a remote folder (a dataset repository at one revision, a prefix), for an
    input to choose what it reads before anything large is downloaded."""

    files: list[str]

    @abstractmethod
    def text(self, name: str) -> str:
        """A small file's text (a dataset card, a `state.json`)."""


#: picks, from a listing, the files an input reads (fleet.producer.datafiles), in order
Select = Callable[[Listing], list[str]]


@dataclass(frozen=True)
class Fetched:
    """A remote input on local disk: a file, or a folder with the chosen files at their paths;
    `pinned` names exactly what was read (a Hub repository at its commit)."""

    path: Path
    pinned: str


class Scheme(ABC):
    """What fleet does with URLs of one scheme. Each capability a scheme lacks says so in one line."""

    name: ClassVar[str]
    #: what a URL of this scheme looks like, for messages
    form: ClassVar[str]
    #: what to check when its service cannot be reached: pre-flight and a service lost mid-run say it
    hint: ClassVar[str]
    #: the export format a target of this scheme gets where none is asked (None: by the path's suffix)
    default_format: ClassVar[str | None] = None

    def lost_errors(self) -> tuple[type[BaseException], ...]:
        """What its client raises, escaping a command, when the service is not there (fleet.tools.preflight
        says so in one line with `hint`); imported only once a URL of the scheme was used."""
        return ()

    def store(self, url: str, options: StoreOptions) -> Store:
        raise ConfigError(f"{url!r}: a {self.name}:// URL cannot hold fleet's store; use a directory, "
                          "s3://bucket/prefix or gs://bucket/prefix")

    @abstractmethod
    def fetch(self, url: str, into: Path, select: Select, options: StoreOptions) -> Fetched:
        """Download the input `url` names into the empty folder `into`: one object, or the files
        `select` picks from a folder (a URL ending in /, a dataset repository)."""

    def revised(self, url: str, revision: str) -> str:
        """`url` at `revision` (`--revision`); only a scheme with revisions has it."""
        raise ConfigError(f"{url!r}: --revision is for hf://datasets/... inputs; {self.name}:// objects have none")

    def pin(self, url: str, stored: str) -> str:
        """The URL a resumed job reads: `url` as given, unless it names a moving revision of the
        input `stored` (the job's manifest) pinned; bucket objects have no revision to pin."""
        return url

    @abstractmethod
    def check_target(self, url: str, options: StoreOptions) -> None:
        """Refuse an export target before any row is read (a missing bucket), as TargetUnwritable."""

    @abstractmethod
    def send(self, src: Path, url: str, options: StoreOptions) -> None:
        """Upload the local file or folder `src` to `url`, whole."""


class BucketScheme(Scheme):
    """s3://bucket/key and gs://bucket/key: objects in a bucket, through the scheme's store."""

    @abstractmethod
    def open(self, url: str, options: StoreOptions) -> Store:
        """The scheme's store at `url` (a bucket and a prefix)."""

    def store(self, url: str, options: StoreOptions) -> Store:
        if not urlparse(url).netloc:
            raise ConfigError(f"store URL {url!r} names no bucket ({self.name}://bucket/prefix)")
        return self.open(url, options)

    def split(self, url: str, what: str, folder: bool = False,
              options: StoreOptions | None = None) -> tuple[Store, str]:
        """The store at the bucket's root and the key `url` names in it."""
        parsed = urlparse(url)
        key = parsed.path.lstrip("/")
        if not parsed.netloc or (not key and not folder) or (key.endswith("/") and not folder):
            raise ConfigError(f"{what} {url!r} names no object ({self.form})")
        return self.open(f"{self.name}://{parsed.netloc}", options or StoreOptions()), key

    def fetch(self, url: str, into: Path, select: Select, options: StoreOptions) -> Fetched:
        from fleet.errors import ObjectMissing

        folder = url.endswith("/")
        store, key = self.split(url, "input", folder, options)
        if not folder:
            dest = into / os.path.basename(key)  # the key's extension picks the input's format
            try:
                store.download(key, dest)
            except ObjectMissing as e:
                raise ConfigError(f"input {url!r} does not exist") from e
            return Fetched(dest, url)
        listing = _StoreListing(store, key)
        if not listing.files:
            raise ConfigError(f"input {url!r}: no objects under this prefix")
        for name in select(listing):
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            store.download(key + name, into / name)
        return Fetched(into, url)

    def send(self, src: Path, url: str, options: StoreOptions) -> None:
        store, key = self.split(url, "export target", src.is_dir(), options)
        if src.is_file():
            store.upload(src, key)
            return
        base = key.strip("/")
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            rel = path.relative_to(src).as_posix()
            store.upload(path, f"{base}/{rel}" if base else rel)

    def check_target(self, url: str, options: StoreOptions) -> None:
        from fleet.errors import StoreError, TargetUnwritable

        store, _ = self.split(url, "export target", True, options)
        try:
            found = self.bucket_exists(store)
        except StoreError as e:
            raise TargetUnwritable(f"cannot write the export to {url}: cannot reach {self.name}:// ({e})") from e
        if found is False:
            raise TargetUnwritable(f"cannot write the export to {url}: the bucket {urlparse(url).netloc!r} "
                                   "does not exist")

    @abstractmethod
    def ping(self, store: Store, timeout_s: float) -> None:
        """Reach the store's endpoint once, within about `timeout_s`; StoreUnreachable saying why."""

    @abstractmethod
    def bucket_exists(self, store: Store) -> bool | None:
        """False for a bucket that is not there; None when the answer is not ours to have (a writer
        without the right to look): the upload decides. StoreError when the endpoint cannot be reached."""


class _StoreListing(Listing):
    def __init__(self, store: Store, prefix: str):
        self.store, self.prefix = store, prefix
        self.files = [k[len(prefix):] for k in store.list(prefix)]

    def text(self, name: str) -> str:
        return self.store.get(self.prefix + name).decode("utf-8", errors="replace")


def scheme_of(url: str) -> Scheme | None:
    """The scheme `url` names, or None for a local path (a plain path or file://)."""
    if "://" not in url or url.startswith("file://"):
        return None
    name = url.split("://", 1)[0]
    if name not in SCHEMES:
        known = ", ".join(f"{s}://" for s in SCHEMES)
        raise ConfigError(f"{url!r}: unknown scheme {name}://; use a local path, file://..., or one of {known}")
    return importlib.import_module(SCHEMES[name]).SCHEME


def loaded_schemes() -> list[Scheme]:
    """The schemes whose module this process imported: those a URL it opened named."""
    import sys

    return [sys.modules[module].SCHEME for module in SCHEMES.values() if module in sys.modules]


def default_format(out: str) -> str | None:
    """The export format the target `out` asks for by its scheme (a Hub dataset: hf), else None."""
    scheme = scheme_of(out)
    return scheme.default_format if scheme is not None else None


def local_path(url: str) -> Path:
    """The path a local URL (a path or file://...) names."""
    if url.startswith("file://"):
        parsed = urlparse(url)
        from urllib.parse import unquote

        return Path(unquote(parsed.netloc + parsed.path))
    return Path(url).expanduser()
