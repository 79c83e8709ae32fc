"""hf:// (docs/architecture.md, Objects): Hugging Face Hub dataset repositories, through
huggingface_hub's own API (HF_ENDPOINT and HF_TOKEN as it reads them).

In: `hf://datasets/ORG/NAME[@REVISION]` is resolved to a commit first (`dataset_info`: a branch or
tag moves, a commit does not), the files of the wanted config and split are chosen from that
commit's listing, and only they are downloaded, at that commit; the job records the commit, and a
resume of it that names no revision reads the same commit again (`pin`).
Out: a Hub-ready export folder goes up with `upload_folder`, its data files replacing those of
an earlier export in the same commit (`delete_patterns`), so a re-export with other shards never
leaves a shard twice; the commit names the head it was planned on (`parent_commit`), so a write
in between is refused, never merged. A re-run after a crash resumes: what the Hub holds already
is not sent again (an LFS object it has; with hf_xet, chunks it has, and each of the upload's
commits that landed), and the export's shards are the same bytes each time.
Retries: huggingface_hub retries some of its requests and not others (a repository's info, a
commit), each with its own count; every call here goes through `attempted`, which tries a Hub that
is busy, limiting or unreachable again, up to settings.store_client.max_attempts tries in all, as
S3 and GCS do.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from fleet.errors import ConfigError, StoreError, TargetUnwritable
from fleet.store.schemes import Fetched, Listing, Scheme, Select, StoreOptions

log = logging.getLogger(__name__)
PREFIX = "hf://datasets/"
#: HTTP answers that are the Hub's moment, not the request's fault: worth another try
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: seconds before the second try, doubling to BACKOFF_MAX_S
BACKOFF_S, BACKOFF_MAX_S = 0.5, 8.0
T = TypeVar("T")


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError as e:
        raise ConfigError("hf:// needs huggingface_hub: pip install 'fleet[hub]'") from e
    return huggingface_hub


def parse(url: str) -> tuple[str, str | None]:
    """(repo id, revision or None) of hf://datasets/ORG/NAME[@REVISION]; a query after it is ours."""
    if not url.startswith(PREFIX):
        raise ConfigError(f"{url!r}: fleet reads and writes Hub datasets only: hf://datasets/ORG/NAME[@REVISION]")
    name = url[len(PREFIX):].split("?", 1)[0].rstrip("/")
    repo, _, revision = name.partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ConfigError(f"{url!r} names no dataset repository (hf://datasets/ORG/NAME[@REVISION])")
    return repo, revision or None


def client_errors() -> tuple[type[Exception], ...]:
    """What huggingface_hub's calls raise for a Hub that refuses or cannot be reached: its own
    HTTP errors, its HTTP library's (httpx2 or httpx, by version), OSError, and ValueError or
    RuntimeError for an answer it cannot use (an upload that failed, a card the Hub rejects)."""
    hub = _hub()
    http = [lib.HTTPError for name in ("httpx2", "httpx") if (lib := sys.modules.get(name)) is not None]
    return (OSError, ValueError, RuntimeError, hub.errors.HfHubHTTPError, *http)


def transient(e: Exception) -> bool:
    """A failure another try may not meet: a busy, limiting or failing Hub (its HTTP status), or
    the connection (the HTTP library's transport errors, a timeout). A refusal (401, 404, 412) is not."""
    status = getattr(getattr(e, "response", None), "status_code", None)
    if status is not None:
        return status in TRANSIENT_STATUS
    transport = [lib.TransportError for name in ("httpx2", "httpx") if (lib := sys.modules.get(name)) is not None]
    return isinstance(e, ConnectionError | TimeoutError | tuple(transport))


def attempted(options: StoreOptions, what: str, call: Callable[[], T]) -> T:
    """`call`, tried up to `options.max_attempts` times while it fails transiently, backing off."""
    for attempt in range(1, max(1, options.max_attempts) + 1):
        try:
            return call()
        except client_errors() as e:
            if attempt >= options.max_attempts or not transient(e):
                raise
            wait_s = min(BACKOFF_MAX_S, BACKOFF_S * 2 ** (attempt - 1))
            log.warning("the Hub failed to %s (%s: %s): try %d of %d in %.1fs", what, type(e).__name__, _line(e),
                        attempt + 1, options.max_attempts, wait_s)
            time.sleep(wait_s)
    raise AssertionError("unreachable: the last attempt returns or raises")


def api() -> Any:
    endpoint = os.environ.get("HF_ENDPOINT")
    return _hub().HfApi(endpoint=endpoint.rstrip("/") if endpoint else None)


