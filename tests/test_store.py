"""The store (docs/architecture.md, Store layout): one contract, three backends. Every behaviour is checked on a
local directory, on S3 (moto's server over HTTP) and on GCS (fake-gcs-server over HTTP, behind the proxy that
gives it GCS's precondition edges: tests/gcsserver.py) through the same tests."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from fleet.errors import ConfigError, ObjectMissing, StoreError
from fleet.store import Store, open_store
from fleet.store.local import LocalStore
from fleet.store.s3 import S3Store

MB = 1024 * 1024


def make_store(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, threshold_mb: int = 64
) -> Store:
    if kind == "local":
        return open_store(str(tmp_path / "store"), multipart_threshold_mb=threshold_mb)
    bucket = request.getfixturevalue(f"{kind}_bucket")
    return open_store(
        f"{kind}://{bucket}/some/prefix", max_attempts=2, multipart_threshold_mb=threshold_mb
    )


BACKENDS = ["local", "s3", "gs"]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return make_store(request.param, tmp_path, request)


@pytest.fixture(params=BACKENDS)
def small_threshold_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """multipart_threshold_mb=5 (the S3 minimum part size), so a 6 MB object goes multipart."""
    return make_store(request.param, tmp_path, request, threshold_mb=5)


# -- basic objects -----------------------------------------------------------------------


def test_put_get_exists_delete(store):
    # Given an empty store
    assert not store.exists("j/chunks/000000")
    # When an object is written
    store.put("j/chunks/000000", b"\x00binary\xff")
    # Then it reads back byte for byte and exists
    assert store.get("j/chunks/000000") == b"\x00binary\xff"
    assert store.exists("j/chunks/000000")
    # When it is overwritten, the new bytes replace the old
    store.put("j/chunks/000000", b"second")
    assert store.get("j/chunks/000000") == b"second"
    # When it is deleted, it is gone, and deleting again is fine
    store.delete("j/chunks/000000")
    assert not store.exists("j/chunks/000000")
    store.delete("j/chunks/000000")


def test_empty_object(store):
    store.put("j/empty", b"")
    assert store.exists("j/empty") and store.get("j/empty") == b""


@pytest.mark.slow
def test_get_missing_raises_object_missing(store):
    with pytest.raises(ObjectMissing) as info:
        store.get("j/results/000007")
    assert isinstance(info.value, StoreError)
    assert "j/results/000007" in str(info.value)


def test_version_of_missing_raises_object_missing(store):
    with pytest.raises(ObjectMissing):
        store.version("nope")


def test_exists_is_false_for_a_prefix(store):
    store.put("j/results/000001", b"x")
    assert not store.exists("j/results")


# -- listing -----------------------------------------------------------------------------


def test_list_is_lexicographic_and_filtered_by_prefix(store):
    # Given keys written out of order, in sibling folders with a shared name start
    keys = [
        "j/results/000010",
        "j/results/000002",
        "j/results/000001",
        "j/resultsX/000000",
        "j/chunks/000000",
        "j/manifest.json",
        "k/results/000000",
    ]
    for k in keys:
        store.put(k, k.encode())
    # When a folder prefix is listed
    listed = list(store.list("j/results/"))
    # Then only its keys come back, in order, relative to the store root
    assert listed == ["j/results/000001", "j/results/000002", "j/results/000010"]
    # And a partial-name prefix matches by string, like S3
    assert list(store.list("j/res")) == [
        "j/results/000001",
        "j/results/000002",
        "j/results/000010",
        "j/resultsX/000000",
    ]
    assert list(store.list("j/")) == sorted(k for k in keys if k.startswith("j/"))
    assert list(store.list("")) == sorted(keys)


def test_list_of_an_absent_prefix_is_empty(store):
    store.put("j/a", b"1")
    assert list(store.list("nothing/here/")) == []


@pytest.mark.slow
def test_delete_prefix(store):
    for i in range(3):
        store.put(f"j/partial/000001/00000{i}-w", b"c")
    store.put("j/partial/000002/000000-w", b"keep")
    store.delete_prefix("j/partial/000001/")
    assert list(store.list("j/partial/")) == ["j/partial/000002/000000-w"]


@pytest.mark.slow
def test_delete_many_removes_exactly_the_keys_given(store):
    # Given checkpoints of a chunk and objects beside them: on S3, 1,001 (more than one DeleteObjects
    # request holds); a backend that deletes one by one (base.Store.delete_many) has no such edge, and its
    # 1,001 puts and deletes took GCS's case 99 s of the main suite on 2 busy cores
    keys = [f"j/partial/000001/{i:06d}-w" for i in range(1001 if isinstance(store, S3Store) else 5)]
    for key in keys:
        store.put(key, b"c")
    store.put("j/partial/000002/000000-w", b"other")
    store.put("j/results/000001", b"result")
    # When they are deleted together, with a key that is already gone among them
    store.delete_many([*keys, "j/partial/000001/gone"])
    # Then exactly they are gone
    assert list(store.list("j/")) == ["j/partial/000002/000000-w", "j/results/000001"]
    store.delete_many([])


@pytest.mark.slow
def test_s3_deletes_a_thousand_keys_a_request(s3_bucket):
    # Given an S3 store whose requests are counted, with 2,001 objects under a prefix
    store = S3Store(f"s3://{s3_bucket}/batched")
    calls: list[str] = []
    store.client.meta.events.register("before-call.s3", lambda model, **_: calls.append(model.name))
    for i in range(2001):
        store.put(f"j/partial/000000/{i:06d}-w", b"c")
    calls.clear()
    # When the prefix is deleted (the reaper and the job end drop checkpoints so)
    store.delete_prefix("j/partial/")
    # Then three DeleteObjects requests removed them (after the listing's three pages), none one by one
    assert calls == ["ListObjectsV2"] * 3 + ["DeleteObjects"] * 3
    assert list(store.list("j/")) == []


def test_s3_list_follows_pagination(s3_bucket):
    # Given 23 objects and a client whose listing pages hold 5 keys
    store = open_store(f"s3://{s3_bucket}/pfx")
    assert isinstance(store, S3Store)
    keys = [f"j/results/{i:06d}" for i in range(23)]
    for k in reversed(keys):
        store.put(k, b"r")
    real = store.client.get_paginator

    class SmallPages:
        def __init__(self, name: str):
            self.inner = real(name)

        def paginate(self, **kwargs) -> Iterator[dict]:
            return self.inner.paginate(**kwargs, PaginationConfig={"PageSize": 5})

    store.client.get_paginator = SmallPages  # type: ignore[method-assign]
    calls: list[dict] = []
    store.client.meta.events.register(
        "before-call.s3.ListObjectsV2", lambda params, **_: calls.append(params)
    )
    # When the prefix is listed
    listed = list(store.list("j/results/"))
    # Then every key comes back once, in order, across 5 requests
    assert listed == keys
    assert len(calls) == 5


@pytest.mark.slow
def test_s3_list_past_one_thousand_keys(s3_bucket):
    # Given 1,100 objects: more than one S3 listing page at the default page size
    client = boto3.client("s3")
    keys = [f"j/results/{i:06d}" for i in range(1100)]

    def put_range(part: list[str]) -> None:
        c = boto3.session.Session().client("s3")
        for k in part:
            c.put_object(Bucket=s3_bucket, Key=f"pfx/{k}", Body=b"")

    threads = [threading.Thread(target=put_range, args=(keys[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert client.list_objects_v2(Bucket=s3_bucket, Prefix="pfx/")["IsTruncated"]
    # When the store lists them
    listed = list(open_store(f"s3://{s3_bucket}/pfx").list("j/results/"))
    # Then all 1,100 arrive in order
    assert listed == keys


def test_s3_prefix_isolates_stores_in_one_bucket(s3_bucket):
    # Given two stores under different prefixes of one bucket
    a = open_store(f"s3://{s3_bucket}/team-a")
    b = open_store(f"s3://{s3_bucket}/team-b/")
    # When each writes the same key
    a.put("j/manifest.json", b"a")
    b.put("j/manifest.json", b"b")
    # Then each sees only its own, and the real keys carry the prefix
    assert (a.get("j/manifest.json"), b.get("j/manifest.json")) == (b"a", b"b")
    assert list(a.list("")) == ["j/manifest.json"]
    raw = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert sorted(raw) == ["team-a/j/manifest.json", "team-b/j/manifest.json"]


@pytest.mark.slow
def test_s3_bucket_root_store(s3_bucket):
    store = open_store(f"s3://{s3_bucket}")
    store.put("j/x", b"1")
    assert list(store.list("j/")) == ["j/x"]
    assert boto3.client("s3").get_object(Bucket=s3_bucket, Key="j/x")["Body"].read() == b"1"


# -- exactly-once commits ----------------------------------------------------------------


def test_put_if_absent_once(store):
    # Given no object
    # When two conditional writes of different bytes happen one after the other
    first = store.put_if_absent("j/results/000003", b"first")
    second = store.put_if_absent("j/results/000003", b"second")
    # Then only the first wins and its bytes stay
    assert (first, second) == (True, False)
    assert store.get("j/results/000003") == b"first"


@pytest.mark.slow
def test_put_if_absent_race_has_one_winner(store):
    # Given 8 threads ready to commit the same chunk at the same moment
    n = 8
    barrier = threading.Barrier(n)
    won: list[int] = []
    errors: list[BaseException] = []

    def commit(i: int) -> None:
        try:
            barrier.wait()
            if store.put_if_absent("j/results/000000", f"writer-{i}".encode() * 1000):
                won.append(i)
        except BaseException as e:  # collected, asserted below
            errors.append(e)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # Then exactly one wins, nobody errors, and the object holds the winner's bytes whole
    assert errors == []
    assert len(won) == 1
    assert store.get("j/results/000000") == f"writer-{won[0]}".encode() * 1000


def test_version_changes_on_overwrite_only(store):
    # Given an object and its version
    store.put("j/manifest.json", b"one")
    v1 = store.version("j/manifest.json")
    assert store.version("j/manifest.json") == v1
    # When a conditional put loses, the version stays
    assert store.put_if_absent("j/manifest.json", b"other") is False
    assert store.version("j/manifest.json") == v1
    # When the object is overwritten (same size even), the version changes
    store.put("j/manifest.json", b"two")
    v2 = store.version("j/manifest.json")
    assert v2 != v1


# -- multipart ---------------------------------------------------------------------------


def big(seed: int, size: int = 6 * MB) -> bytes:
    block = os.urandom(1024) if seed < 0 else bytes([seed % 256]) * 1024
    return block * (size // 1024) + b"tail"


def assert_multipart(store: Store, key: str) -> None:
    if isinstance(store, S3Store):
        etag = store.client.head_object(Bucket=store.bucket, Key=store._key(key))["ETag"]
        assert "-" in etag, f"{etag} is not a multipart ETag"


def assert_no_open_uploads(store: Store) -> None:
    if isinstance(store, S3Store):
        uploads = store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
        assert uploads == []


def test_multipart_put(small_threshold_store):
    store = small_threshold_store
    # Given a 6 MB object and a 5 MB threshold
    data = big(-1)
    # When it is put
    store.put("j/results/000001", data)
    # Then it reads back whole, written as a multipart upload, with no upload left open
    assert store.get("j/results/000001") == data
    assert_multipart(store, "j/results/000001")
    assert_no_open_uploads(store)
    # And an overwrite through multipart replaces it
    data2 = big(7)
    store.put("j/results/000001", data2)
    assert store.get("j/results/000001") == data2


def test_multipart_put_if_absent(small_threshold_store):
    store = small_threshold_store
    first, second = big(1), big(2)
    # When a 6 MB result is committed conditionally twice
    assert store.put_if_absent("j/results/000004", first) is True
    v = store.version("j/results/000004")
    assert store.put_if_absent("j/results/000004", second) is False
    # Then the first stays, unchanged, and the losing upload was aborted
    assert store.get("j/results/000004") == first
    assert store.version("j/results/000004") == v
    assert_multipart(store, "j/results/000004")
    assert_no_open_uploads(store)


def test_multipart_put_if_absent_loses_to_a_small_object(small_threshold_store):
    store = small_threshold_store
    store.put("j/results/000005", b"small")
    assert store.put_if_absent("j/results/000005", big(3)) is False
    assert store.get("j/results/000005") == b"small"
    assert_no_open_uploads(store)


# -- URLs --------------------------------------------------------------------------------


def test_file_url_opens_a_local_store(tmp_path):
    # Given a file:// URL
    store = open_store(f"file://{tmp_path}/deep/store")
    # Then it is a local store rooted at that path, created on open
    assert isinstance(store, LocalStore)
    assert (tmp_path / "deep" / "store").is_dir()
    store.put("j/manifest.json", b"{}")
    assert (tmp_path / "deep" / "store" / "j" / "manifest.json").read_bytes() == b"{}"


def test_plain_directory_opens_a_local_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = open_store("rel/store")
    assert isinstance(store, LocalStore)
    assert Path(store.url) == tmp_path / "rel" / "store"


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "s3:///"])
def test_s3_url_without_bucket_is_a_config_error(url):
    with pytest.raises(ConfigError) as info:
        open_store(url)
    assert "bucket" in str(info.value)


def test_s3_url_opens_an_s3_store(s3_env):
    store = open_store("s3://my-bucket/a/b/", max_attempts=4, multipart_threshold_mb=8)
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.multipart_threshold) == ("my-bucket", "a/b", 8 * MB)


def test_s3_missing_bucket_is_a_store_error(s3_env):
    store = open_store("s3://no-such-bucket-fleet/p", max_attempts=1)
    with pytest.raises(StoreError):
        store.put("k", b"v")


# -- local specifics ---------------------------------------------------------------------


@pytest.mark.parametrize("key", ["../escape", "/abs/key", "j/../../x"])
def test_local_store_refuses_keys_outside_its_root(tmp_path, key):
    store = LocalStore(tmp_path / "s")
    with pytest.raises(StoreError):
        store.put(key, b"x")


def test_local_store_leaves_no_temp_files(tmp_path):
    # Given a local store after writes, a lost conditional write and an overwrite
    store = LocalStore(tmp_path / "s")
    store.put("j/a", b"1")
    store.put("j/a", b"2")
    assert store.put_if_absent("j/b", b"1")
    assert not store.put_if_absent("j/b", b"2")
    # Then only the two objects are on disk
    assert sorted(os.listdir(tmp_path / "s" / "j")) == ["a", "b"]


def test_local_list_skips_hidden_temp_files(tmp_path):
    store = LocalStore(tmp_path / "s")
    store.put("j/results/000001", b"1")
    (tmp_path / "s" / "j" / "results" / ".000002.abc.tmp").write_bytes(b"half")
    assert list(store.list("j/results/")) == ["j/results/000001"]


def test_local_store_on_an_unwritable_path_is_a_store_error(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StoreError):
        LocalStore(tmp_path / "file" / "store")


# -- gs specifics: resumable uploads carry the precondition to their last chunk ------------


def test_gs_resumable_create_is_refused_at_finalize(gs_bucket, gcs_server):
    # Given a 5 MB threshold: a 9 MB object goes as a resumable upload in 16 MB-or-less chunks
    from fleet.store.gcs import GcsStore

    store = open_store(f"gs://{gs_bucket}/p", max_attempts=2, multipart_threshold_mb=5)
    assert isinstance(store, GcsStore)
    first, second = big(1, 9 * MB), big(2, 9 * MB)
    refused = gcs_server.proxy.counts["refused at finalize"]
    # When it is committed twice, and once over a small object
    assert store.put_if_absent("j/results/000001", first) is True
    v = store.version("j/results/000001")
    assert store.put_if_absent("j/results/000001", second) is False
    store.put("j/results/000002", b"small")
    assert store.put_if_absent("j/results/000002", second) is False
    # Then the first bytes stay, unchanged, and both losers were refused when they finalized
    assert store.get("j/results/000001") == first and store.version("j/results/000001") == v
    assert store.get("j/results/000002") == b"small"
    assert gcs_server.proxy.counts["refused at finalize"] == refused + 2


@pytest.mark.slow
def test_gs_resumable_race_has_one_winner(gs_bucket):
    # Given 4 writers of 9 MB results (resumable) and 4 of small ones (one request) at once
    store = open_store(f"gs://{gs_bucket}/p", max_attempts=2, multipart_threshold_mb=5)
    barrier, won, errors = threading.Barrier(8), [], []

    def commit(i: int) -> None:
        try:
            barrier.wait()
            data = big(i, 9 * MB) if i < 4 else f"small-{i}".encode()
            if store.put_if_absent("j/results/000000", data):
                won.append((i, data))
        except BaseException as e:  # collected, asserted below
            errors.append(e)

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Then exactly one wins and its bytes are the object's
    assert errors == [] and len(won) == 1
    assert store.get("j/results/000000") == won[0][1]


@pytest.mark.parametrize("url", ["gs://", "gs:///prefix"])
def test_gs_url_without_bucket_is_a_config_error(url, gcs_env):
    with pytest.raises(ConfigError) as info:
        open_store(url)
    assert "bucket" in str(info.value)


def test_gs_missing_bucket_is_a_store_error(gcs_env):
    store = open_store("gs://no-such-bucket-fleet/p", max_attempts=1)
    with pytest.raises(StoreError):
        store.put("k", b"v")


def test_unknown_scheme_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        open_store("az://container/prefix")
    assert "unknown scheme az://" in str(info.value) and "gs://" in str(info.value)


def test_download_and_upload_stream_files(store, tmp_path):
    # Given a local file of 3 MB
    src = tmp_path / "in.bin"
    src.write_bytes(big(-1, 3 * MB))
    # When it is uploaded and downloaded again
    store.upload(src, "j/export/x.parquet")
    out = tmp_path / "out.bin"
    store.download("j/export/x.parquet", out)
    # Then the bytes round-trip, and a missing key is ObjectMissing
    assert out.read_bytes() == src.read_bytes()
    with pytest.raises(ObjectMissing):
        store.download("j/export/none", tmp_path / "none")


def test_a_store_has_one_id_however_its_url_is_spelled(tmp_path, monkeypatch):
    from fleet.store.identity import store_id

    # Given one local store reached by a relative path, a file:// URL, a trailing slash and a link
    (tmp_path / "store").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "store")
    monkeypatch.chdir(tmp_path)
    spellings = ["store", f"file://{tmp_path}/store", f"{tmp_path}/store/", str(tmp_path / "link")]
    # Then every spelling has the one id, and another store another id
    assert len({store_id(u) for u in spellings}) == 1
    assert store_id("store") != store_id(str(tmp_path / "other"))
    # And a bucket's prefix is the same with or without empty and trailing parts, but not another prefix
    assert store_id("s3://b/p/q/") == store_id("s3://b//p/q") != store_id("s3://b/p") != store_id("gs://b/p")


def counted_requests() -> dict[tuple[str, str], float]:
    from fleet import metrics

    return {(s.labels["method"], s.labels["kind"]): s.value for m in metrics.STORE_REQUESTS.collect()
            for s in m.samples if s.name.endswith("_total")}


def test_a_workers_store_counts_its_requests_as_an_object_store_bills_them(tmp_path: Path, monkeypatch):
    from fleet.store import counted

    # Given a worker's store over a local one holding 2.5 pages of checkpoint objects of one chunk
    # (a page made 10 keys, S3's 1,000 being slow to write here)
    monkeypatch.setattr(counted, "PAGE", 10)
    inner = LocalStore(tmp_path / "store")
    keys = [f"j/partial/00001/{i:06d}" for i in range(25)]
    for key in keys:
        inner.put(key, b"x")
    store, before = counted.CountedStore(inner), counted_requests()
    # When it lists them, deletes them in one batch call, writes a result and reads it back
    assert list(store.list("j/partial/00001/")) == keys
    store.delete_many(keys)
    store.put("j/results/00001", b"r")
    assert store.get("j/results/00001") == b"r" and store.exists("j/results/00001")
    # Then the metric counts three LIST pages and three DeleteObjects requests, by kind of object
    after = counted_requests()
    spent = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert spent == {("LIST", "partial"): 3, ("DeleteObjects", "partial"): 3, ("PUT", "results"): 1,
                     ("GET", "results"): 1, ("HEAD", "results"): 1}
    assert not list(inner.list("j/partial/")) and store.url == inner.url
