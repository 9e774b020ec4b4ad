"""A loopback stand-in for a Hugging Face hub mirror: the routes snapshot_download uses.

Serves one repo (a local folder) at one commit, in a thread of the test process:

- ``GET /api/models/REPO/revision/REV``: the repo info (``sha``, ``siblings``);
- ``GET /api/models/REPO/tree/REV[/PATH]``: the file list with sizes, git blob ids and, for LFS
  files (``*.safetensors``, ``*.bin``), their sha256 — what the installer verifies against;
- ``HEAD``/``GET /REPO/resolve/REV/PATH``: the file, with ``X-Repo-Commit`` and
  ``X-Linked-Etag`` / ``X-Linked-Size`` headers, and Range support (sandbox.modelserver's).

``lie`` maps a path to bytes served instead of the real content (a corrupt mirror).

Example:
    mirror = HfMirror(folder, "org/tiny", "a" * 40).start()
    snapshot_download("org/tiny", revision="a" * 40, endpoint=mirror.endpoint, local_dir=d)
    mirror.stop()
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from sandbox.modelserver import ArchiveRequestHandler, ArchiveServer

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf")


def blob_id(data: bytes) -> str:
    """git's blob id of some bytes.

    >>> blob_id(b"")
    'e69de29bb2d1d6434b8b29ae775ad8c2e48c5391'
    """
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


class MirrorHandler(ArchiveRequestHandler):
    """Routes of the hub API over one local folder."""

    def log_message(self, *args: Any) -> None:
        """Quiet."""

    def _mirror(self) -> HfMirror:
        return self.server.owner  # type: ignore[attr-defined]

    def _json(self, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def _route(self) -> bool:
        mirror = self._mirror()
        path = unquote(urlparse(self.path).path)
        mirror.requests.append(f"{self.command} {path}")
        mirror.auth.append(self.headers.get("Authorization"))
        api = f"/api/models/{mirror.repo}/"
        if path.startswith(api + "revision/"):
            self._json({"id": mirror.repo, "sha": mirror.commit,
                        "siblings": [{"rfilename": f["path"]} for f in mirror.tree()]})
            return True
        if path.startswith(api + "tree/"):
            self._json(mirror.tree())
            return True
        resolve = f"/{mirror.repo}/resolve/{mirror.commit}/"
        if path.startswith(resolve):
            relative = path[len(resolve):]
            entry = {f["path"]: f for f in mirror.tree()}.get(relative)
            if entry is None:
                self.send_error(404)
                return True
            self._entry = entry
            lie = mirror.lie.get(relative)
            if lie is not None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(lie)))
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(lie)
                return True
            self.path = "/" + relative
            return False
        self.send_error(404)
        return True

    def end_headers(self) -> None:
        entry = getattr(self, "_entry", None)
        if entry is not None:
            mirror = self._mirror()
            self.send_header("X-Repo-Commit", mirror.commit)
            etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(entry["size"]))
        super().end_headers()

    def do_GET(self) -> None:
        """Route, else serve the file."""
        if not self._route():
            super().do_GET()

    def do_HEAD(self) -> None:
        """Route, else the file's headers."""
        if not self._route():
            super().do_HEAD()


class HfMirror:
    """The mirror of one repo at one commit, on a loopback port."""

    def __init__(self, folder: Path, repo: str, commit: str, port: int = 0) -> None:
        self.folder = Path(folder)
        self.repo = repo
        self.commit = commit
        self.port = port
        self.lie: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.auth: list[str | None] = []
        self._httpd: ArchiveServer | None = None

    @property
    def endpoint(self) -> str:
        """The mirror's endpoint URL."""
        return f"http://127.0.0.1:{self.port}"

    def tree(self) -> list[dict[str, Any]]:
        """The repo's files as the hub's tree API lists them."""
        entries = []
        for path in sorted(p for p in self.folder.rglob("*") if p.is_file()):
            data = path.read_bytes()
            entry: dict[str, Any] = {"type": "file", "path": str(path.relative_to(self.folder)),
                                     "size": len(data), "oid": blob_id(data)}
            if path.name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                "pointerSize": 134}
            entries.append(entry)
        return entries

    def start(self) -> HfMirror:
        """Serve in a thread."""
        handler = functools.partial(MirrorHandler, directory=str(self.folder))
        self._httpd = ArchiveServer(("127.0.0.1", self.port), handler)
        self._httpd.owner = self  # type: ignore[attr-defined]
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
