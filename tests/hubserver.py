"""A Hugging Face Hub stand-in on loopback, reached through HF_ENDPOINT: the routes huggingface_hub's
own calls use (read in huggingface_hub 2.x: utils/_http.py, hf_api.py, file_download.py,
_commit_api.py, lfs.py) for dataset repositories.

Reads (`dataset_info`, `hf_hub_download`, `list_repo_files`): a branch or tag resolves to a commit
sha that moves with each commit, a commit sha stays; every file answer names its commit
(X-Repo-Commit) and an ETag; an unknown repository is 401 RepoNotFound (the Hub answers an
anonymous caller so), an unknown revision 404 RevisionNotFound, an unknown file 404 EntryNotFound,
each in the X-Error-Code header the client reads; Range requests resume a download; a tree listing
comes in pages (PAGE entries, the Hub's 1,000 made small so a client that reads one page misses
files), each naming the next in a Link header.

Writes (`create_repo`, then `upload_folder`/`create_commit` through the LFS protocol; the tests set
HF_HUB_DISABLE_XET, as this serves no Xet storage) with the Hub's edges:
- every write needs the token (`Authorization: Bearer`), else 401;
- a new repository has one commit, the Hub's `.gitattributes` (Parquet and Arrow in LFS); creating
  one that exists is 409;
- `preupload` says, per file, "lfs" for what `.gitattributes` puts in LFS (or binary, or over
  10 MB) and the file's current oid (sha256 for LFS, git's sha1 else), which clients compare to
  skip unchanged files;
- the LFS batch answers an object already held with no actions (nothing to send again), else an
  upload and a verify URL; an upload whose bytes do not hash to its oid is refused, and an object
  is the repository's only once verified;
- a commit (ndjson) is atomic: every operation is checked first (an lfsFile whose object was
  never verified, a deleted file that is not there, a regular file where LFS is required, a
  `parentCommit` that is not the branch's head: 412) and either all of them land in one new
  commit or none does.
A route the code under test calls and this does not know answers 501, so the test fails loudly.
`fail` answers matching requests with an error status a number of times (a Hub busy for a moment).
`hold` keeps matching requests waiting (then drops them unanswered, or answers them), for a test
to kill its client mid-upload or to commit between its client's steps.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, quote, unquote, urlparse

import yaml

from fleet.coord.localredis import free_port
from tests.httpstub import StandInServer

TOKEN = "hf_standin_write_token"
#: tree entries per page (the Hub's is 1,000)
PAGE = 3
#: the Hub's limit for a file committed as a regular git blob
REGULAR_MAX = 10 * 1024 * 1024
#: the start of the `.gitattributes` the Hub gives a new dataset repository
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in (
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.gz", "*.h5", "*.lz4", "*.msgpack", "*.npy", "*.npz",
    "*.onnx", "*.parquet", "*.pb", "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors", "*.tar",
    "*.tar.*", "*.tgz", "*.xz", "*.zip", "*.zst", "*.mds", "*.jpg", "*.png", "*.mp3", "*.wav",
)).encode()


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lfs_patterns(tree: dict[str, bytes]) -> list[str]:
    """The patterns `.gitattributes` puts in LFS; a repository without one (committed by a test)
    gets the Hub's default."""
    text = tree.get(".gitattributes", GITATTRIBUTES).decode()
    return [line.split()[0] for line in text.splitlines() if "filter=lfs" in line and not line.startswith("#")]


def in_lfs(tree: dict[str, bytes], path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(path if "/" in p else name, p) for p in lfs_patterns(tree))


class Refused(Exception):
    """An answer other than success: status, the X-Error-Code, and the message."""

    def __init__(self, status: int, code: str, message: str, **extra: object):
        super().__init__(message)
        self.status, self.code, self.extra = status, code, extra


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    #: LFS objects the repository holds (uploaded and verified), by sha256
    lfs: dict[str, bytes] = field(default_factory=dict)
    #: (sha, summary) of each commit, oldest first
    log: list[tuple[str, str]] = field(default_factory=list)

    def resolve(self, revision: str) -> str | None:
        if revision in self.refs:
            return self.refs[revision]
        if re.fullmatch(r"[0-9a-f]{40}", revision) and revision in self.commits:
            return revision
        return None

    def oid(self, tree: dict[str, bytes], path: str) -> str:
        return sha256(tree[path]) if in_lfs(tree, path) else git_oid(tree[path])


