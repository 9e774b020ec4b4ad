"""A real ``hostside/peer_serve.py`` process on a loopback address, as a host runs it (by its
file, with the system ``python3``, from ``/``, in a bare environment), for the tests of peer
distribution.

Example:
    with PeerProcess(models_dir, token_file, address="127.0.0.2") as peer:
        peer.url                      # → 'http://127.0.0.2:40123'
        peer.get(f"/blobs/{sha}", token="…").status   # → 200
    peer.output()                     # what it printed, stdout then stderr
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from hostside import local_command


def token_file(folder: Path, token: str, mode: int = 0o600) -> Path:
    """A token file as the deploy would write it (mode 0600 by default); its path."""
    path = folder / f"peer-token-{len(list(folder.glob('peer-token-*')))}"
    path.write_text(token + "\n")
    os.chmod(path, mode)
    return path


class PeerProcess:
    """One peer server process; started by :meth:`start`, stopped by its PID."""

    def __init__(self, models_dir: Path, token: Path, *, address: str = "127.0.0.2",
                 extra: tuple[str, ...] = ()) -> None:
        self.args = ["--models-dir", str(models_dir), "--address", address, "--port", "0",
                     "--token-file", str(token), *extra]
        self.address = address
        self.process: subprocess.Popen[str] | None = None
        self.port = 0
        self.first_line = ""
        self.stdout = ""
        self.stderr = ""

    @property
    def url(self) -> str:
        """The peer's base URL (what ``fetch_model.py --peer`` takes; IPv6 in brackets)."""
        shown = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{shown}:{self.port}"

    @property
    def pid(self) -> int:
        """The server's process id."""
        assert self.process is not None
        return self.process.pid

    def start(self) -> PeerProcess:
        """Start it and wait (up to 20 s) for its line that says where it listens."""
        self.process = subprocess.Popen(
            local_command("peer_serve", *self.args, python="python3"), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd="/", env={"PATH": os.environ["PATH"]},
        )  # fmt: skip
        assert self.process.stdout is not None
        self.first_line = self.process.stdout.readline()
        if "serving" not in self.first_line:
            self.stop()
            raise AssertionError(f"peer_serve did not start: {self.output()}")
        self.port = int(self.first_line.split("/blobs/")[0].rsplit(":", 1)[1])
        return self

    def get(self, path: str, token: str | None = None, method: str = "GET",
            headers: dict[str, str] | None = None, timeout: float = 10.0) -> Any:
        """One request straight to the server (no proxy); the response, its body read into
        ``response.body``."""
        connection = http.client.HTTPConnection(self.address, self.port, timeout=timeout)
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        connection.request(method, path, headers=sent)
        response = connection.getresponse()
        response.body = response.read()  # type: ignore[attr-defined]
        connection.close()
        return response

    def wait(self, timeout: float) -> int | None:
        """Its exit status once it has exited within ``timeout`` seconds, else None."""
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL, as a crashed host would go."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 5 s) by its PID; collect what it printed."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        out, err = process.communicate(timeout=5)
        self.stdout, self.stderr = self.first_line + (out or ""), err or ""

    def output(self) -> str:
        """What it printed (after :meth:`stop`)."""
        return self.stdout + self.stderr

    def __enter__(self) -> PeerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

