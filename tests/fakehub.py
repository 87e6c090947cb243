"""A fake Hugging Face + ModelScope hub and CDN on 127.0.0.1, for tests and benchmarks.

Real HTTP/1.1 servers (stdlib ThreadingHTTPServer): the "hub" origin serves the HF and ModelScope
APIs, a separate "CDN" origin (another port, so clients see a foreign-origin redirect) serves LFS
bytes and plain mirror paths. Shapes follow ../shared/notes/downloads-and-hubs.md §2.7 and §3.2:
they are what huggingface_hub 2.x and modelscope-hub 0.5 actually parse.

Use through the `fake_hub` pytest fixture (points HF_ENDPOINT / MODELSCOPE_ENDPOINT at it), or
directly: `with FakeHub(tmp) as hub: hub.add_repo(...)`.

Fault knobs, per file and per number of uses (`times=None`: every request):
    hub.faults.add("m.gguf", "cut", after=1_000_000)        # close (RST) after N body bytes
    hub.faults.add("m.gguf", "short", after=1_000_000)      # graceful close after N bytes
    hub.faults.add("m.gguf", "status", status=500)          # one 500, then normal
    hub.faults.add("m.gguf", "429", retry_after=2)          # 429 + Retry-After
    hub.faults.add("m.gguf", "stall", after=N, seconds=3)   # stop sending, keep the socket open
    hub.faults.add("m.gguf", "wrong_length", delta=-10)     # Content-Length off by delta
    hub.faults.add("m.gguf", "flip", at=12345, times=None)  # one byte flipped on the wire
    hub.faults.add("m.gguf", "wrong_range", delta=4096)     # Content-Range start shifted
    hub.faults.add("m.gguf", "ignore_range")                # 200 + full body for a Range GET
    hub.faults.add("m.gguf", "throttle", rate=2_000_000, times=None)  # bytes per second
    hub.faults.add("m.gguf", "busy", limit=2, status=503, times=None)  # 503 past 2 at once
    hub.faults.add("m.gguf", "ignore_range", skip=3)        # the first 3 requests unaffected
    hub.lie_sha("org/repo", "m.gguf")                       # listings advertise a wrong sha256
    hub.expire_cdn_urls(status=410)                         # CDN URLs handed out so far expire
    hub.per_connection_rate = 20e6                          # token bucket on each CDN connection
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest

# huggingface_hub reads these once, at import: set them before any test imports it.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="quantpick-test-hf-"))

SEND_CHUNK = 64 * 1024


def gguf_bytes(size: int, seed: int = 0) -> bytes:
    """Deterministic GGUF-looking bytes: magic, version 3, then pseudo-random filler."""
    head = b"GGUF" + struct.pack("<I", 3)
    block = hashlib.sha256(f"quantpick-{seed}".encode()).digest() * 2048  # 64 KiB
    body = (block * (size // len(block) + 1))[: max(0, size - len(head))]
    # Vary each 64 KiB block so a misplaced range cannot hash the same by accident.
    out = bytearray(head + body)
    for i in range(len(head), len(out), 65536):
        out[i : i + 4] = struct.pack("<I", i)[: len(out[i : i + 4])]
    return bytes(out[:size])


@dataclass
class HubFile:
    name: str
    path: Path
    size: int
    sha256: str
    git_oid: str
    lfs: bool


@dataclass
class HubRepo:
    repo_id: str
    commit: str
    files: dict[str, HubFile]
    gated: bool = False
    private: bool = False
    token: str | None = None
    advertised: dict[str, str] = field(default_factory=dict)  # name -> lying sha256

    def sha_for(self, name: str) -> str:
        return self.advertised.get(name, self.files[name].sha256)


@dataclass
class Fault:
    kind: str
    times: int | None
    params: dict[str, Any]
    skip: int = 0  # requests that pass unaffected before it starts firing


class Faults:
    """Per-file fault queue; each fault fires `times` times (None: forever) on byte GETs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, list[Fault]] = {}

    def add(
        self, name: str, kind: str, *, times: int | None = 1, skip: int = 0, **params: Any
    ) -> None:
        with self._lock:
            self._by_name.setdefault(name, []).append(Fault(kind, times, params, skip))

    def clear(self) -> None:
        with self._lock:
            self._by_name.clear()

    def take(self, name: str) -> dict[str, Fault]:
        """The faults active for this request (by kind), consuming one use of each."""
        with self._lock:
            active: dict[str, Fault] = {}
            for fault in self._by_name.get(name, []):
                if fault.skip > 0:
                    fault.skip -= 1
                    continue
                if fault.times is None or fault.times > 0:
                    active.setdefault(fault.kind, fault)
            for fault in active.values():
                if fault.times is not None:
                    fault.times -= 1
            return active