@dataclass
class Hold:
    """Requests `METHOD path` matching `path`, past the first `after` of them, wait here until
    `release`, then are dropped unanswered (the connection closes), or with `drop` off answered."""

    method: str
    path: re.Pattern[str]
    after: int = 0
    drop: bool = True
    seen: int = 0
    waiting: int = 0
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


class HubServer:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.lock = threading.Lock()
        self.requests: list[str] = []
        #: LFS uploads received (PUT) whose bytes hashed to their oid, by oid: a resumed upload
        #: must not send one again
        self.uploads: Counter[str] = Counter()
        #: uploaded, not yet verified, by (repo, oid)
        self.pending: dict[tuple[str, str], bytes] = {}
        self.holds: list[Hold] = []
        #: [method, path pattern, answers left, status]: `fail`'s errors still to answer
        self.failing: list[list] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = StandInServer(("127.0.0.1", self.port), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> HubServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        for hold in self.holds:
            hold.release()
        self.server.shutdown()
        self.server.server_close()

    def env(self) -> dict[str, str]:
        """What a fleet process needs to reach this as the Hub, with the right to write."""
        return {"HF_ENDPOINT": self.url, "HF_TOKEN": TOKEN, "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}

    def hold(self, method: str, path: str, after: int = 0, drop: bool = True) -> Hold:
        hold = Hold(method, re.compile(path), after, drop)
        with self.lock:
            self.holds.append(hold)
        return hold

    def fail(self, method: str, path: str, times: int, status: int = 503) -> None:
        """The next `times` requests matching `method` and `path` (a regular expression) get `status`."""
        with self.lock:
            self.failing.append([method, re.compile(path), times, status])

    def commit(self, repo_id: str, files: dict[str, bytes], branch: str = "main", replace: bool = False) -> str:
        """A commit on `branch` adding (or with `replace`, being only) `files`; its sha."""
        with self.lock:
            repo = self.repos.setdefault(repo_id, Repo())
            parent = repo.refs.get(branch)
            tree = {} if replace or parent is None else dict(repo.commits[parent])
            tree.update(files)
            return self._land(repo, branch, parent, tree, "test commit")

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """The files of `repo_id` at `revision`."""
        with self.lock:
            repo = self.repos[repo_id]
            sha = repo.resolve(revision)
            assert sha is not None, revision
            return dict(repo.commits[sha])

    @staticmethod
    def _land(repo: Repo, branch: str, parent: str | None, tree: dict[str, bytes], summary: str) -> str:
        digest = hashlib.sha1(f"{parent}".encode())
        for path in sorted(tree):
            digest.update(path.encode() + b"\0" + hashlib.sha1(tree[path]).digest())
        digest.update(f"{len(repo.log)}".encode())  # two commits of one tree are two commits
        sha = digest.hexdigest()
        repo.commits[sha] = tree
        repo.refs[branch] = sha
        repo.log.append((sha, summary))
        return sha

    def resolve(self, repo_id: str, revision: str) -> tuple[Repo, str]:
        repo = self.repos.get(repo_id)
        if repo is None:
            raise Refused(401, "RepoNotFound", "Repository not found")
        sha = repo.resolve(revision)
        if sha is None:
            raise Refused(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return repo, sha

    # ---------------------------------------------------------------- writes

    def create_repo(self, body: dict) -> dict:
        if body.get("type") != "dataset":
            raise Refused(501, "NotServed", "the Hub stand-in holds dataset repositories only")
        repo_id = f"{body.get('organization')}/{body.get('name')}"
        with self.lock:
            if repo_id in self.repos:
                raise Refused(409, "RepoExists", "You already created this dataset repo",
                              url=f"{self.url}/datasets/{repo_id}")
            repo = self.repos[repo_id] = Repo()
            self._land(repo, "main", None, {".gitattributes": GITATTRIBUTES}, "initial commit")
        return {"url": f"{self.url}/datasets/{repo_id}", "name": repo_id, "id": repo_id}

    def preupload(self, repo_id: str, revision: str, body: dict) -> dict:
        files = body.get("files")
        if not isinstance(files, list) or len(files) > 256:
            raise Refused(400, "BadRequest", "files: a list of at most 256 entries")
        with self.lock:
            repo, sha = self.resolve(repo_id, revision)
            tree = repo.commits[sha]
            out = []
            for f in files:
                sample = base64.b64decode(f["sample"])
                lfs = in_lfs(tree, f["path"]) or f["size"] > REGULAR_MAX or b"\0" in sample
                out.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                            "oid": repo.oid(tree, f["path"]) if f["path"] in tree else None})
        return {"files": out, "commitOid": sha}

    def lfs_batch(self, repo_id: str, body: dict) -> dict:
        if body.get("operation") != "upload" or "basic" not in body.get("transfers", ["basic"]):
            raise Refused(501, "NotServed", "the Hub stand-in serves LFS uploads over the basic transfer only")
        with self.lock:
            repo, _ = self.resolve(repo_id, (body.get("ref") or {}).get("name", "main"))
            objects = []
            for obj in body["objects"]:
                oid, size = obj["oid"], obj["size"]
                if oid in repo.lfs:
                    objects.append({"oid": oid, "size": size})  # held: no actions, nothing to send
                    continue
                objects.append({"oid": oid, "size": size, "authenticated": True, "actions": {
                    "upload": {"href": f"{self.url}/lfs-upload/{quote(repo_id, safe='')}/{oid}/{size}"},
                    "verify": {"href": f"{self.url}/lfs-verify/{quote(repo_id, safe='')}"}}})
        return {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}

    def lfs_put(self, repo_id: str, oid: str, size: int, data: bytes) -> None:
        if len(data) != size or sha256(data) != oid:
            raise Refused(400, "BadDigest", f"the uploaded bytes are not object {oid} of {size} bytes")
        with self.lock:
            self.pending[(repo_id, oid)] = data
            self.uploads[oid] += 1

    def lfs_verify(self, repo_id: str, body: dict) -> None:
        with self.lock:
            repo, _ = self.resolve(repo_id, "main")
            data = self.pending.pop((repo_id, body.get("oid", "")), None) or repo.lfs.get(body.get("oid", ""))
            if data is None or len(data) != body.get("size"):
                raise Refused(404, "EntryNotFound", f"object {body.get('oid')} was not uploaded")
            repo.lfs[body["oid"]] = data

    def commit_ndjson(self, repo_id: str, revision: str, lines: list[dict]) -> dict:
        if not lines or lines[0].get("key") != "header":
            raise Refused(400, "BadRequest", "a commit starts with its header")
        header = lines[0]["value"]
        with self.lock:
            repo, head = self.resolve(repo_id, revision)
            if revision not in repo.refs:
                raise Refused(400, "BadRequest", f"{revision} is not a branch: commits go to a branch")
            parent = header.get("parentCommit")
            if parent is not None and not head.startswith(parent.lower()):
                raise Refused(412, "PreconditionFailed", "A commit has happened since. Please refresh and try again.")
            tree = dict(repo.commits[head])
            for line in lines[1:]:
                key, value = line.get("key"), line.get("value") or {}
                path = value.get("path", "")
                if key == "file":
                    data = base64.b64decode(value["content"])
                    if in_lfs(tree, path) or len(data) > REGULAR_MAX:
                        raise Refused(400, "BadRequest", f"Your push was rejected: {path} must be stored with LFS")
                    tree[path] = data
                elif key == "lfsFile":
                    if value.get("oid") not in repo.lfs:
                        raise Refused(422, "LfsObjectMissing",
                                      f"Your push was rejected because an LFS pointer ({path}) points to a file "
                                      "that does not exist")
                    tree[path] = repo.lfs[value["oid"]]
                elif key == "deletedFile":
                    if path not in tree:
                        raise Refused(404, "EntryNotFound", f"A file with this name doesn't exist: {path}")
                    del tree[path]
                elif key == "deletedFolder":
                    gone = [p for p in tree if p.startswith(path.rstrip("/") + "/")]
                    if not gone:
                        raise Refused(404, "EntryNotFound", f"A folder with this name doesn't exist: {path}")
                    for p in gone:
                        del tree[p]
                else:
                    raise Refused(501, "NotServed", f"the Hub stand-in does not serve commit operation {key!r}")
            sha = self._land(repo, revision, head, tree, header.get("summary", ""))
        return {"success": True, "commitOid": sha, "commitUrl": f"{self.url}/datasets/{repo_id}/commit/{sha}",
                "hookOutput": "", "pullRequestUrl": None}

    def tree(self, repo_id: str, revision: str, folder: str, recursive: bool, cursor: int) -> tuple[list, int | None]:
        """One page of the listing of `folder` and the cursor of the next page, if any."""
        with self.lock:
            repo, sha = self.resolve(repo_id, revision)
            files = repo.commits[sha]
        prefix = folder.strip("/") + "/" if folder.strip("/") else ""
        entries: dict[str, dict] = {}
        for path in sorted(files):
            if not path.startswith(prefix):
                continue
            parts = path[len(prefix):].split("/")
            for depth in range(1, len(parts)):  # the folders on the way
                if depth > 1 and not recursive:
                    break
                name = prefix + "/".join(parts[:depth])
                entries.setdefault(name, {"type": "directory", "oid": git_oid(name.encode()), "path": name})
            if len(parts) > 1 and not recursive:
                continue
            data = files[path]
            entry = {"type": "file", "oid": git_oid(data), "size": len(data), "path": path}
            if in_lfs(files, path):
                entry["lfs"] = {"oid": sha256(data), "size": len(data), "pointerSize": 134}
            entries[path] = entry
        if prefix and not entries:
            raise Refused(404, "EntryNotFound", f"{folder} does not exist on {revision}")
        listed = list(entries.values())
        page = listed[cursor:cursor + PAGE]
        return page, cursor + PAGE if cursor + PAGE < len(listed) else None

    # ---------------------------------------------------------------- HTTP

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def json(self, obj: object, headers: dict[str, str] | None = None) -> None:
                self.answer(200, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

            def error(self, status: int, code: str, message: str, **extra: object) -> None:
                self.answer(status, json.dumps({"error": message, **extra}).encode(),
                            {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message})

            def body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def authorized(self) -> None:
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    raise Refused(401, "Unauthorized", "Invalid credentials in Authorization header")

            def held(self, line: str) -> bool:
                """True once a hold has kept this request and it is to be dropped."""
                with hub.lock:
                    hold = next((h for h in hub.holds if line.startswith(h.method + " ")
                                 and h.path.fullmatch(line.split(" ", 1)[1]) and not h.released.is_set()), None)
                    if hold is not None:
                        hold.seen += 1
                        if hold.seen <= hold.after:
                            return False
                        hold.waiting += 1
                if hold is None:
                    return False
                hold.released.wait()
                self.close_connection = hold.drop
                return hold.drop

            def info(self, repo_id: str, revision: str) -> None:
                repo, sha = hub.resolve(repo_id, revision)
                self.json({"_id": repo_id, "id": repo_id, "author": repo_id.split("/")[0], "sha": sha,
                           "private": False, "disabled": False, "gated": False, "downloads": 0, "likes": 0,
                           "tags": [], "lastModified": "2026-01-01T00:00:00.000Z",
                           "siblings": [{"rfilename": p} for p in sorted(repo.commits[sha])]})

            def resolve_file(self, repo_id: str, revision: str, path: str) -> None:
                repo, sha = hub.resolve(repo_id, revision)
                tree = repo.commits[sha]
                data = tree.get(path)
                if data is None:
                    raise Refused(404, "EntryNotFound", f"{path} does not exist on {revision}")
                headers = {"X-Repo-Commit": sha, "ETag": f'"{git_oid(data)}"',
                           "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
                if in_lfs(tree, path):
                    headers["X-Linked-Etag"] = f'"{sha256(data)}"'
                    headers["X-Linked-Size"] = str(len(data))
                ranged = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                if ranged and self.command == "GET":
                    start = int(ranged.group(1))
                    end = int(ranged.group(2)) if ranged.group(2) else len(data) - 1
                    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                    self.answer(206, data[start:end + 1], headers)
                    return
                self.answer(200, data, headers)

            def list_tree(self, repo_id: str, revision: str, folder: str, query: dict[str, list[str]]) -> None:
                recursive = query.get("recursive", ["false"])[0].lower() == "true"
                cursor = int(query.get("cursor", ["0"])[0])
                page, following = hub.tree(repo_id, revision, folder, recursive, cursor)
                headers = {}
                if following is not None:
                    base = f"{hub.url}{urlparse(self.path).path}"
                    headers["Link"] = f'<{base}?recursive={str(recursive).lower()}&cursor={following}>; rel="next"'
                self.json(page, headers)

            def route(self, path: str, query: dict[str, list[str]], raw: bytes) -> None:
                repo = r"(?:datasets/)?([^/]+/[^/]+)"
                get = self.command in ("GET", "HEAD")
                if get and (m := re.fullmatch(r"/api/datasets/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)):
                    return self.info(m.group(1), unquote(m.group(2) or "main"))
                if get and (m := re.fullmatch(r"/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)):
                    return self.resolve_file(m.group(1), unquote(m.group(2)), unquote(m.group(3)))
                if get and (m := re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/tree/([^/]+)(?:/(.+))?", path)):
                    return self.list_tree(m.group(1), unquote(m.group(2)), unquote(m.group(3) or ""), query)
                if self.command == "PUT" and (m := re.fullmatch(r"/lfs-upload/([^/]+)/([0-9a-f]{64})/(\d+)", path)):
                    # a presigned storage URL on the real Hub: no token asked
                    hub.lfs_put(unquote(m.group(1)), m.group(2), int(m.group(3)), raw)
                    return self.answer(200)
                if self.command != "POST":
                    raise Refused(501, "NotServed", f"the Hub stand-in does not serve {self.command} {path}")
                self.authorized()
                if path == "/api/validate-yaml":
                    return self.validate_yaml(json.loads(raw))
                if path == "/api/repos/create":
                    return self.json(hub.create_repo(json.loads(raw)))
                if query.get("create_pr"):
                    raise Refused(501, "NotServed", "the Hub stand-in does not serve pull requests")
                if m := re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/preupload/([^/]+)", path):
                    return self.json(hub.preupload(m.group(1), unquote(m.group(2)), json.loads(raw)))
                if m := re.fullmatch(rf"/{repo}\.git/info/lfs/objects/batch", path):
                    if "application/vnd.git-lfs+json" not in self.headers.get("Accept", ""):
                        raise Refused(406, "NotAcceptable", "the LFS batch API answers application/vnd.git-lfs+json")
                    return self.json(hub.lfs_batch(m.group(1), json.loads(raw)))
                if m := re.fullmatch(r"/lfs-verify/([^/]+)", path):
                    hub.lfs_verify(unquote(m.group(1)), json.loads(raw))
                    return self.json({"success": True})
                if m := re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/commit/([^/]+)", path):
                    if self.headers.get("Content-Type") != "application/x-ndjson":
                        raise Refused(400, "BadRequest", "a commit is application/x-ndjson")
                    lines = [json.loads(x) for x in raw.splitlines() if x.strip()]
                    return self.json(hub.commit_ndjson(m.group(1), unquote(m.group(2)), lines))
                raise Refused(501, "NotServed", f"the Hub stand-in does not serve {self.command} {path}")

            def validate_yaml(self, body: dict) -> None:
                content = body.get("content", "")
                head = content.split("\n---", 1)[0].removeprefix("---") if content.startswith("---") else ""
                try:
                    yaml.safe_load(head)
                except yaml.YAMLError as e:
                    self.answer(400, json.dumps({"errors": [{"message": str(e)}]}).encode(),
                                {"Content-Type": "application/json", "X-Error-Code": "BadRequest"})
                    return
                self.json({"errors": [], "warnings": []})

            def _any(self) -> None:
                parsed = urlparse(self.path)
                line = f"{self.command} {parsed.path}"
                hub.requests.append(line)
                raw = self.body()  # read whatever the answer, or the connection's next request breaks
                if self.held(line):
                    return
                with hub.lock:
                    failing = next((f for f in hub.failing if f[2] > 0 and self.command == f[0]
                                    and f[1].fullmatch(parsed.path)), None)
                    if failing is not None:
                        failing[2] -= 1
                if failing is not None:
                    return self.error(failing[3], "ServiceUnavailable", "the Hub stand-in fails this one on purpose")
                try:
                    self.route(parsed.path, parse_qs(parsed.query), raw)
                except Refused as e:
                    self.error(e.status, e.code, str(e), **e.extra)

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _any

        return Handler
