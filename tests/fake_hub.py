"""A minimal local Hugging Face Hub for upload tests (no network, no real Hub).

Implements exactly what `HfApi.create_repo` and `HfApi.upload_folder` send for small files, in
huggingface_hub 1.x and 2.x (read from `hf_api.py`, `_commit_api.py`, `_upload_pipeline.py`):

    POST /api/repos/create                   {"name", "organization", "visibility"|"private"}
    POST /api/validate-yaml                  README.md front matter (upload_folder checks it)
    POST /api/{t}s/{ns}/{name}/preupload/main answers uploadMode "regular" for every file, so the
                                             client never goes to LFS or Xet storage
    POST /api/{t}s/{ns}/{name}/commit/main   NDJSON: a header line, then base64 "file" lines
                                             (and deletedFile/deletedFolder)
    GET  /api/{t}s/{ns}/{name}[/revision/R]  repo_info (asked after an all-unchanged upload)
    GET  /api/{t}s/{ns}/{name}/tree/main     list_repo_tree: path, size, git blob oid per file
    GET  /api/whoami-v2

Faults: `hub.inject(op, times, kind)` makes the next `times` requests of `op` ("create", "tree",
"preupload", "commit") fail: kind "503" answers 503; "drop" closes the connection unanswered;
"drop_after" applies the request (e.g. commits it) and then closes the connection unanswered, as
an upload interrupted after the Hub took it.

Every request is logged in `hub.requests`; anything else is answered 404 and logged in
`hub.unhandled`, so a test can assert the client took no path the fake does not model. What was
committed is in `hub.repos[repo_id].files` (path -> bytes).

Bounded: a http.server on 127.0.0.1 (port chosen by the OS) in daemon threads, answering at most
`max_requests` requests and stopping itself after `lifetime_s` seconds or on context exit.

    with FakeHub(token="hf_test") as hub:
        HfApi(endpoint=hub.url, token="hf_test").create_repo("org/x")
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

_REPO_ROUTE = re.compile(
    r"^/api/(?P<type>models|datasets|spaces)/(?P<ns>[^/]+)/(?P<name>[^/]+)"
    r"(?:/(?P<op>preupload|commit|revision|tree)/(?P<rev>.+))?$"
)
_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
FAULT_KINDS = ("503", "drop", "drop_after")


def git_blob_sha1(data: bytes) -> str:
    """git's blob id, the oid huggingface_hub compares regular files by."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeRepo:
    repo_id: str
    repo_type: str = "model"
    private: bool = False
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[dict[str, Any]] = field(default_factory=list)

    @property
    def head(self) -> str:
        return self.commits[-1]["oid"] if self.commits else "0" * 40