def _refused(url: str, e: Exception) -> Exception:
    """A Hub answer as fleet's error: what the user named wrong is a ConfigError, the rest a StoreError."""
    errors = _hub().errors
    if isinstance(e, errors.RevisionNotFoundError):
        return ConfigError(f"input {url!r}: the dataset has no such revision")
    if isinstance(e, errors.RepositoryNotFoundError):
        return ConfigError(f"input {url!r}: no such dataset on the Hub (or it is private: set HF_TOKEN)")
    if isinstance(e, errors.EntryNotFoundError):
        return ConfigError(f"input {url!r}: a file of the dataset is missing ({e})")
    return StoreError(f"input {url!r}: the Hub failed: {type(e).__name__}: {_line(e)}: {SCHEME.hint}")


class HubListing(Listing):
    def __init__(self, url: str, repo: str, sha: str, files: list[str], into: Path, options: StoreOptions):
        self.url, self.repo, self.sha, self.files, self.into = url, repo, sha, files, into
        self.options = options

    def download(self, name: str) -> Path:
        try:
            return Path(attempted(self.options, f"download {name}", lambda: _hub().hf_hub_download(
                self.repo, name, repo_type="dataset", revision=self.sha, local_dir=self.into,
                endpoint=api().endpoint)))
        except client_errors() as e:
            raise _refused(self.url, e) from e

    def text(self, name: str) -> str:
        return self.download(name).read_text(encoding="utf-8", errors="replace")


class HubScheme(Scheme):
    name = "hf"
    form = "hf://datasets/ORG/NAME[@REVISION]"
    hint = "check HF_ENDPOINT (unset: huggingface.co), HF_TOKEN for a private or written dataset, and the network"
    default_format = "hf"  # a Hub dataset takes a Hub-ready folder

    def fetch(self, url: str, into: Path, select: Select, options: StoreOptions) -> Fetched:
        repo, revision = parse(url)
        try:
            info = attempted(options, f"read {repo}", lambda: api().dataset_info(repo, revision=revision or "main"))
        except client_errors() as e:
            raise _refused(url, e) from e
        listing = HubListing(url, repo, info.sha, [s.rfilename for s in info.siblings or []], into, options)
        for name in select(listing):
            listing.download(name)
        return Fetched(into, f"{PREFIX}{repo}@{info.sha}")

    def revised(self, url: str, revision: str) -> str:
        repo, given = parse(url)
        if given is not None and given != revision:
            raise ConfigError(f"{url!r} names revision {given!r} and --revision {revision!r}: give one")
        return f"{PREFIX}{repo}@{revision}"

    def pin(self, url: str, stored: str) -> str:
        repo, revision = parse(url)
        if revision is not None or not stored.startswith(PREFIX):
            return url
        held, commit = parse(stored)
        return f"{PREFIX}{repo}@{commit}" if held == repo and commit else url

    def check_target(self, url: str, options: StoreOptions) -> None:
        repo, revision = parse(url)
        if revision is not None:
            raise TargetUnwritable(f"cannot write the export to {url}: it goes to the repository's main branch; "
                                   "leave out @REVISION")
        try:
            token = _hub().get_token()  # HF_TOKEN, the saved login, or an OIDC exchange
        except client_errors() as e:
            raise TargetUnwritable(f"cannot write the export to {url}: no Hugging Face token ({_line(e)})") from e
        if token is None:
            raise TargetUnwritable(f"cannot write the export to {url}: no Hugging Face token with the right to write "
                                   "there; set HF_TOKEN or run `hf auth login`")

    def send(self, src: Path, url: str, options: StoreOptions) -> None:
        repo, _ = parse(url)
        client = api()
        if not src.is_dir():
            raise TargetUnwritable(f"cannot write the export to {url}: a Hub dataset takes a folder (--format hf)")

        def upload() -> None:
            client.create_repo(repo, repo_type="dataset", exist_ok=True)
            head = client.dataset_info(repo).sha  # read again on each try: a landed commit is the new head
            # upload_folder, not upload_large_folder: it has delete_patterns and parent_commit in every
            # huggingface_hub fleet supports (>= 0.30); upload_large_folder has neither, and 2.x dropped
            # it. A re-run resumes: blobs the Hub holds (LFS objects, Xet chunks) are not sent again,
            # nor unchanged files; 2.x with hf_xet commits a large folder in parts, a landed part skipped.
            client.upload_folder(
                repo_id=repo, folder_path=str(src), repo_type="dataset", delete_patterns=["data/*"],
                parent_commit=head, commit_message=f"fleet export: {_count(src)} data file(s) and the dataset card")

        try:
            attempted(options, f"upload to {repo}", upload)
        except client_errors() as e:
            raise TargetUnwritable(f"cannot write the export to {url}: {type(e).__name__}: {_line(e)}") from e


def _count(src: Path) -> int:
    return sum(1 for p in (src / "data").iterdir() if p.is_file()) if (src / "data").is_dir() else 0


def _line(e: Exception) -> str:
    return next((x for x in str(e).splitlines() if x.strip()), "")


SCHEME = HubScheme()
