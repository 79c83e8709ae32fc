"""`fleet export --out` (docs/architecture.md, Records): `-` pipes the export, a FIFO, a device
or a symlink is still what it was afterwards, and a target that cannot be written is one
line naming it, exit 3, with no temporary file left behind. Every test runs the real CLI."""

from __future__ import annotations

import ctypes
import os
import resource
import stat
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet.store.layout import manifest_key
from fleet.store.local import LocalStore
from fleet.store.manifest import load_manifest
from tests.conftest import fleet_cmd
from tests.test_export import JOB, build_job

RECORDS = 30  # about 9 kB of JSONL: past the file size limit of the "file too large" case
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, PR_CAPBSET_DROP = 1, 2, 24


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    store = LocalStore(tmp_path / "store")
    build_job(store, RECORDS, {2: 2}, done=list(range(10)))
    return store


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    """The temp directory of the export process: where spool files would be left."""
    path = tmp_path / "spool"
    path.mkdir()
    return path


def export(store: LocalStore, spool: Path, out: str, preexec: Callable[[], None] | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """`fleet export` as its own process, stdout and stderr through pipes. The hand-made job's manifest
    records no sampling, so its rows cannot be audited: `--allow-defects` accepts them (these tests are
    about the target; the audit's exit codes are tests/test_audit_store.py's)."""
    full_env = {**os.environ, **(env or {}), "TMPDIR": str(spool), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(fleet_cmd("export", "--job", JOB, "--out", out, "--store-url", str(store.root),
                                    "--allow-defects"),
                          env=full_env, capture_output=True, timeout=120, preexec_fn=preexec)


def reference(store: LocalStore, spool: Path, tmp_path: Path) -> bytes:
    """The export as a regular file gets it."""
    out = tmp_path / "reference.jsonl"
    assert export(store, spool, str(out)).returncode == 0
    return out.read_bytes()


def as_a_user() -> None:
    """Root without the capabilities that skip file permissions (before exec, so the export
    process never has them): a read-only directory is then read-only to it, as to a user."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def char_device(tmp_path: Path, name: str, minor: int) -> Path:
    """A character device of the memory driver (3: null, 7: full) of our own, so a broken
    export could never replace the machine's; the machine's where we may not make nodes."""
    if os.geteuid() != 0:
        return Path("/dev") / name
    path = tmp_path / name
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    return path


def identity(path: Path) -> tuple[int, int, int, int]:
    st = path.lstat()
    return stat.S_IFMT(st.st_mode), st.st_ino, st.st_rdev, st.st_size if stat.S_ISLNK(st.st_mode) else 0


def assert_one_error_line(res: subprocess.CompletedProcess[bytes], names: str) -> str:
    err = res.stderr.decode()
    assert res.returncode == 3, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and names in errors[0], err
    assert res.stdout == b""
    return errors[0]


@pytest.mark.slow
def test_dash_pipes_exactly_the_export(store, spool, tmp_path):
    # Given a finished job, and its export as a file
    expected = reference(store, spool, tmp_path)
    # When exported to `-` with standard output a pipe
    res = export(store, spool, "-")
    # Then the pipe holds exactly the export, and stderr says where it went
    assert res.returncode == 0, res.stderr.decode()
    assert res.stdout == expected and expected.count(b"\n") == RECORDS + 1
    assert "wrote 31 records to standard output" in res.stderr.decode()
    assert list(spool.iterdir()) == []


@pytest.mark.slow
def test_an_export_that_fails_its_check_puts_nothing_on_the_pipe(store, spool):
    # Given results that hold one sample fewer than the manifest says (found only at the end)
    manifest = load_manifest(store, JOB)
    store.put(manifest_key(JOB), manifest.model_copy(update={"samples": manifest.samples + 1}).to_bytes())
    # When exported to a pipe
    res = export(store, spool, "-")
    # Then the export is refused and nothing of it reached standard output, no spool file remains
    assert res.returncode == 2 and "31 samples, the manifest says 32" in res.stderr.decode()
    assert res.stdout == b"" and list(spool.iterdir()) == []


@pytest.mark.slow
def test_dev_stdout_pipes_the_export_too(store, spool, tmp_path):
    # /dev/stdout is a symlink to a pipe here: written through, never renamed over
    expected = reference(store, spool, tmp_path)
    res = export(store, spool, "/dev/stdout")
    assert res.returncode == 0, res.stderr.decode()
    assert res.stdout == expected


@pytest.mark.slow
def test_a_fifo_is_written_through_to_its_reader(store, spool, tmp_path):
    # Given a FIFO at --out, read by a thread as the export runs
    expected = reference(store, spool, tmp_path)
    fifo = tmp_path / "export.fifo"
    os.mkfifo(fifo)
    before = identity(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)  # blocks if never written
    reader.start()
    # When the export is written to it
    res = export(store, spool, str(fifo))
    reader.join(timeout=60)
    # Then the reader got the export, and the FIFO is still the same FIFO
    assert res.returncode == 0, res.stderr.decode()
    assert not reader.is_alive(), "the FIFO's reader never saw a writer"
    assert got == [expected]
    assert identity(fifo) == before and stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.slow
def test_a_character_device_is_written_through(store, spool, tmp_path):
    # Given a null device at --out
    null = char_device(tmp_path, "null", 3)
    before = identity(null)
    # When the export is written to it
    res = export(store, spool, str(null))
    # Then it took the export and is still the device it was, and no temp or spool file remains
    assert res.returncode == 0, res.stderr.decode()
    assert identity(null) == before and stat.S_ISCHR(null.stat().st_mode)
    assert list(spool.iterdir()) == [] and sorted(p.name for p in null.parent.glob(".null*")) == []


@pytest.mark.slow
def test_a_symlink_stays_a_link_and_the_file_it_names_gets_the_export(store, spool, tmp_path):
    # Given --out a symlink to an old file in another directory, and a dangling one
    expected = reference(store, spool, tmp_path)
    (tmp_path / "data").mkdir()
    real = tmp_path / "data" / "real.jsonl"
    real.write_text("stale\n")
    link, dangling = tmp_path / "link.jsonl", tmp_path / "dangling.jsonl"
    link.symlink_to(real)
    dangling.symlink_to(tmp_path / "data" / "new.jsonl")
    # When exported through each link
    for out in (link, dangling):
        res = export(store, spool, str(out))
        assert res.returncode == 0, res.stderr.decode()
    # Then the links are still links to the same names, and the files they name hold the export
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert dangling.is_symlink() and os.readlink(dangling) == str(tmp_path / "data" / "new.jsonl")
    assert real.read_bytes() == expected and (tmp_path / "data" / "new.jsonl").read_bytes() == expected
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["new.jsonl", "real.jsonl"]


@pytest.mark.slow
def test_a_directory_is_refused(store, spool, tmp_path):
    target = tmp_path / "exports"
    target.mkdir()
    line = assert_one_error_line(export(store, spool, str(target)), str(target))
    assert "it is a directory" in line
    # and so is a path ending in a slash, where no directory is yet
    line = assert_one_error_line(export(store, spool, f"{tmp_path}/new/"), f"{tmp_path}/new/")
    assert "it names a directory (it ends in /)" in line
    assert list(target.iterdir()) == [] and list(spool.iterdir()) == []
    assert not (tmp_path / "new").exists()


@pytest.mark.slow
def test_a_file_as_parent_is_refused(store, spool, tmp_path):
    parent = tmp_path / "notes.txt"
    parent.write_text("a file, not a directory\n")
    for out in (parent / "out.jsonl", parent / "sub" / "out.jsonl"):
        line = assert_one_error_line(export(store, spool, str(out)), str(out))
        assert "a part of its path is a file, not a directory" in line
    assert parent.read_text() == "a file, not a directory\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "spool", "store"]


@pytest.mark.slow
def test_a_read_only_directory_is_refused_and_left_empty(store, spool, tmp_path):
    # Given a directory the export process may not write (root drops its override first)
    ro = tmp_path / "ro"
    ro.mkdir()
    old = ro / "out.jsonl"
    ro.chmod(0o555)
    try:
        # When exported into it
        res = export(store, spool, str(old), preexec=as_a_user)
        # Then one line names the path and why, and the directory holds nothing new
        line = assert_one_error_line(res, str(old))
        assert "Permission denied" in line and f"creating a temporary file in {ro}" in line
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


@pytest.mark.slow
def test_a_full_device_fails_with_one_line_and_no_spool_left(store, spool, tmp_path):
    # Given a device that is always full (ENOSPC), at --out
    full = char_device(tmp_path, "full", 7)
    before = identity(full)
    # When the export is written through to it
    res = export(store, spool, str(full))
    # Then one line says the disk is full, the device is still the device, and no spool remains
    line = assert_one_error_line(res, str(full))
    assert "No space left on device (writing it through)" in line
    assert identity(full) == before and list(spool.iterdir()) == []


@pytest.mark.slow
def test_a_file_too_large_for_the_disk_leaves_the_old_file_and_no_temp(store, spool, tmp_path):
    # Given an old export, and an export process that may write files of 4 kB at most
    # (RLIMIT_FSIZE: Python ignores SIGXFSZ, so writing past it fails as a full disk does)
    old = tmp_path / "out" / "result.jsonl"
    old.parent.mkdir()
    old.write_text("old\n")

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    # When the 9 kB export is written
    res = export(store, spool, str(old), preexec=small_files)
    # Then one line names the target, the old file is untouched, and no temporary file remains
    line = assert_one_error_line(res, str(old))
    assert "File too large" in line and "writing its temporary file" in line
    assert old.read_text() == "old\n" and [p.name for p in old.parent.iterdir()] == ["result.jsonl"]


@pytest.mark.slow
def test_a_missing_bucket_is_refused_before_the_export(store, spool, s3_env):
    out = "s3://no-such-bucket-fleet-export/out/result.jsonl"
    line = assert_one_error_line(export(store, spool, out, env=s3_env), out)
    assert "the bucket 'no-such-bucket-fleet-export' does not exist" in line
    assert list(spool.iterdir()) == []
