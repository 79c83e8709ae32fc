"""Where an export goes (docs/architecture.md, Records): `-` (standard output), a local path
or a remote URL (s3://, gs://; hf://datasets/... for a Hub-ready folder, through the scheme's
module of fleet.store.schemes), and what may happen to what is already there.

Only a regular file, or a path where nothing is, is replaced, and atomically: the export is
written to a temporary file beside it and renamed over it once checked. A FIFO or a
character device (`/dev/null`, a terminal) is written through, never replaced (an operator
once replaced the machine's /dev/null with an export); a symlink is followed, so the file
behind it is replaced and the link stays a link. A directory, a block device (a disk) or a
socket is refused. Standard output, FIFOs, devices and remote URLs get the export from a spool
file once it is checked, so a wrong export reaches none of them. Every way a target can fail
is one TargetUnwritable naming it, and no temporary file is left behind.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from fleet.errors import StoreError, TargetUnwritable
from fleet.store.schemes import Scheme, StoreOptions, scheme_of

T = TypeVar("T")
#: how `--out` names standard output
STDOUT = "-"
_COPY_BYTES = 1 << 20


class Spot:
    """The local file a format writes for one target, and what to say when writing it fails."""

    def __init__(self, out: str, path: Path, where: str):
        self.out, self.path, self.where = out, path, where

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` with an OSError (a full disk, a file too large) turned into one line
        naming the target: only the writer's calls go through here, never the store's reads."""
        return attempt(self.out, self.where, fn, *args)


def attempt(out: str, doing: str, fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    except OSError as e:
        raise unwritable(out, e, doing) from e


def unwritable(out: str, e: OSError, doing: str) -> TargetUnwritable:
    why = e.strerror or str(e)
    if isinstance(e, NotADirectoryError | FileExistsError):
        why = "a part of its path is a file, not a directory"
    return TargetUnwritable(f"cannot write the export to {out}: {why} ({doing})")


def refused(out: str, why: str) -> TargetUnwritable:
    return TargetUnwritable(f"cannot write the export to {out}: {why}")


def unique_temp(out: Path) -> Path:
    """A temp name beside `out` (same filesystem, so the rename is atomic) that no
    concurrent export of the same path shares."""
    return out.with_name(f".{out.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp")


@contextmanager
def target(out: str | Path, max_attempts: int = 10) -> Iterator[Spot]:
    """A Spot to write; its file becomes `out` only when the block succeeds (see the module)."""
    text = str(out)
    if text == STDOUT:
        with _spool("standard output") as spot:
            yield spot
            attempt("standard output", "writing to it", _copy_to_stdout, spot.path)
        return
    scheme = scheme_of(text)
    if scheme is not None:
        options = StoreOptions(max_attempts=max_attempts)
        scheme.check_target(text, options)  # a missing bucket is refused before any row is read
        with _spool(text) as spot:
            yield spot
            _send(scheme, spot.path, text, options)
        return
    if text.endswith(("/", os.sep)):  # Path would drop the slash and write a file of that name
        raise refused(text, "it names a directory (it ends in /); give a file path in it")
    local = Path(text.removeprefix("file://")).expanduser()
    if _write_through(local, text):
        with _spool(text) as spot:
            yield spot
            attempt(text, "writing it through", _copy_into, spot.path, local)
        return
    final = local.resolve() if local.is_symlink() else local
    with _beside(final, text) as spot:
        yield spot
        attempt(text, "renaming its temporary file over it", spot.path.replace, final)


def _write_through(local: Path, out: str) -> bool:
    """True for a FIFO or a character device; False for a regular file or nothing; refuses the rest."""
    try:
        mode = local.stat().st_mode  # follows symlinks: the kind of what the link names
    except FileNotFoundError:
        return False  # a new path, or a link to one
    except OSError as e:  # a file as parent, a symlink loop, a directory we may not search
        raise unwritable(out, e, "looking it up") from e
    if stat.S_ISDIR(mode):
        raise refused(out, "it is a directory; give a file path in it")
    if stat.S_ISBLK(mode):
        raise refused(out, "it is a block device (a disk); fleet does not write exports onto disks")
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        raise refused(out, "it is a socket or another special file; give a file, a FIFO, a device or -")
    if not os.access(local, os.W_OK):
        raise refused(out, "it is read-only")
    return not stat.S_ISREG(mode)


@contextmanager
def _beside(final: Path, out: str) -> Iterator[Spot]:
    """A temporary file beside `final`, created now so an unwritable directory fails before
    any row is read; removed whatever happens."""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise unwritable(out, e, f"creating the directory {final.parent}") from e
    tmp = unique_temp(final)
    try:
        tmp.touch(exist_ok=False)
    except OSError as e:
        raise unwritable(out, e, f"creating a temporary file in {final.parent}") from e
    try:
        yield Spot(out, tmp, f"writing its temporary file in {final.parent}")
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def _spool(out: str) -> Iterator[Spot]:
    """A spool file in the temp directory ($TMPDIR) for targets that cannot be renamed over."""
    where = tempfile.gettempdir()
    try:
        fd, name = tempfile.mkstemp(prefix="fleet-export-")
    except OSError as e:
        raise unwritable(out, e, f"creating a spool file in {where}") from e
    os.close(fd)
    try:
        yield Spot(out, Path(name), f"writing the spool file in {where}")
    finally:
        Path(name).unlink(missing_ok=True)


def _copy_into(src: Path, dst: Path) -> None:
    """Write through: open `dst` as it is (a FIFO waits here for its reader) and copy."""
    with src.open("rb") as f, dst.open("wb") as g:
        shutil.copyfileobj(f, g, _COPY_BYTES)


def _copy_to_stdout(src: Path) -> None:
    # Our own writer on fd 1, closed here: a broken pipe is raised once, inside `call`,
    # rather than again by sys.stdout's buffer at exit.
    with src.open("rb") as f, open(1, "wb", closefd=False) as g:  # noqa: PTH123 - a file descriptor
        shutil.copyfileobj(f, g, _COPY_BYTES)


def _send(scheme: Scheme, src: Path, url: str, options: StoreOptions) -> None:
    try:
        scheme.send(src, url, options)
    except StoreError as e:
        raise refused(url, f"the upload failed ({e})") from e


@contextmanager
def folder_target(out: str | Path, max_attempts: int = 10) -> Iterator[Spot]:
    """A folder to write (a Hub-ready dataset): a local DIR is replaced whole once the block
    succeeds (written beside it, then swapped in); a remote one is uploaded from a spool folder."""
    text = str(out)
    scheme = scheme_of(text)
    if scheme is not None:
        options = StoreOptions(max_attempts=max_attempts)
        scheme.check_target(text, options)
        with tempfile.TemporaryDirectory(prefix="fleet-export-") as tmp:
            yield Spot(text, Path(tmp), f"writing the spool folder {tmp}")
            _send(scheme, Path(tmp), text, options)
        return
    final = Path(text.removeprefix("file://")).expanduser()
    if final.exists() and not final.is_dir():
        raise refused(text, "it is a file; --format hf writes a folder")
    attempt(text, f"creating the directory {final.parent}", final.parent.mkdir, 0o777, True, True)
    tmp = unique_temp(final)
    try:
        attempt(text, f"creating a temporary folder in {final.parent}", tmp.mkdir)
        yield Spot(text, tmp, f"writing its temporary folder in {final.parent}")
        old = unique_temp(final)
        if final.exists():
            attempt(text, "moving the previous export aside", final.replace, old)
        attempt(text, "renaming its temporary folder into place", tmp.replace, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