class _HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class FakeHub:
    def __init__(
        self,
        token: str | None = None,
        user: str = "fake-user",
        max_requests: int = 200,
        lifetime_s: float = 60.0,
    ):
        self.token, self.user = token, user
        self.max_requests, self.lifetime_s = max_requests, lifetime_s
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) in arrival order
        self.unhandled: list[tuple[str, str]] = []
        self.faults: list[list] = []  # [op, remaining, kind]
        self.corrupt_paths: set[str] = set()  # committed with other bytes (a lossy Hub)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._timer: threading.Timer | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        assert self._server is not None, "start the FakeHub first (use it as a context manager)"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.block_on_close = False
        threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-hub", daemon=True
        ).start()
        self._timer = threading.Timer(self.lifetime_s, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        with self._lock:
            server, self._server = self._server, None
        if self._timer is not None:
            self._timer.cancel()
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def inject(self, op: str, times: int, kind: str = "503") -> None:
        assert op in ("create", "tree", "preupload", "commit") and kind in FAULT_KINDS
        with self._lock:
            self.faults.append([op, times, kind])

    def _take_fault(self, method: str, path: str) -> str | None:
        m = _REPO_ROUTE.match(path)
        op = "create" if path == "/api/repos/create" else (m["op"] if m else None)
        with self._lock:
            for fault in self.faults:
                if fault[0] == op and fault[1] > 0:
                    fault[1] -= 1
                    return fault[2]
        return None

    # ------------------------------------------------------------------ endpoints
    def handle(self, method: str, path: str, query: dict, headers, body: bytes) -> tuple[int, Any]:
        route = (method, path)
        if path == "/api/repos/create" and method == "POST":
            self._auth(headers)
            return self._create_repo(json.loads(body or b"{}"))
        if path == "/api/validate-yaml" and method == "POST":
            return self._validate_yaml(json.loads(body or b"{}"))
        if path == "/api/whoami-v2" and method == "GET":
            self._auth(headers, required=True)
            return 200, {
                "type": "user",
                "name": self.user,
                "fullname": self.user,
                "orgs": [],
                "auth": {"type": "access_token", "accessToken": {"role": "write"}},
            }
        m = _REPO_ROUTE.match(path)
        if m:
            self._auth(headers)
            repo_id = f"{unquote(m['ns'])}/{unquote(m['name'])}"
            op, rev = m["op"], unquote(m["rev"] or "main")
            repo = self._repo(repo_id, _TYPES[m["type"]])
            if op in ("revision", None) and method == "GET":
                return 200, self._repo_info(repo)
            if op == "tree" and method == "GET":
                if rev != "main":
                    raise _HubError(404, f"fake hub lists only main, not {rev}")
                return 200, [
                    {"type": "file", "path": p, "size": len(b), "oid": git_blob_sha1(b)}
                    for p, b in sorted(repo.files.items())
                ]
            if rev != "main":
                raise _HubError(404, f"Revision Not Found for {repo_id}@{rev}", "RevisionNotFound")
            if op == "preupload" and method == "POST":
                return self._preupload(repo, json.loads(body or b"{}"))
            if op == "commit" and method == "POST":
                return self._commit(repo, body, query)
        with self._lock:
            self.unhandled.append(route)
        raise _HubError(404, f"fake hub does not implement {method} {path}")

    def _auth(self, headers, required: bool = False) -> None:
        """With `token` set, every request must carry it; without, anything goes except an
        anonymous whoami."""
        got = headers.get("authorization") or ""
        ok = got == f"Bearer {self.token}" if self.token is not None else bool(got) or not required
        if not ok:
            raise _HubError(401, "Invalid credentials in Authorization header")

    def _repo(self, repo_id: str, repo_type: str) -> FakeRepo:
        repo = self.repos.get(repo_id)
        if repo is None or repo.repo_type != repo_type:
            raise _HubError(404, f"Repository Not Found for url: {repo_id}", "RepoNotFound")
        return repo

    def _create_repo(self, payload: dict) -> tuple[int, Any]:
        name, ns = payload.get("name"), payload.get("organization") or self.user
        if not name:
            raise _HubError(400, "name is required")
        repo_id = f"{ns}/{name}"
        repo_type = payload.get("type") or "model"
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        url = f"{self.url}/{prefix}{repo_id}"
        with self._lock:
            if repo_id in self.repos:
                return 409, {"error": "You already created this model repo", "url": url}
            private = payload.get("visibility") == "private" or bool(payload.get("private"))
            self.repos[repo_id] = FakeRepo(repo_id, repo_type, private)
        return 200, {"url": url, "name": repo_id, "id": repo_id}

    def _validate_yaml(self, payload: dict) -> tuple[int, Any]:
        import yaml  # a huggingface_hub dependency

        content = payload.get("content") or ""
        m = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", content, re.S)
        if m is None:
            return 200, {"errors": [], "warnings": [{"message": "empty or missing yaml metadata"}]}
        try:
            meta = yaml.safe_load(m.group(1))
        except yaml.YAMLError as e:
            return 400, {"errors": [{"message": f"invalid YAML: {e}"}], "warnings": []}
        if not isinstance(meta, dict):
            return 400, {"errors": [{"message": "metadata must be a mapping"}], "warnings": []}
        return 200, {"errors": [], "warnings": []}

    def _repo_info(self, repo: FakeRepo) -> dict:
        return {
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "sha": repo.head,
            "private": repo.private,
            "siblings": [{"rfilename": p} for p in sorted(repo.files)],
            "tags": [],
        }

    def _preupload(self, repo: FakeRepo, payload: dict) -> tuple[int, Any]:
        files = []
        for f in payload.get("files", []):
            old = repo.files.get(f["path"])
            files.append(
                {
                    "path": f["path"],
                    "uploadMode": "regular",  # keeps the client off LFS and Xet storage
                    "shouldIgnore": False,
                    "oid": git_blob_sha1(old) if old is not None else None,
                }
            )
        return 200, {"files": files, "commitOid": repo.head}

    def _commit(self, repo: FakeRepo, body: bytes, query: dict) -> tuple[int, Any]:
        if query.get("create_pr"):
            raise _HubError(400, "fake hub does not implement pull requests")
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise _HubError(400, "commit payload must start with a header line")
        header = lines[0]["value"]
        with self._lock:
            if header.get("parentCommit") and header["parentCommit"] != repo.head:
                raise _HubError(412, "parentCommit is not the head of main")
            files = dict(repo.files)
            for line in lines[1:]:
                key, value = line.get("key"), line.get("value") or {}
                if key == "file":
                    if value.get("encoding") != "base64":
                        raise _HubError(400, f"unsupported encoding {value.get('encoding')!r}")
                    data = base64.b64decode(value["content"])
                    if value["path"] in self.corrupt_paths:
                        data = b"corrupted:" + data[:8]
                    files[value["path"]] = data
                elif key == "deletedFile":
                    files.pop(value["path"], None)
                elif key == "deletedFolder":
                    prefix = value["path"].rstrip("/") + "/"
                    files = {p: b for p, b in files.items() if not p.startswith(prefix)}
                else:
                    raise _HubError(
                        422, f"fake hub accepts only regular (base64) files, got {key!r}"
                    )
            digest = hashlib.sha1(repo.head.encode())
            for p in sorted(files):
                digest.update(f"{p}\0{git_blob_sha1(files[p])}\0".encode())
            oid = digest.hexdigest()
            repo.files = files
            repo.commits.append(
                {
                    "oid": oid,
                    "summary": header.get("summary", ""),
                    "description": header.get("description", ""),
                    "paths": [ln["value"]["path"] for ln in lines[1:]],
                }
            )
        return 200, {
            "success": True,
            "commitOid": oid,
            "commitUrl": f"{self.url}/{repo.repo_id}/commit/{oid}",
            "pullRequestUrl": None,
        }


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    timeout = 10  # idle connections close instead of pinning a thread

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def _body(self) -> bytes:
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def _serve(self, method: str) -> None:
        hub = self.hub
        split = urlsplit(self.path)
        body = self._body()
        with hub._lock:
            hub.requests.append((method, split.path))
            over = len(hub.requests) > hub.max_requests
        fault = hub._take_fault(method, split.path)
        if fault == "drop":
            self.close_connection = True
            return
        try:
            if fault == "503":
                raise _HubError(503, "injected: service unavailable")
            if over:
                threading.Thread(target=hub.stop, daemon=True).start()
                raise _HubError(503, f"fake hub answers at most {hub.max_requests} requests")
            status, payload = hub.handle(
                method, split.path, parse_qs(split.query), self.headers, body
            )
            extra = {}
        except _HubError as e:
            status, payload = e.status, {"error": e.message}
            extra = {"X-Error-Code": e.code} if e.code else {}
            if e.code:
                extra["X-Error-Message"] = e.message
        if fault == "drop_after":
            self.close_connection = True
            return
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")
