"""Fetching a model from peers before the origin (fetch_model.py --peer, hostside/models/peers.py)
and keeping the verified archive for peers (--keep-blob, hostside/models/blobs.py).

Real programs on loopback: the origin is a fault server on 127.0.0.1, each peer a real
``peer_serve.py`` on 127.0.0.2/3/4 serving the blob a real install kept, and the installer runs
as a host runs it when a test must act while it runs (a peer killed mid-transfer). What must
hold: a blob exists only once its digest matched; a host fetches from a peer without asking the
origin; a peer that refuses, is gone, dies mid-transfer or sends bad bytes is dropped and named,
and the next source completes the install; a bad prefix from a dead peer never makes a good
source look bad; a failed install leaves the served version untouched; the peers' token goes to
peers only, never through a proxy, and appears on no command line and in no output.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hostside import local_command
from hostside.models.common import human_bytes
from tests.support.faultserver import FaultServer
from tests.support.peerserver import PeerProcess, token_file
from tests.support.wait import wait_until
from tests.unit.hostside.test_fetch_model import (
    NAME,
    install,
    make_tar,
    model_members,
    run,
    sha,
)

TOKEN = "fleet-peer-token-2f9c7a1e5b"
FAST = ("--retry-wait", "0.1", "--progress-every", "0")
#: Bytes per second of a peer that is killed mid-transfer.
SLOW_RATE = 1 << 20


@pytest.fixture
def token(tmp_path: Path) -> Path:
    return token_file(tmp_path, TOKEN)


def host(tmp_path: Path, name: str) -> Path:
    """The models folder of one (pretend) host."""
    return tmp_path / name / "models"


def seeded(tmp_path: Path, origin: FaultServer, www: Path, name: str, archive: str,
           digest: str) -> Path:
    """A host that fetched the archive from the origin and kept its blob; its models folder."""
    models = host(tmp_path, name)
    code, _, err = install(models, origin.url(archive), digest, "--keep-blob")
    assert code == 0, err
    return models


@pytest.fixture
def archive(www: Path) -> tuple[str, str]:
    """A 12 MiB model archive at the origin: its file name and sha256."""
    digest = make_tar(www / "v2.tar", model_members("v2", os.urandom(12 << 20)), "w")
    return "v2.tar", digest


def ranges_asked(origin: FaultServer, since: int = 0) -> list[str | None]:
    """The ranges the origin was asked for since request ``since`` (None: the whole file)."""
    return [r["range"] for r in origin.requests[since:]]


# --------------------------------------------------------------------------- keeping blobs


def test_keep_blob_keeps_exactly_the_verified_archive(tmp_path: Path, www: Path,
                                                      origin: FaultServer, archive) -> None:
    name, digest = archive
    models = seeded(tmp_path, origin, www, "a", name, digest)
    blob = models / ".blobs" / digest
    assert blob.read_bytes() == (www / name).read_bytes()
    assert blob.stat().st_mode & 0o777 == 0o644
    listed = json.loads(run("blobs", "--models-dir", str(models))[1])
    assert listed == [{"sha256": digest, "bytes": blob.stat().st_size, "links": 1}]
    assert sorted(p.name for p in (models / ".staging").iterdir()) == [f"{NAME}.lock"]
    assert json.loads((models / NAME / "config.json").read_text()) == {"tag": "v2"}


def test_without_keep_blob_nothing_is_kept(tmp_path: Path, origin: FaultServer,
                                           archive) -> None:
    name, digest = archive
    models = host(tmp_path, "a")
    assert install(models, origin.url(name), digest)[0] == 0
    assert not (models / ".blobs").exists()


def test_a_single_file_blob_is_a_hard_link(tmp_path: Path, www: Path,
                                           origin: FaultServer) -> None:
    data = os.urandom(300_000)
    (www / "tiny-q4.gguf").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    models = host(tmp_path, "a")
    assert install(models, origin.url("tiny-q4.gguf"), digest, "--keep-blob")[0] == 0
    blob = models / ".blobs" / digest
    assert blob.stat().st_ino == (models / NAME / "tiny-q4.gguf").stat().st_ino
    assert blob.stat().st_nlink == 2 and blob.read_bytes() == data


def test_a_mismatched_download_keeps_no_blob(tmp_path: Path, origin: FaultServer,
                                             archive) -> None:
    name, _ = archive
    models = host(tmp_path, "a")
    code, _, err = install(models, origin.url(name), "0" * 64, "--keep-blob")
    assert code == 1 and "checksum mismatch" in err
    assert not (models / ".blobs").exists() or not list((models / ".blobs").iterdir())


def test_keep_blob_on_an_installed_single_file_links_it(tmp_path: Path, www: Path,
                                                        origin: FaultServer) -> None:
    data = os.urandom(100_000)
    (www / "m.gguf").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    models = host(tmp_path, "a")
    assert install(models, origin.url("m.gguf"), digest)[0] == 0
    asked = len(origin.requests)
    code, out, _ = install(models, origin.url("m.gguf"), digest, "--keep-blob")
    assert code == 0 and "kept its file as blob" in out
    assert (models / ".blobs" / digest).read_bytes() == data
    assert len(origin.requests) == asked


def test_keep_blob_on_an_installed_archive_says_it_cannot(tmp_path: Path, origin: FaultServer,
                                                          archive) -> None:
    name, digest = archive
    models = host(tmp_path, "a")
    assert install(models, origin.url(name), digest)[0] == 0
    code, out, _ = install(models, origin.url(name), digest, "--keep-blob")
    assert code == 0
    assert "cannot serve it to peers until it is fetched again with --keep-blob" in out


def test_blobs_are_dropped_on_request_and_with_their_model(tmp_path: Path, www: Path,
                                                           origin: FaultServer,
                                                           archive) -> None:
    name, digest = archive
    models = seeded(tmp_path, origin, www, "a", name, digest)
    code, out, _ = run("drop-blobs", "--models-dir", str(models), "--sha256", digest)
    assert code == 0 and "dropped 1 blob" in out
    assert not (models / ".blobs" / digest).exists()
    assert (models / NAME / "config.json").is_file()  # the model itself stays
    models = seeded(tmp_path, origin, www, "b", name, digest)
    units = tmp_path / "units"
    units.mkdir()
    code, out, _ = run("remove", "--name", NAME, "--models-dir", str(models),
                       "--units-dir", str(units))
    assert code == 0 and "dropped 1 blob" in out
    assert json.loads(run("blobs", "--models-dir", str(models))[1]) == []
    assert run("drop-blobs", "--models-dir", str(models), "--sha256", "../x")[0] == 1


# --------------------------------------------------------------------------- from peers


def test_a_host_fetches_from_a_peer_and_the_origin_is_not_asked(
    tmp_path: Path, www: Path, origin: FaultServer, archive, token: Path
) -> None:
    """A → B → C: the origin sends the archive once; each copy is verified and kept."""
    name, digest = archive
    a = seeded(tmp_path, origin, www, "a", name, digest)
    asked = len(origin.requests)
    b, c = host(tmp_path, "b"), host(tmp_path, "c")
    with PeerProcess(a, token, address="127.0.0.2") as peer_a:
        code, out, err = install(b, origin.url(name), digest, "--peer", peer_a.url,
                                 "--peer-token-file", str(token), "--keep-blob")
        assert code == 0, err
    with PeerProcess(b, token, address="127.0.0.3") as peer_b:
        assert install(c, origin.url(name), digest, "--peer", peer_b.url,
                       "--peer-token-file", str(token))[0] == 0
    assert len(origin.requests) == asked
    assert f"fetching from peer {peer_a.url}" in out
    for models in (b, c):
        assert run("check", "--name", NAME, "--models-dir", str(models), "--deep")[0] == 0
        manifest = json.loads((models / NAME / ".fleet-manifest.json").read_text())
        assert manifest["source"]["url"] == origin.url(name)
    assert (b / ".blobs" / digest).read_bytes() == (www / name).read_bytes()
    assert f'"GET /blobs/{digest} HTTP/1.1" 200' in peer_a.output()


def test_a_refusing_or_absent_peer_is_dropped_and_named(tmp_path: Path, www: Path,
                                                        origin: FaultServer, archive,
                                                        token: Path) -> None:
    name, digest = archive
    a = seeded(tmp_path, origin, www, "a", name, digest)
    other = token_file(tmp_path, "another-deploys-token-123")
    asked = len(origin.requests)
    b = host(tmp_path, "b")
    with PeerProcess(a, other, address="127.0.0.2") as wrong, \
            PeerProcess(a, token, address="127.0.0.3") as right:
        absent = "http://127.0.0.4:9"
        code, out, err = install(b, origin.url(name), digest, "--peer", absent, "--peer",
                                 wrong.url, "--peer", right.url, "--peer-token-file", str(token))
    assert code == 0, err
    assert f"peer {absent} dropped (" in out and "cannot reach" in out
    assert f"peer {wrong.url} dropped (download of {wrong.url}/blobs/{digest} failed: HTTP 403" \
        in out
    assert f"trying peer {right.url}" in out
    assert len(origin.requests) == asked


def test_a_peer_on_ipv6(tmp_path: Path, www: Path, origin: FaultServer, archive,
                       token: Path) -> None:
    name, digest = archive
    a = seeded(tmp_path, origin, www, "a", name, digest)
    asked = len(origin.requests)
    with PeerProcess(a, token, address="::1") as peer:
        assert peer.first_line.count("http://[::1]:") == 1
        assert peer.url == f"http://[::1]:{peer.port}"
        code, out, err = install(host(tmp_path, "b"), origin.url(name), digest, "--peer",
                                 peer.url, "--peer-token-file", str(token))
    assert code == 0, err
    assert "dropped" not in out and len(origin.requests) == asked


def test_every_peer_failing_ends_at_the_origin(tmp_path: Path, origin: FaultServer, archive,
                                               token: Path) -> None:
    name, digest = archive
    b = host(tmp_path, "b")
    code, out, err = install(b, origin.url(name), digest, "--peer", "http://127.0.0.4:9",
                             "--peer-token-file", str(token))
    assert code == 0, err
    assert "trying the origin" in out
    assert ranges_asked(origin) == [None]


def fetch_in_background(models: Path, url: str, digest: str, *extra: str,
                        env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``fetch_model.py install`` as a host runs it, in the background."""
    return subprocess.Popen(
        local_command("fetch_model", "install", "--name", NAME, "--models-dir", str(models),
                      "--url", url, "--sha256", digest, *FAST, *extra, python="python3"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
        env={"PATH": os.environ["PATH"], **(env or {})},
    )  # fmt: skip


def partial_of(models: Path, digest: str) -> Path:
    return models / ".staging" / f"{NAME}-{digest[:16]}.partial"


def killed_mid_transfer(peer: PeerProcess, models: Path, digest: str,
                        process: subprocess.Popen[str]) -> dict[str, Any]:
    """Kill ``peer`` once the installer has written bytes from it; what was seen then.

    The installer writes 4 MiB at a time: at 1 MiB/s the first write lands after about 4 s,
    and the peer would need 8 s more to send the whole 12 MiB archive (the margin a busy
    machine gets)."""
    partial = partial_of(models, digest)
    wait_until(lambda: partial.is_file() and partial.stat().st_size > 0, timeout=30,
               interval=0.02, message="the peer never sent a byte")
    seen = {"cmdline": Path(f"/proc/{process.pid}/cmdline").read_bytes(),
            "state": partial.with_name(partial.name + ".json").read_text()}
    peer.kill()
    seen["at"] = partial.stat().st_size
    return seen


def test_a_peer_killed_mid_transfer_then_the_next_source_completes(
    tmp_path: Path, www: Path, origin: FaultServer, archive, token: Path
) -> None:
    name, digest = archive
    a = seeded(tmp_path, origin, www, "a", name, digest)
    asked = len(origin.requests)
    b = host(tmp_path, "b")
    slow = PeerProcess(a, token, address="127.0.0.2", extra=("--max-rate", str(SLOW_RATE)))
    with slow:
        process = fetch_in_background(b, origin.url(name), digest, "--peer", slow.url,
                                      "--peer-token-file", str(token))
        seen = killed_mid_transfer(slow, b, digest, process)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, out + err
    assert f"peer {slow.url} dropped (" in out and "trying the origin" in out
    assert "re-hashing" not in out  # the running digest was handed over, not read again
    ranges = ranges_asked(origin, asked)
    assert len(ranges) == 1 and ranges[0] is not None, (ranges, out)  # the rest only
    start = int(ranges[0].removeprefix("bytes=").rstrip("-"))
    assert start >= seen["at"] > 0
    assert f"continuing the {human_bytes(start)} that {slow.url}/blobs/{digest} sent" in out
    assert seen["at"] < (www / name).stat().st_size  # it was cut mid-transfer
    assert run("check", "--name", NAME, "--models-dir", str(b), "--deep")[0] == 0
    assert TOKEN.encode() not in seen["cmdline"] and TOKEN not in seen["state"]
    assert TOKEN not in out + err
    assert all(r["authorization"] is None for r in origin.requests)


def test_a_later_run_continues_what_a_dead_peer_left(tmp_path: Path, www: Path,
                                                     origin: FaultServer, archive,
                                                     token: Path) -> None:
    """Run 1: the peer dies and the origin has lost the file (exit 1, the partial kept). Run 2,
    origin only: the peer's bytes are re-hashed once and continued, not fetched again."""
    name, digest = archive
    a = seeded(tmp_path, origin, www, "a", name, digest)
    kept = (www / name).read_bytes()
    (www / name).unlink()
    asked = len(origin.requests)
    b = host(tmp_path, "b")
    slow = PeerProcess(a, token, address="127.0.0.2", extra=("--max-rate", str(SLOW_RATE)))
    with slow:
        process = fetch_in_background(b, origin.url(name), digest, "--peer", slow.url,
                                      "--peer-token-file", str(token))
        seen = killed_mid_transfer(slow, b, digest, process)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1 and "HTTP 404" in err, out + err
    left = partial_of(b, digest).stat().st_size
    assert left >= seen["at"] > 0
    (www / name).write_bytes(kept)
    code, out, err = install(b, origin.url(name), digest)
    assert code == 0, err
    assert f"continuing the {human_bytes(left)} that {slow.url}/blobs/{digest} sent" in out
    assert "re-hashing what is already here once" in out
    assert ranges_asked(origin, asked)[-1] == f"bytes={left}-"
    assert run("check", "--name", NAME, "--models-dir", str(b), "--deep")[0] == 0


def test_a_peer_serving_corrupted_bytes_is_dropped(tmp_path: Path, www: Path,
                                                   origin: FaultServer, archive,
                                                   token: Path) -> None:
    name, digest = archive
    a = seeded(tmp_path, origin, www, "a", name, digest)
    blob = a / ".blobs" / digest
    data = bytearray(blob.read_bytes())
    data[2 << 20] ^= 0x01
    blob.write_bytes(bytes(data))
    b = host(tmp_path, "b")
    asked = len(origin.requests)
    with PeerProcess(a, token, address="127.0.0.2") as bad:
        code, out, err = install(b, origin.url(name), digest, "--peer", bad.url,
                                 "--peer-token-file", str(token), "--keep-blob")
    assert code == 0, err
    assert f"peer {bad.url} dropped (it sent bytes that do not match the sha256)" in out
    assert ranges_asked(origin, asked) == [None]  # the whole file, from the start
    assert (b / ".blobs" / digest).read_bytes() == (www / name).read_bytes()
    assert run("check", "--name", NAME, "--models-dir", str(b), "--deep")[0] == 0


def test_bad_bytes_everywhere_leave_the_served_version_untouched(
    tmp_path: Path, www: Path, origin: FaultServer, archive, token: Path
) -> None:
    name, digest = archive
    a = seeded(tmp_path, origin, www, "a", name, digest)
    blob = a / ".blobs" / digest
    blob.write_bytes(b"x" * blob.stat().st_size)
    b = host(tmp_path, "b")
    v1 = make_tar(www / "v1.tar", model_members("v1"), "w")
    assert install(b, origin.url("v1.tar"), v1)[0] == 0
    link, config = os.readlink(b / NAME), (b / NAME / "config.json").read_bytes()
    (www / name).unlink()  # and the origin has lost it
    with PeerProcess(a, token, address="127.0.0.2") as bad:
        code, out, err = install(b, origin.url(name), digest, "--peer", bad.url,
                                 "--peer-token-file", str(token), "--keep-blob")
    assert code == 1
    assert "dropped (it sent bytes that do not match" in out and "HTTP 404" in err
    assert os.readlink(b / NAME) == link
    assert (b / NAME / "config.json").read_bytes() == config
    assert run("check", "--name", NAME, "--models-dir", str(b))[0] == 0
    assert not (b / ".blobs" / digest).exists()
    partial = partial_of(b, digest)
    assert not partial.exists() or partial.stat().st_size == 0  # no byte of the bad copies


def test_a_bad_prefix_from_a_dead_peer_does_not_poison_the_next_source(
    tmp_path: Path, www: Path, origin: FaultServer, archive, token: Path
) -> None:
    """The dead peer's first MiB was wrong; the origin continues the copy, the spliced whole
    does not match, and the origin is asked for the whole file instead of being dropped."""
    name, digest = archive
    a = seeded(tmp_path, origin, www, "a", name, digest)
    blob = a / ".blobs" / digest
    data = bytearray(blob.read_bytes())
    data[100] ^= 0x01
    blob.write_bytes(bytes(data))
    asked = len(origin.requests)
    b = host(tmp_path, "b")
    slow = PeerProcess(a, token, address="127.0.0.2", extra=("--max-rate", str(SLOW_RATE)))
    with slow:
        process = fetch_in_background(b, origin.url(name), digest, "--peer", slow.url,
                                      "--peer-token-file", str(token))
        killed_mid_transfer(slow, b, digest, process)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, out + err
    assert "does not match sha256" in out and "fetching the whole file from the origin" in out
    assert "the origin dropped" not in out
    ranges = ranges_asked(origin, asked)
    assert len(ranges) == 2 and ranges[0] is not None and ranges[1] is None, (ranges, out)
    assert run("check", "--name", NAME, "--models-dir", str(b), "--deep")[0] == 0


def test_peers_are_reached_directly_whatever_the_proxy_settings(
    tmp_path: Path, www: Path, origin: FaultServer, archive, token: Path
) -> None:
    name, digest = archive
    a = seeded(tmp_path, origin, www, "a", name, digest)
    b = host(tmp_path, "b")
    dead_proxy = {"http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    with PeerProcess(a, token, address="127.0.0.2") as peer:
        process = fetch_in_background(b, origin.url(name), digest, "--peer", peer.url,
                                      "--peer-token-file", str(token), env=dead_proxy)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, out + err
    assert "dropped" not in out


@pytest.mark.parametrize(
    "extra,message",
    [
        (("--peer", "http://127.0.0.2:7070"), "--peer needs --peer-token-file"),
        (("--peer", "http://peer.example:7070", "--peer-token-file", "{token}"),
         "a peer is http://IP:PORT"),
        (("--peer", "http://127.0.0.2:7070/blobs/x", "--peer-token-file", "{token}"),
         "a peer is http://IP:PORT"),
        (("--peer", "http://u:p@127.0.0.2:7070", "--peer-token-file", "{token}"),
         "a peer is http://IP:PORT"),
        (("--peer", "http://127.0.0.2:7070", "--peer-token-file", "{shared}"),
         "open to other users"),
    ],
)
def test_peer_arguments_are_checked(tmp_path: Path, origin: FaultServer, archive, token: Path,
                                    extra, message) -> None:
    name, digest = archive
    shared = token_file(tmp_path, TOKEN, mode=0o640)
    words = [w.format(token=token, shared=shared) for w in extra]
    code, out, err = install(host(tmp_path, "b"), origin.url(name), digest, *words)
    assert code == 1 and message in err
    assert TOKEN not in out + err
    assert origin.requests == []


def test_peers_are_for_url_sources_only(tmp_path: Path, token: Path) -> None:
    upload = tmp_path / "up.tar"
    digest = make_tar(upload, model_members("f"), "w")
    code, _, err = run("install", "--name", NAME, "--models-dir", str(host(tmp_path, "b")),
                       "--file", str(upload), "--sha256", digest, "--peer",
                       "http://127.0.0.2:7070", "--peer-token-file", str(token))
    assert code == 1 and "--peer and --peer-token-file go with --url" in err
    assert sha(upload) == digest


class _Endless(http.server.BaseHTTPRequestHandler):
    """A 'peer' that answers 200 with no length and would send bytes until the disk is full."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        for _ in range(64):
            self.wfile.write(b"x" * 65536)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@contextlib.contextmanager
def misbehaving_peer(handler: type[http.server.BaseHTTPRequestHandler],
                     **attributes: Any) -> Iterator[str]:
    """A "peer" on 127.0.0.2 that answers with ``handler`` (``attributes`` set on its server,
    for the handler to read); its URL while the block runs."""
    peer = http.server.HTTPServer(("127.0.0.2", 0), handler)
    for key, value in attributes.items():
        setattr(peer, key, value)
    threading.Thread(target=peer.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.2:{peer.server_address[1]}"
    finally:
        peer.shutdown()
        peer.server_close()


def test_a_peer_that_sends_no_length_is_dropped(tmp_path: Path, origin: FaultServer, archive,
                                                token: Path) -> None:
    name, digest = archive
    with misbehaving_peer(_Endless) as peer:
        code, out, err = install(host(tmp_path, "b"), origin.url(name), digest, "--peer", peer,
                                 "--peer-token-file", str(token))
    assert code == 0, err
    assert f"peer {peer} dropped ({peer}/blobs/{digest} sent no length: refused)" in out
    assert ranges_asked(origin) == [None]


class _Redirecting(http.server.BaseHTTPRequestHandler):
    """A 'peer' that sends every request on to the URL in ``server.location``."""

    def do_GET(self) -> None:
        self.send_response(302)
        self.send_header("Location", self.server.location)  # type: ignore[attr-defined]
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


def test_a_redirecting_peer_is_dropped_and_the_token_goes_nowhere(
    tmp_path: Path, origin: FaultServer, archive, token: Path
) -> None:
    name, digest = archive
    with misbehaving_peer(_Redirecting, location=origin.url(name)) as peer:
        code, out, err = install(host(tmp_path, "b"), origin.url(name), digest, "--peer", peer,
                                 "--peer-token-file", str(token))
    assert code == 0, err
    assert f"peer {peer} dropped (" in out and "HTTP 302" in out
    assert ranges_asked(origin) == [None]  # asked once, as the origin, not through the peer
    assert all(r["authorization"] is None for r in origin.requests)