def _git_oid(data_size: int, path: Path) -> str:
    digest = hashlib.sha1(f"blob {data_size}\0".encode())  # noqa: S324 - git's object id
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# (sha256, git oid) of each served file, once per test session: module- and session-scoped
# fixtures serve the same multi-GB (sparse) files to every test, and rehashing them per test
# was about a minute of the run. Keyed by path, size and mtime, so a rewritten file is rehashed.
HASHES: dict[tuple[str, int, int], tuple[str, str]] = {}


def file_hashes(path: Path) -> tuple[str, str]:
    """(sha256, git blob oid) of `path`, computed once per (path, size, mtime)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in HASHES:
        HASHES[key] = (_sha256(path), _git_oid(stat.st_size, path))
    return HASHES[key]


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        # Clients that hang up mid-answer (cut/stall tests, killed processes) are expected.
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class FakeHub:
    def __init__(self, root: Path, *, port: int = 0) -> None:
        self.root = Path(root)
        self.port = port  # the hub's port (0: any free one); the CDN always takes a free one
        self.repos: dict[str, HubRepo] = {}
        self.faults = Faults()
        self.requests: list[dict[str, Any]] = []
        self.ms_range_status = 200  # ModelScope answers a Range with 200 + Content-Range
        # CDN URLs carry a generation (a stand-in for a signed URL's expiry); older ones are
        # refused with `expired_status` (a signed S3/CloudFront URL past its time: 403).
        self.cdn_generation = 0
        self.expired_status = 403
        # Bytes/s on each CDN connection (a token bucket per connection, as a CDN edge caps
        # one TCP stream); None: as fast as sendfile goes.
        self.per_connection_rate: float | None = None
        self.active: dict[str, int] = {}  # file name -> bodies being sent right now
        self.most_active: dict[str, int] = {}  # file name -> the most at once
        self._log_lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []
        self.hub_url = ""
        self.cdn_url = ""

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> FakeHub:
        for role in ("hub", "cdn"):
            server = _Server(("127.0.0.1", self.port if role == "hub" else 0), _Handler)
            server.daemon_threads = True
            server.fake = self  # type: ignore[attr-defined]
            server.role = role  # type: ignore[attr-defined]
            threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
            self._servers.append(server)
            url = f"http://127.0.0.1:{server.server_address[1]}"
            if role == "hub":
                self.hub_url = url
            else:
                self.cdn_url = url
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def hf_endpoint(self) -> str:
        return self.hub_url

    @property
    def ms_endpoint(self) -> str:
        return self.hub_url

    @property
    def mirror_base(self) -> str:
        """Mirror template for a repo: f"{hub.mirror_base}/{repo_id}/{{file}}"."""
        return f"{self.cdn_url}/mirror"

    # -- content ------------------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes | Path],
        *,
        revision: str | None = None,
        gated: bool = False,
        private: bool = False,
        token: str | None = None,
        lfs_suffixes: tuple[str, ...] = (".gguf", ".bin"),
        unhashed: bool = False,
    ) -> HubRepo:
        """Serve `files` as `repo_id` on HF, ModelScope and the mirror (bytes written to disk).
        `unhashed`: advertise a stand-in sha256 instead of hashing each file (a benchmark's
        full-size sparse files would take ~30 s each); a download of them would fail its check."""
        # A fresh 40-hex "commit" per repo (S324: sha1 is git's object id, not security).
        commit = revision or hashlib.sha1(repo_id.encode() + os.urandom(8)).hexdigest()
        entries: dict[str, HubFile] = {}
        for name, content in files.items():
            if isinstance(content, Path):
                path = content
            else:
                path = (
                    self.root
                    / "blobs"
                    / hashlib.sha256(repo_id.encode() + name.encode()).hexdigest()
                )
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
            size = path.stat().st_size
            if unhashed:
                sha = hashlib.sha256(f"unhashed {repo_id} {name} {size}".encode()).hexdigest()
                oid = sha[:40]
            else:
                sha, oid = file_hashes(path)
            entries[name] = HubFile(name, path, size, sha, oid, name.endswith(lfs_suffixes))
        repo = HubRepo(repo_id, commit, entries, gated=gated, private=private, token=token)
        self.repos[repo_id] = repo
        return repo

    def lie_sha(self, repo_id: str, name: str, fake: str | None = None) -> str:
        fake = fake or hashlib.sha256(b"lie" + name.encode()).hexdigest()
        self.repos[repo_id].advertised[name] = fake
        return fake

    def expire_cdn_urls(self, status: int = 403) -> None:
        """Every CDN URL handed out so far is refused from now on (with `status`); the hub's
        next redirect names a fresh one."""
        self.expired_status = status
        self.cdn_generation += 1

    def log(self, **entry: Any) -> dict[str, Any]:
        with self._log_lock:
            self.requests.append(entry)
            return entry

    def requests_for(self, name: str, method: str = "GET") -> list[dict[str, Any]]:
        """Logged byte requests (CDN, MS download, mirror) of one file name."""
        return [r for r in self.requests if r.get("file") == name and r["method"] == method]


# ---------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # the structured log is FakeHub.requests

    @property
    def hub(self) -> FakeHub:
        return self.server.fake  # type: ignore[no-any-return]

    # -- plumbing -----------------------------------------------------------------------------

    def _entry(
        self, status: int, sent: int = 0, file: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        parts = urlsplit(self.path)
        entry = dict(
            server=self.server.role,
            method=self.command,
            path=unquote(parts.path),
            query=parts.query,
            status=status,
            range=self.headers.get("Range"),
            authorization=self.headers.get("Authorization") is not None,
            cookie=self.headers.get("Cookie") is not None,
            file=file,
            sent=sent,
            port=self.client_address[1],  # the client's port: one per TCP connection
            **extra,
        )
        return self.hub.log(**entry)

    def _json(
        self,
        status: int,
        document: Any,
        headers: dict[str, str] | None = None,
        file: str | None = None,
    ) -> None:
        body = json.dumps(document).encode()
        # logged before the answer goes out: a client that fails on it (a 403) may return before
        # this thread runs again, and a test reading the log then must see the request
        self._entry(status, file=file)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(
        self,
        status: int,
        code: str | None = None,
        message: str = "",
        headers: dict[str, str] | None = None,
        file: str | None = None,
    ) -> None:
        extra = dict(headers or {})
        if code:
            extra["X-Error-Code"] = code
        if message:
            extra["X-Error-Message"] = message
        self._json(status, {"error": message or code or "error"}, extra, file)

    def _authorized(self, repo: HubRepo) -> bool:
        if repo.token is None:
            return True
        auth = self.headers.get("Authorization", "")
        cookie = self.headers.get("Cookie", "")
        return auth == f"Bearer {repo.token}" or f"m_session_id={repo.token}" in cookie

    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self._post_body = self.rfile.read(length).decode() if length else ""
        self._route()

    def _route(self) -> None:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:
            if self.server.role == "cdn":
                return self._cdn(path, query)
            if path == "/api/agent-harnesses" or path == "/api/v1/repos/internalAccelerationInfo":
                return self._error(404, None, "not here")
            if path.startswith("/api/models/"):
                return self._hf_api(path[len("/api/models/") :], query)
            if path.startswith("/api/v1/models/"):
                return self._ms_api(path[len("/api/v1/models/") :], query)
            match = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
            if match:
                return self._hf_resolve(*match.groups())
            self._error(404, None, "no route")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _repo(self, repo_id: str, kind: str) -> HubRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and not self._authorized(repo)):
            if kind == "hf":
                self._error(401 if repo else 404, "RepoNotFound", "Repository not found")
            else:
                self._json(
                    404, {"Code": 10010101, "Message": "model does not exist", "Success": False}
                )
            return None
        return repo

    def _revision_ok(self, repo: HubRepo, revision: str, default: str) -> bool:
        return revision in (default, repo.commit)

    # -- Hugging Face -------------------------------------------------------------------------

    def _hf_entry(self, repo: HubRepo, f: HubFile) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": f.git_oid, "size": f.size, "path": f.name}
        if f.lfs:
            entry["lfs"] = {"oid": repo.sha_for(f.name), "size": f.size, "pointerSize": 134}
        return entry

    def _hf_api(self, rest: str, query: dict[str, str]) -> None:
        segments = rest.split("/")
        repo = self._repo("/".join(segments[:2]), "hf")
        if repo is None:
            return
        tail = segments[2:]
        revision = tail[1] if len(tail) >= 2 else "main"
        if (
            tail
            and tail[0] in ("revision", "tree", "paths-info")
            and not self._revision_ok(repo, revision, "main")
        ):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        if not tail or tail[0] == "revision":
            siblings = []
            for f in repo.files.values():
                sibling: dict[str, Any] = {"rfilename": f.name, "size": f.size, "blobId": f.git_oid}
                if f.lfs:
                    sibling["lfs"] = {
                        "sha256": repo.sha_for(f.name),
                        "size": f.size,
                        "pointerSize": 134,
                    }
                siblings.append(sibling)
            return self._json(
                200,
                {
                    "id": repo.repo_id,
                    "sha": repo.commit,
                    "private": repo.private,
                    "gated": "manual" if repo.gated else False,
                    "siblings": siblings,
                },
            )
        if tail[0] == "tree":
            prefix = "/".join(tail[2:])
            files = [f for f in repo.files.values() if f.name.startswith(prefix)]
            folders = sorted({f.name.rsplit("/", 1)[0] for f in files if "/" in f.name})
            listing: list[dict[str, Any]] = [
                {"type": "directory", "oid": "0" * 40, "path": d} for d in folders
            ]
            return self._json(200, listing + [self._hf_entry(repo, f) for f in files])
        if tail[0] == "paths-info":
            wanted = parse_qs(getattr(self, "_post_body", "")).get("paths", [])
            found = [self._hf_entry(repo, repo.files[p]) for p in wanted if p in repo.files]
            return self._json(200, found)
        self._error(404, None, "no route")

    def _hf_resolve(self, repo_id: str, revision: str, name: str) -> None:
        repo = self._repo(repo_id, "hf")
        if repo is None:
            return
        if not self._revision_ok(repo, revision, "main"):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        if repo.gated and not self._authorized(repo):
            return self._error(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
            )
        f = repo.files.get(name)
        if f is None:
            return self._error(
                404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": repo.commit}
            )
        common = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
        if f.lfs:
            sha = repo.sha_for(name)
            self.send_response(302)
            self.send_header(
                "Location",
                f"{self.hub.cdn_url}/lfs/{f.sha256}?name={quote(name)}&repo={quote(repo_id)}"
                f"&sig={self.hub.cdn_generation}",
            )
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(f.size))
            self.send_header("ETag", f'"{f.git_oid}"')
            for key, value in common.items():
                self.send_header(key, value)
            self.send_header("Content-Length", "0")
            self._entry(302, file=name)  # logged before the client can follow it
            self.end_headers()
            return
        self._send_file(repo, f, {**common, "ETag": f'"{f.git_oid}"'})

    # -- ModelScope ---------------------------------------------------------------------------

    def _ms_api(self, rest: str, query: dict[str, str]) -> None:
        segments = rest.split("/")
        repo = self._repo("/".join(segments[:2]), "ms")
        if repo is None:
            return
        tail = "/".join(segments[2:])
        if tail == "revisions":
            branch = {"Revision": "master", "CreatedAt": 1_700_000_000}
            return self._json(
                200,
                {
                    "Code": 200,
                    "Data": {"RevisionMap": {"Branches": [branch], "Tags": []}},
                    "Success": True,
                },
            )
        if tail == "":
            return self._json(200, {"Code": 200, "Data": {"Name": repo.repo_id}, "Success": True})
        revision = query.get("Revision", "master")
        if not self._revision_ok(repo, revision, "master"):
            return self._json(
                404, {"Code": 10010205, "Message": "revision not found", "Success": False}
            )
        if tail == "repo/files":
            files = [
                {
                    "Path": f.name,
                    "Name": f.name.rsplit("/", 1)[-1],
                    "Type": "blob",
                    "Size": f.size,
                    "Sha256": repo.sha_for(f.name),
                    "IsLFS": f.lfs,
                    "Revision": repo.commit,
                }
                for f in repo.files.values()
            ]
            return self._json(200, {"Code": 200, "Data": {"Files": files}, "Success": True})
        if tail == "repo":
            f = repo.files.get(query.get("FilePath", ""))
            if f is None:
                return self._json(
                    404, {"Code": 10010101, "Message": "file not found", "Success": False}
                )
            return self._send_file(repo, f, {}, ms_style=True)
        self._error(404, None, "no route")

    # -- CDN / mirror -------------------------------------------------------------------------

    def _cdn(self, path: str, query: dict[str, str]) -> None:
        if path.startswith("/lfs/"):
            repo = self.hub.repos.get(query.get("repo", ""))
            f = repo.files.get(query.get("name", "")) if repo else None
            if repo is None or f is None or f.sha256 != path[len("/lfs/") :]:
                return self._error(404, None, "no such object")
            if "sig" in query and query["sig"] != str(self.hub.cdn_generation):
                return self._error(self.hub.expired_status, None, "expired", file=f.name)
            return self._send_file(
                repo, f, {"Content-Disposition": f'inline; filename="{f.name.rsplit("/", 1)[-1]}";'}
            )
        match = re.match(r"^/mirror/([^/]+/[^/]+)/(.+)$", path)
        if match:
            repo = self.hub.repos.get(match.group(1))
            f = repo.files.get(match.group(2)) if repo else None
            if repo is None or f is None:
                return self._error(404, None, "no such file")
            return self._send_file(repo, f, {})
        self._error(404, None, "no route")

    def _send_file(
        self, repo: HubRepo, f: HubFile, headers: dict[str, str], ms_style: bool = False
    ) -> None:
        faults = self.hub.faults.take(f.name) if self.command == "GET" else {}
        with self.hub._log_lock:  # one request at a time counts itself in (or is turned away)
            busy = faults["busy"].params if "busy" in faults else None
            now = self.hub.active.get(f.name, 0)
            if busy is None or now < int(busy["limit"]):
                now = self.hub.active[f.name] = now + 1
                self.hub.most_active[f.name] = max(self.hub.most_active.get(f.name, 0), now)
                busy = None
        if busy is not None:
            extra = {"Retry-After": str(busy.get("retry_after", 1))}
            return self._error(int(busy.get("status", 503)), None, "busy", extra, f.name)
        try:
            self._send_counted(f, headers, faults, ms_style, now)
        finally:
            with self.hub._log_lock:
                self.hub.active[f.name] -= 1

    def _send_counted(
        self,
        f: HubFile,
        headers: dict[str, str],
        faults: dict[str, Fault],
        ms_style: bool,
        now: int,
    ) -> None:
        for kind in ("status", "429"):
            if kind in faults:
                status = int(faults[kind].params.get("status", 429))
                extra = {}
                if kind == "429":
                    extra["Retry-After"] = str(faults[kind].params.get("retry_after", 1))
                return self._error(status, None, "injected", extra, f.name)
        start, end, ranged = 0, f.size - 1, False
        range_header = self.headers.get("Range")
        if range_header and "ignore_range" not in faults:
            match = re.match(r"^bytes=(\d*)-(\d*)$", range_header.strip())
            if match and (match.group(1) or match.group(2)):
                if match.group(1):
                    start = int(match.group(1))
                    end = int(match.group(2)) if match.group(2) else f.size - 1
                else:
                    start = max(0, f.size - int(match.group(2)))
                end = min(end, f.size - 1)
                if start >= f.size or start > end:
                    return self._error(
                        416, None, "range", {"Content-Range": f"bytes */{f.size}"}, f.name
                    )
                ranged = True
        length = end - start + 1
        status = (self.hub.ms_range_status if ms_style else 206) if ranged else 200
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        declared = (
            length + int(faults["wrong_length"].params.get("delta", 1))
            if "wrong_length" in faults
            else length
        )
        self.send_header("Content-Length", str(declared))
        self.send_header("Content-Type", "application/octet-stream")
        if ranged:
            shift = (
                int(faults["wrong_range"].params.get("delta", 4096))
                if "wrong_range" in faults
                else 0
            )
            self.send_header("Content-Range", f"bytes {start + shift}-{end}/{f.size}")
        self.end_headers()
        if self.command == "HEAD":
            self._entry(status, file=f.name)
            return
        # Logged before the body, so tests see a transfer in progress; `sent`/`cut` filled after.
        entry = self._entry(status, file=f.name, cut=False, faults=sorted(faults), active=now)
        sent, cut = self._body(f, start, length, faults, entry)
        entry["cut"] = cut
        if cut or "wrong_length" in faults:
            self.close_connection = True

    def _tokens(self, want: int, rate: float) -> int:
        """Wait until this connection's token bucket holds `want` bytes, take them. The bucket
        lives on the handler, which serves one connection (all its keep-alive requests); it holds
        at most 4 chunks of burst (13 ms at 20 MB/s). An oversleep is credited, a short sleep
        leaves a debt: over time the connection gets exactly `rate`."""
        capacity = 4 * SEND_CHUNK
        now = time.monotonic()
        level = getattr(self, "_bucket_level", float(capacity))
        level = min(capacity, level + (now - getattr(self, "_bucket_stamp", now)) * rate)
        if level < want:
            time.sleep((want - level) / rate)
            later = time.monotonic()
            level, now = min(capacity, level + (later - now) * rate), later
        self._bucket_level, self._bucket_stamp = level - want, now
        return want

    def _body(
        self, f: HubFile, start: int, length: int, faults: dict[str, Fault], entry: dict[str, Any]
    ) -> tuple[int, bool]:
        """Send bytes [start, start+length); returns (bytes sent, connection cut on purpose)."""
        self.wfile.flush()
        sock = self.connection
        stop_at = length
        for kind in ("cut", "short", "stall"):
            if kind in faults:
                stop_at = min(stop_at, max(0, int(faults[kind].params.get("after", length // 2))))
        flip_at = int(faults["flip"].params.get("at", 0)) if "flip" in faults else None
        rate = float(faults["throttle"].params["rate"]) if "throttle" in faults else None
        sent = 0
        bucket = self.server.role == "cdn" and self.hub.per_connection_rate
        with open(f.path, "rb") as handle:
            if flip_at is None and rate is None:
                # Fast path (benchmarks): the kernel copies, like the prototype's sendfile.
                while sent < stop_at:
                    step = stop_at - sent
                    if bucket:
                        step = self._tokens(min(step, SEND_CHUNK), float(bucket))
                    n = os.sendfile(sock.fileno(), handle.fileno(), start + sent, step)
                    if n == 0:
                        break
                    sent += n
                    entry["sent"] = sent
            else:
                handle.seek(start)
                began = time.monotonic()
                while sent < stop_at:
                    chunk = bytearray(handle.read(min(SEND_CHUNK, stop_at - sent)))
                    if not chunk:
                        break
                    if flip_at is not None and start + sent <= flip_at < start + sent + len(chunk):
                        chunk[flip_at - start - sent] ^= 0xFF
                    sock.sendall(chunk)
                    sent += len(chunk)
                    entry["sent"] = sent
                    if rate:
                        ahead = sent / rate - (time.monotonic() - began)
                        if ahead > 0:
                            time.sleep(ahead)
        if stop_at < length:
            if "stall" in faults:
                time.sleep(float(faults["stall"].params.get("seconds", 2.0)))
            if "cut" in faults:
                # RST instead of FIN: what a dropped connection looks like.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return sent, True
        return sent, False


# ---------------------------------------------------------------------------------------------
# A hub that accepts connections and never answers


class SilentServer:
    """A TCP listener on 127.0.0.1 that accepts every connection, reads what the client sends and
    never answers (the "hub that hangs" of issue 13). Point HF_ENDPOINT/MODELSCOPE_ENDPOINT or a
    URL at `url`; `connections` counts the accepted connections (one per client attempt).
    """

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.05)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        self._open: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            self._open.append(conn)  # held open, never written to

    def __enter__(self) -> SilentServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for conn in self._open:
            conn.close()
        self._sock.close()


# ---------------------------------------------------------------------------------------------
# pytest fixtures


@pytest.fixture
def fake_hub(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeHub]:
    """A running FakeHub with the real clients pointed at it (env vars, temp caches, no tokens)."""
    root = tmp_path_factory.mktemp("fakehub")
    hub = FakeHub(root).start()
    monkeypatch.setenv("HF_ENDPOINT", hub.hf_endpoint)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.ms_endpoint)
    monkeypatch.delenv("MODELSCOPE_DOMAIN", raising=False)
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "")  # "" = explicitly no token, not the saved one
    monkeypatch.setenv("MODELSCOPE_DOWNLOAD_INTRA_CLOUD", "false")
    monkeypatch.setenv("MODELSCOPE_CACHE", str(root / "ms-cache"))
    monkeypatch.setenv("MODELSCOPE_HOME", str(root / "ms-home"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    try:
        yield hub
    finally:
        hub.stop()


# The same small architecture as a manifest's TOML table, for tests that write manifest files.
SMALL_ARCH_TOML = """
[architecture]
name = "qwen35moe"
block_count = 4
nextn_predict_layers = 0
context_length = 4096
embedding_length = 64
head_count = 4
head_count_kv = 2
key_length = 16
value_length = 16
expert_count = 4
expert_used_count = 2
expert_feed_forward_length = 32
expert_shared_feed_forward_length = 32
ssm_conv_kernel = 4
ssm_state_size = 16
ssm_group_count = 2
ssm_time_step_rank = 4
ssm_inner_size = 64
full_attention_interval = 4
vocab_size = 256
"""


def make_manifest(
    model_id: str,
    files: dict[str, bytes],
    sources: tuple[Any, ...],
    *,
    quant: str = "Q4_K_M",
    checksums_file: str | None = "SHA256SUMS",
    manifest_sha: dict[str, str | None] | None = None,
) -> Any:
    """A Manifest for `files` (each *.gguf is a model file of `quant`, "mmproj*" the projector)."""
    from quantpick.arch.registry import architecture
    from quantpick.model.manifest import Manifest, ModelFile

    arch = architecture(
        "qwen35moe",
        block_count=4,
        nextn_predict_layers=0,
        context_length=4096,
        embedding_length=64,
        head_count=4,
        head_count_kv=2,
        key_length=16,
        value_length=16,
        expert_count=4,
        expert_used_count=2,
        expert_feed_forward_length=32,
        expert_shared_feed_forward_length=32,
        ssm_conv_kernel=4,
        ssm_state_size=16,
        ssm_group_count=2,
        ssm_time_step_rank=4,
        ssm_inner_size=64,
        full_attention_interval=4,
        vocab_size=256,
    )
    shas = manifest_sha or {}
    model_files = []
    names = [n for n in files if n.endswith(".gguf")]
    shards = [n for n in names if not n.startswith("mmproj")]
    for name in names:
        is_projector = name.startswith("mmproj")
        sha = shas[name] if name in shas else hashlib.sha256(files[name]).hexdigest()
        model_files.append(
            ModelFile(
                name=name,
                quant="F16" if is_projector else quant,
                size_bytes=len(files[name]),
                size_exact=True,
                sha256=sha,
                quality_rank=None if is_projector else 5,
                role="mmproj" if is_projector else "model",
                shard=None if is_projector or len(shards) == 1 else shards.index(name) + 1,
                shard_count=None if is_projector or len(shards) == 1 else len(shards),
            )
        )
    return Manifest(
        id=model_id,
        display_name=model_id,
        license=None,
        architecture=arch,
        sources=tuple(sources),
        files=tuple(model_files),
        checksums_file=checksums_file,
    )


def sha256sums(files: dict[str, bytes]) -> bytes:
    return "".join(
        f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in files.items()
    ).encode()
