"""A Hugging Face hub on 127.0.0.1 for the tests: the routes and headers that ``huggingface_hub`` (2.x) reads,
serving repositories made in the test, with faults switched on per file.

Routes (as the hub answers them):

* ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}`` (``?blobs=true``): the model's info, with
  ``sha`` (the commit) and ``siblings`` (``rfilename``, ``size``, ``blobId`` and, for weights, ``lfs: {sha256,
  size, pointerSize}``);
* ``GET /api/models/{repo}/refs``: ``branches``, ``tags``, ``converts`` (``name``, ``ref``, ``targetCommit``);
* ``HEAD`` / ``GET /{repo}/resolve/{rev}/{file}``: ``X-Repo-Commit``, ``ETag`` (the git blob id, or the SHA-256
  of an LFS file, then also ``X-Linked-Etag`` and ``X-Linked-Size``), ``Content-Length``, ``Accept-Ranges``;
  a ``Range: bytes=a-b`` request answered 206 with ``Content-Range``.

Errors carry the hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``).
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin")
"""Files the hub stores in LFS (listed with a SHA-256)."""


def git_blob_id(data: bytes) -> str:
    """The git blob id of a file's bytes (what the hub lists and uses as the ETag of a file not in LFS)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Hub:
    """What the server serves and how it misbehaves."""

    repos: dict[str, dict[str, str]] = field(default_factory=dict)
    """Repository -> revision name -> commit."""
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    """Commit -> file name -> bytes."""
    served: dict[tuple[str, str], bytes] = field(default_factory=dict)
    """(commit, file) -> bytes served in place of the listed ones (a file whose bytes differ from the listing)."""
    drop_after: dict[tuple[str, str], int] = field(default_factory=dict)
    """(commit, file) -> bytes sent before the connection is closed, once."""
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    """(method, path, Range header) of every request."""

    def add(self, repo: str, revision: str, files: dict[str, bytes]) -> str:
        """A revision of ``repo`` holding ``files``; its commit."""
        commit = hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()
        self.repos.setdefault(repo, {})[revision] = commit
        self.commits[commit] = dict(files)
        return commit

    def full_gets(self, commit: str, file: str) -> int:
        """GET requests of a whole file of a commit (no Range)."""
        return sum(1 for method, path, rng in self.requests
                   if method == "GET" and path.endswith(f"/resolve/{commit}/{file}") and rng is None)

    def sibling(self, name: str, data: bytes) -> dict:
        entry = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
        if name.endswith(LFS_SUFFIXES):
            entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry


_API = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+)|/(refs))?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    hub: Hub

    def log_message(self, *args) -> None:  # quiet
        pass

    def _error(self, status: int, code: str, commit: str | None = None) -> None:
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", code)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _json(self, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _commit(self, repo: str, rev: str) -> str | None:
        revisions = self.hub.repos[repo]
        if rev in revisions:
            return revisions[rev]
        return rev if rev in revisions.values() else None

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _serve(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.requests.append((self.command, path, self.headers.get("Range")))
        api, resolve = _API.match(path), _RESOLVE.match(path)
        repo = (api or resolve).group(1) if (api or resolve) else None
        if repo not in self.hub.repos:
            return self._error(404, "RepoNotFound")
        if api and api.group(3):  # refs
            return self._json({"branches": [{"name": r, "ref": f"refs/heads/{r}", "targetCommit": c}
                                            for r, c in self.hub.repos[repo].items()], "tags": [], "converts": []})
        if api:
            commit = self._commit(repo, api.group(2) or "main")
            if commit is None:
                return self._error(404, "RevisionNotFound")
            files = self.hub.commits[commit]
            return self._json({"id": repo, "modelId": repo, "sha": commit, "private": False,
                               "siblings": [self.hub.sibling(n, d) for n, d in sorted(files.items())]})
        if resolve is None:
            return self._error(404, "RepoNotFound")
        commit = self._commit(repo, resolve.group(2))
        if commit is None:
            return self._error(404, "RevisionNotFound")
        file = resolve.group(3)
        if file not in self.hub.commits[commit]:
            return self._error(404, "EntryNotFound", commit)
        listed = self.hub.commits[commit][file]
        data = self.hub.served.get((commit, file), listed)
        start, end, status = 0, len(data) - 1, 200
        rng = self.headers.get("Range")
        if rng and (m := _RANGE.match(rng.strip())):
            start, end, status = int(m.group(1)), min(int(m.group(2) or len(data) - 1), len(data) - 1), 206
        self.send_response(status)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("Accept-Ranges", "bytes")
        if file.endswith(LFS_SUFFIXES):
            sha = hashlib.sha256(listed).hexdigest()
            self.send_header("ETag", f'"{sha}"')
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(len(listed)))
        else:
            self.send_header("ETag", f'"{git_blob_id(listed)}"')
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if not body:
            return
        chunk = data[start:end + 1]
        cut = self.hub.drop_after.pop((commit, file), None)
        if cut is not None:  # a dropped connection mid-file
            self.wfile.write(chunk[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(chunk)


@dataclass
class HubServer:
    """A running server: its address (``HF_ENDPOINT``) and what it serves."""

    hub: Hub
    url: str
    server: ThreadingHTTPServer

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(hub: Hub) -> HubServer:
    """Serve ``hub`` on 127.0.0.1 at a free port, on a thread of its own."""
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return HubServer(hub, f"http://127.0.0.1:{server.server_address[1]}", server)
