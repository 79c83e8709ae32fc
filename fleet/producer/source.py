"""Where the input comes from (docs/architecture.md, Objects): a local file or dataset folder as
is, or a remote one (s3://, gs://, hf://datasets/...) downloaded for the producer's two passes
through the scheme's own module (fleet.store.schemes). A Hub dataset is read at one commit, which
the job records (`Fetched.pinned`), so a resumed job reads the rows it started with."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from fleet.errors import ConfigError
from fleet.producer.datafiles import select
from fleet.settings.datasetinput import InputSettings
from fleet.store.schemes import Fetched, Scheme, StoreOptions, local_path, scheme_of


@contextmanager
def local_input(
    url: str, source: InputSettings | None = None, *, stored: str | None = None, max_attempts: int = 10,
    tmp_dir: Path | None = None,
) -> Iterator[Fetched]:
    """The input on local disk: a local path as is; a remote object, folder or dataset downloaded
    to a temporary folder in `tmp_dir` (removed on exit). `stored` is the input a job already
    holds: a moving revision of it (a Hub dataset's main) is read at the commit the job pinned."""
    source = source or InputSettings()
    scheme = check_input(url)
    if scheme is None:
        path = local_path(url)
        if source.revision:
            raise ConfigError(f"input {url!r}: --revision is for hf://datasets/... inputs")
        yield Fetched(path, described(url, source) if path.is_dir() else url)
        return
    if source.revision:
        url = scheme.revised(url, source.revision)
    elif stored is not None:
        url = scheme.pin(url, stored)
    with tempfile.TemporaryDirectory(prefix="fleet-input-", dir=tmp_dir) as into:
        fetched = scheme.fetch(url, Path(into), partial(select, config=source.config, split=source.split),
                               StoreOptions(max_attempts=max_attempts))
        yield Fetched(fetched.path, described(fetched.pinned, source) if fetched.path.is_dir() else fetched.pinned)


def check_input(url: str) -> Scheme | None:
    """What an input URL can be told before anything is read: a local file or folder that is
    there, or a scheme fleet reads (the `fleet run`/`enqueue`/`validate` argument's rule)."""
    scheme = scheme_of(url)
    if scheme is None:
        path = local_path(url)
        if not path.exists():
            raise ConfigError(f"input {str(path)!r} does not exist")
        if not (path.is_file() or path.is_dir()):
            raise ConfigError(f"input {str(path)!r} is not a file or a dataset folder")
    return scheme


def described(url: str, source: InputSettings) -> str:
    """A dataset input's name with the config and split read from it: the job's `input`."""
    return url + f"?config={source.config}&split={source.split}" if source.config else url + f"?split={source.split}"
