"""The host-side model installer (hostside/fetch_model.py and hostside/models/), run here against
faults.

Every fault of issue 5 that concerns the installer alone runs here, in-process, against a
loopback HTTP server the test controls (:mod:`faultserver`): truncated transfers, wrong
checksums, a server that dies mid-download and comes back (resume within one run, and across
runs), servers that ignore ``Range``, a full disk before and during unpacking (small tmpfs
mounts), malicious archives, files changed after install (quick and deep checks), repair,
rollback, pruning, single files, local files and a Hugging Face mirror. Each checks the same
guarantees: the live link still points at the intact previous version, nothing partial is at
the live path, and the message says what happened and what to do. Serving itself (a real vLLM
keeps answering) is checked on a sandbox host in test_models_e2e.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hostside import ROOT_DIR, local_command, program_files
from hostside import fetch_model as fm
from hostside.models import store
from hostside.models.store import MANIFEST
from tests.support.faultserver import FaultServer
from tests.support.hfmirror import HfMirror

NAME = "tiny"


# --------------------------------------------------------------------------- helpers


def sha(path: Path) -> str:
    """SHA256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_tar(path: Path, members: list[tuple[str, str, Any]], mode: str = "w:gz") -> str:
    """Write an archive of ``(name, kind, payload)`` members; return its sha256.

    kind: file (payload bytes), dir, symlink / hardlink (payload: link target), fifo, chr.
    """
    with tarfile.open(path, mode) as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if kind == "file":
                info.size = len(payload)
                info.mode = 0o600
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "fifo": tarfile.FIFOTYPE,
                "chr": tarfile.CHRTYPE,
            }[kind]
            info.mode = 0o700 if kind == "dir" else 0o644
            if kind in ("symlink", "hardlink"):
                info.linkname = payload
            tar.addfile(info)
    return sha(path)


def model_members(tag: str, weights: bytes = b"") -> list[tuple[str, str, Any]]:
    """A small model directory: one top folder, a config and weights."""
    return [
        ("m", "dir", None),
        ("m/config.json", "file", json.dumps({"tag": tag}).encode()),
        ("m/sub", "dir", None),
        ("m/sub/model.safetensors", "file", weights or os.urandom(300_000)),
        ("m/tokenizer.json", "symlink", "sub/model.safetensors"),
    ]


def run(*args: str) -> tuple[int, str, str]:
    """Run fetch_model.main in-process; return (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    real = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        code = fm.main(list(args))
    finally:
        sys.stdout, sys.stderr = real
    return code, out.getvalue(), err.getvalue()


def install(models: Path, url: str, digest: str, *extra: str) -> tuple[int, str, str]:
    """``fetch_model.py install`` for the model NAME."""
    return run(
        "install", "--name", NAME, "--models-dir", str(models), "--url", url,
        "--sha256", digest, "--retry-wait", "0.2", "--progress-every", "0", *extra,
    )


def live_target(models: Path) -> str | None:
    """Where the live link points, None if there is no link."""
    link = models / NAME
    return os.readlink(link) if link.is_symlink() else None


def staging_entries(models: Path) -> list[str]:
    """What is left in staging (the per-model lock file aside)."""
    folder = models / ".staging"
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def assert_untouched(models: Path, before: str | None, served: bytes | None = None,
                     resumable: str = "") -> None:
    """The live link is unchanged, nothing is being unpacked, the old files are intact.

    ``resumable``: a Hugging Face download folder that may stay in staging for the next run.
    """
    assert live_target(models) == before
    left = [e for e in staging_entries(models) if e.endswith((".d", ".hf")) and e != resumable]
    assert not left
    versions = sorted(p.name for p in (models / ".versions").iterdir())
    assert all(not v.endswith(".d") for v in versions)
    if served is not None:
        assert (models / NAME / "config.json").read_bytes() == served
    code, out, _ = run("check", "--name", NAME, "--models-dir", str(models))
    assert code == (0 if before else 3), out


def as_root() -> bool:
    """Mounting a small tmpfs needs root (as the sandbox tests do)."""
    return os.geteuid() == 0


@pytest.fixture
def server(origin: FaultServer) -> FaultServer:
    """The model origin (tests/unit/hostside/conftest.py), as this module's tests name it."""
    return origin


@pytest.fixture
def models(tmp_path: Path) -> Path:
    return tmp_path / "models"


@pytest.fixture
def installed(www: Path, server: FaultServer, models: Path) -> dict[str, Any]:
    """Version 1 of the model, installed: the state every fault must leave alone."""
    digest = make_tar(www / "v1.tar.gz", model_members("v1"))
    code, _, err = install(models, server.url("v1.tar.gz"), digest)
    assert code == 0, err
    return {"sha": digest, "link": live_target(models),
            "config": (models / NAME / "config.json").read_bytes()}


@contextlib.contextmanager
def small_mount(path: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` at ``path`` for the test (root only)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


needs_root = pytest.mark.skipif(not as_root(), reason="mounting a small tmpfs needs root")


# --------------------------------------------------------------------------- installing


def test_install_switches_the_live_link_to_a_verified_version(installed, models: Path) -> None:
    assert installed["link"] == f".versions/{NAME}-{installed['sha'][:16]}"
    manifest = json.loads((models / NAME / MANIFEST).read_text())
    assert manifest["sha256"] == installed["sha"]
    assert set(manifest["files"]) == {"config.json", "sub/model.safetensors"}
    assert manifest["links"] == {"tokenizer.json": "sub/model.safetensors"}
    weights = models / NAME / "sub" / "model.safetensors"
    assert manifest["files"]["sub/model.safetensors"]["sha256"] == sha(weights)
    assert staging_entries(models) == []


def test_install_normalises_modes(installed, models: Path) -> None:
    version = models / installed["link"]
    assert (version / "config.json").stat().st_mode & 0o777 == 0o644
    assert (version / "sub").stat().st_mode & 0o777 == 0o755
    assert (models / ".staging").stat().st_mode & 0o777 == 0o700


def test_rerun_downloads_nothing(installed, models: Path, server: FaultServer) -> None:
    before = len(server.requests)
    code, out, _ = install(models, server.url("v1.tar.gz"), installed["sha"])
    assert code == 0
    assert "is installed and intact" in out
    assert len(server.requests) == before


@pytest.mark.parametrize("mode,suffix", [("w", "tar"), ("w:gz", "tgz"), ("w:xz", "tar.xz")])
def test_archive_formats(www: Path, server: FaultServer, models: Path, mode: str,
                         suffix: str) -> None:
    digest = make_tar(www / f"m.{suffix}", model_members("fmt"), mode)
    code, _, err = install(models, server.url(f"m.{suffix}"), digest, "--unpack", "yes")
    assert code == 0, err
    assert json.loads((models / NAME / "config.json").read_text()) == {"tag": "fmt"}


@pytest.mark.skipif(shutil.which("zstd") is None, reason="zstd is not installed")
def test_tar_zst(www: Path, tmp_path: Path, server: FaultServer, models: Path) -> None:
    plain = tmp_path / "m.tar"
    make_tar(plain, model_members("zst"), "w")
    subprocess.run(["zstd", "-q", "-f", str(plain), "-o", str(www / "m.tar.zst")], check=True)
    code, _, err = install(models, server.url("m.tar.zst"), sha(www / "m.tar.zst"))
    assert code == 0, err
    assert json.loads((models / NAME / "config.json").read_text()) == {"tag": "zst"}


@pytest.mark.skipif(shutil.which("zstd") is None, reason="zstd is not installed")
def test_tar_zst_with_a_long_tail_after_the_end_marker(
    www: Path, tmp_path: Path, server: FaultServer, models: Path
) -> None:
    """tar stops reading at its end marker; what zstd still writes after it (padding: here
    16 MiB of zeros, more than the reader's 4 MiB chunks and a pipe hold) must not fail a good
    archive. The installer killed a zstd still running there: beside a busy core
    ``test_tar_zst`` failed so (zstd descheduled between its last write and its exit)."""
    plain = tmp_path / "m.tar"
    make_tar(plain, model_members("tail"), "w")
    with plain.open("ab") as tar:
        tar.write(bytes(16 << 20))
    subprocess.run(["zstd", "-q", "-f", str(plain), "-o", str(www / "m.tar.zst")], check=True)
    code, _, err = install(models, server.url("m.tar.zst"), sha(www / "m.tar.zst"))
    assert code == 0, err
    assert json.loads((models / NAME / "config.json").read_text()) == {"tag": "tail"}


def test_single_file(www: Path, server: FaultServer, models: Path) -> None:
    data = os.urandom(200_000)
    (www / "tiny-q4.gguf").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    code, _, err = install(models, server.url("tiny-q4.gguf"), digest)
    assert code == 0, err
    assert (models / NAME / "tiny-q4.gguf").read_bytes() == data
    manifest = json.loads((models / NAME / MANIFEST).read_text())
    assert manifest["files"]["tiny-q4.gguf"]["sha256"] == digest


def test_local_file_is_verified_while_unpacking(tmp_path: Path, models: Path) -> None:
    upload = tmp_path / "upload.tar.gz"
    digest = make_tar(upload, model_members("local"))
    code, _, err = run("install", "--name", NAME, "--models-dir", str(models), "--file",
                       str(upload), "--sha256", digest, "--progress-every", "0")
    assert code == 0, err
    assert json.loads((models / NAME / "config.json").read_text()) == {"tag": "local"}
    assert not upload.exists()


def test_local_file_with_wrong_checksum(installed, tmp_path: Path, models: Path) -> None:
    upload = tmp_path / "upload.tar.gz"
    make_tar(upload, model_members("other"))
    code, _, err = run("install", "--name", NAME, "--models-dir", str(models), "--file",
                       str(upload), "--sha256", "0" * 64, "--progress-every", "0")
    assert code == 1
    assert "checksum mismatch for the uploaded tiny" in err
    assert_untouched(models, installed["link"], installed["config"])


def test_progress_shows_bytes_rate_and_eta(www: Path, server: FaultServer, models: Path) -> None:
    data = os.urandom(3 << 20)
    (www / "w.bin").write_bytes(data)
    server.faults.rate = 4 << 20
    code, out, _ = install(models, server.url("w.bin"), hashlib.sha256(data).hexdigest(),
                           "--progress-every", "0.2")
    assert code == 0
    lines = [line for line in out.splitlines() if " of 3.00 MiB (" in line]
    assert len(lines) >= 2, out
    assert "/s, ETA " in lines[0]


# --------------------------------------------------------------------------- download faults


def test_wrong_checksum(installed, www: Path, server: FaultServer, models: Path) -> None:
    make_tar(www / "v2.tar.gz", model_members("v2"))
    wrong = "0" * 63 + "1"
    code, _, err = install(models, server.url("v2.tar.gz"), wrong)
    assert code == 1
    assert f"checksum mismatch for {server.url('v2.tar.gz')}: expected sha256 {wrong}" in err
    assert "previous model keeps serving" in err
    assert_untouched(models, installed["link"], installed["config"])
    assert staging_entries(models) == []


def test_truncated_transfer(installed, www: Path, server: FaultServer, models: Path) -> None:
    """A proxy that cuts every transfer short (and drops Range headers)."""
    digest = make_tar(www / "v2.tar.gz", model_members("v2"))
    server.faults.cut_at, server.faults.cuts, server.faults.ignore_range = 100_000, 100, True
    code, _, err = install(models, server.url("v2.tar.gz"), digest, "--retries", "2")
    assert code == 1
    assert "is truncated: 97.66 KiB of " in err
    assert "the next deploy resumes from byte 100000" in err
    assert_untouched(models, installed["link"], installed["config"])
    assert f"{NAME}-{digest[:16]}.partial" in staging_entries(models)


def test_truncated_file_at_the_source(installed, www: Path, server: FaultServer,
                                      models: Path) -> None:
    """The publisher's file itself is cut short: only the checksum can tell."""
    digest = make_tar(www / "v2.tar.gz", model_members("v2"))
    data = (www / "v2.tar.gz").read_bytes()
    (www / "v2.tar.gz").write_bytes(data[: len(data) // 2])
    code, _, err = install(models, server.url("v2.tar.gz"), digest)
    assert code == 1
    assert "checksum mismatch" in err and "truncated at the source" in err
    assert_untouched(models, installed["link"], installed["config"])


def test_server_dies_mid_download_and_comes_back(installed, www: Path, server: FaultServer,
                                                 models: Path) -> None:
    digest = make_tar(www / "v2.tar.gz", model_members("v2", os.urandom(2 << 20)))
    server.faults.cut_at, server.faults.cuts, server.faults.down_for = 1 << 20, 1, 1.0
    code, out, err = install(models, server.url("v2.tar.gz"), digest)
    assert code == 0, err
    assert server.faults.events[:2] == [f"cut at {1 << 20}", "down"]
    assert any(r["range"] == f"bytes={1 << 20}-" for r in server.requests), server.requests
    assert "retrying" in out and "cannot reach" in out
    assert "re-hashing" not in out  # the running digest went on within the run
    assert json.loads((models / NAME / "config.json").read_text()) == {"tag": "v2"}


def test_resume_in_a_later_run(installed, www: Path, server: FaultServer, models: Path) -> None:
    digest = make_tar(www / "v2.tar.gz", model_members("v2", os.urandom(2 << 20)))
    server.faults.cut_at, server.faults.cuts = 1 << 20, 1
    code, _, err = install(models, server.url("v2.tar.gz"), digest, "--retries", "0")
    assert code == 1 and "truncated" in err
    assert_untouched(models, installed["link"], installed["config"])
    code, out, err = install(models, server.url("v2.tar.gz"), digest)
    assert code == 0, err
    assert "resuming an interrupted download at 1.00 MiB; re-hashing" in out
    assert server.requests[-1]["range"] == f"bytes={1 << 20}-"
    assert staging_entries(models) == []


def test_server_ignoring_ranges_starts_over(installed, www: Path, server: FaultServer,
                                            models: Path) -> None:
    digest = make_tar(www / "v2.tar.gz", model_members("v2", os.urandom(2 << 20)))
    server.faults.cut_at, server.faults.cuts, server.faults.ignore_range = 1 << 20, 1, True
    code, out, err = install(models, server.url("v2.tar.gz"), digest)
    assert code == 0, err
    assert "the server sent the whole file; starting over" in out


def test_changed_file_on_the_server_is_not_spliced(installed, www: Path, server: FaultServer,
                                                   models: Path) -> None:
    """If-Range: a resumed download of a file that changed meanwhile starts over."""
    digest = make_tar(www / "v2.tar.gz", model_members("v2", os.urandom(2 << 20)))
    good = (www / "v2.tar.gz").read_bytes()
    server.faults.cut_at, server.faults.cuts = 1 << 20, 1
    assert install(models, server.url("v2.tar.gz"), digest, "--retries", "0")[0] == 1
    (www / "v2.tar.gz").write_bytes(good[:100] + b"X" + good[101:])
    (www / "v2.tar.gz").write_bytes(good)  # same bytes, new mtime: a new ETag
    os.utime(www / "v2.tar.gz", (time.time() + 5, time.time() + 5))
    code, out, err = install(models, server.url("v2.tar.gz"), digest)
    assert code == 0, err
    assert "starting over" in out


def test_stale_partial_longer_than_the_file_starts_over(installed, www: Path,
                                                       server: FaultServer,
                                                       models: Path) -> None:
    digest = make_tar(www / "v2.tar.gz", model_members("v2"))
    partial = models / ".staging" / f"{NAME}-{digest[:16]}.partial"
    partial.write_bytes(os.urandom(5 << 20))
    partial.with_name(partial.name + ".json").write_text(
        json.dumps({"url": server.url("v2.tar.gz")}))
    code, out, err = install(models, server.url("v2.tar.gz"), digest)
    assert code == 0, err
    assert "cannot resume there (416); starting over" in out


def test_missing_file_is_not_retried(installed, server: FaultServer, models: Path) -> None:
    code, _, err = install(models, server.url("nope.tar.gz"), "a" * 64)
    assert code == 1
    assert "HTTP 404" in err and "Check the URL" in err
    assert len([r for r in server.requests if r["path"] == "/nope.tar.gz"]) == 1
    assert_untouched(models, installed["link"], installed["config"])


# --------------------------------------------------------------------------- disk space


@needs_root
def test_not_enough_space_is_refused_with_numbers(www: Path, tmp_path: Path,
                                                  server: FaultServer) -> None:
    digest = make_tar(www / "big.tar", model_members("big", os.urandom(3 << 20)), "w")
    with small_mount(tmp_path / "small", "4m") as models:
        code, _, err = install(models, server.url("big.tar"), digest)
        assert code == 1
        assert "not enough free space" in err
        assert ("need 6.02 MiB (3.01 MiB still to download + ~3.01 MiB unpacked), "
                "4.00 MiB free") in err
        assert "free. Free " in err
        assert staging_entries(models) == []


@needs_root
def test_disk_full_while_unpacking(www: Path, tmp_path: Path, server: FaultServer) -> None:
    """A compressed archive whose content does not fit (the estimate is the archive's size)."""
    with small_mount(tmp_path / "small", "6m") as models:
        digest = make_tar(www / "v1.tar.gz", model_members("v1"))
        assert install(models, server.url("v1.tar.gz"), digest)[0] == 0
        link, config = live_target(models), (models / NAME / "config.json").read_bytes()
        bomb = make_tar(www / "v2.tar.gz", model_members("v2", bytes(16 << 20)))
        code, _, err = install(models, server.url("v2.tar.gz"), bomb)
        assert code == 1
        assert "the disk filled up while unpacking tiny" in err
        assert "the unpacked files were removed and the previous model keeps serving" in err
        assert "The verified download is kept" in err
        assert_untouched(models, link, config)
        assert staging_entries(models) == [f"{NAME}-{bomb[:16]}.partial",
                                           f"{NAME}-{bomb[:16]}.partial.json"]


# --------------------------------------------------------------------------- malicious archives


MALICIOUS = {
    "dot-dot": ([("m/../../evil", "file", b"x")], "points outside the model directory"),
    "absolute": ([("/tmp/evil", "file", b"x")], "points outside the model directory"),
    "symlink-out": ([("m", "dir", None), ("m/l", "symlink", "../../etc/passwd")],
                    "escapes the model directory"),
    "symlink-absolute": ([("l", "symlink", "/etc/passwd")], "escapes the model directory"),
    "symlink-chain": ([("s", "dir", None), ("s/d", "symlink", ".."),
                       ("l", "symlink", "s/d/..")], "resolves outside the model directory"),
    "write-through-link": ([("d", "symlink", "."), ("d/x", "file", b"x")],
                           "goes through a link"),
    "hardlink-out": ([("h", "hardlink", "../../etc/passwd")],
                     "points outside the model directory"),
    "hardlink-unknown": ([("h", "hardlink", "nowhere")], "does not point to an earlier file"),
    "device": ([("dev", "chr", None)], "is a device, FIFO or other special file"),
    "fifo": ([("f", "fifo", None)], "is a device, FIFO or other special file"),
    "manifest": ([(MANIFEST, "file", b"{}")], "would overwrite the fleet manifest"),
}


@pytest.mark.parametrize("suffix", ["tar.gz", "tar"])
@pytest.mark.parametrize("case", sorted(MALICIOUS))
def test_malicious_archive_is_refused(case: str, suffix: str, installed, www: Path,
                                      server: FaultServer, models: Path, tmp_path: Path) -> None:
    members, message = MALICIOUS[case]
    mode = "w:gz" if suffix == "tar.gz" else "w"
    digest = make_tar(www / f"evil.{suffix}", [*model_members("evil")[:2], *members], mode)
    code, _, err = install(models, server.url(f"evil.{suffix}"), digest)
    assert code == 1
    assert message in err
    assert_untouched(models, installed["link"], installed["config"])
    assert staging_entries(models) == []
    assert not (tmp_path / "evil").exists()


# --------------------------------------------------------------------------- checks and repair


def test_quick_check_finds_a_changed_size(installed, models: Path) -> None:
    with open(models / NAME / "config.json", "ab") as fh:
        fh.write(b" ")
    code, out, _ = run("check", "--name", NAME, "--models-dir", str(models))
    assert code == 3
    assert "config.json: size" in out and "DRIFT" in out


def test_quick_check_finds_a_touched_file(installed, models: Path) -> None:
    os.utime(models / NAME / "config.json", (1, 1))
    code, out, _ = run("check", "--name", NAME, "--models-dir", str(models))
    assert code == 3
    assert "modified after install (mtime)" in out


def test_quick_check_finds_an_added_file(installed, models: Path) -> None:
    (models / NAME / "extra.bin").write_bytes(b"x")
    report = store.check(store.Layout(models, NAME))
    assert report["problems"] == [{"path": "extra.bin", "problem": "not part of the model (added)"}]


def test_deep_check_finds_same_size_same_mtime_corruption(installed, models: Path) -> None:
    weights = models / NAME / "sub" / "model.safetensors"
    st = weights.stat()
    data = bytearray(weights.read_bytes())
    data[1000] ^= 0xFF
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert run("check", "--name", NAME, "--models-dir", str(models))[0] == 0
    code, out, _ = run("check", "--name", NAME, "--models-dir", str(models), "--deep")
    assert code == 3
    assert "sub/model.safetensors: content differs from the manifest (sha256)" in out
    report = json.loads(run("check", "--name", NAME, "--models-dir", str(models), "--deep",
                            "--json")[1])
    assert report["ok"] is False and report["deep"] is True


def test_install_repairs_a_damaged_version(installed, models: Path, server: FaultServer) -> None:
    (models / NAME / "config.json").write_text("{}")
    code, out, err = install(models, server.url("v1.tar.gz"), installed["sha"])
    assert code == 0, err
    assert "is damaged" in out
    assert live_target(models) == installed["link"]
    assert (models / NAME / "config.json").read_bytes() == installed["config"]
    assert run("check", "--name", NAME, "--models-dir", str(models), "--deep")[0] == 0


def test_not_installed_check(models: Path) -> None:
    code, out, _ = run("check", "--name", NAME, "--models-dir", str(models))
    assert code == 3 and "not installed" in out


# --------------------------------------------------------------------------- versions


def install_version(www: Path, server: FaultServer, models: Path, tag: str,
                    *extra: str) -> str:
    digest = make_tar(www / f"{tag}.tar.gz", model_members(tag))
    code, _, err = install(models, server.url(f"{tag}.tar.gz"), digest, *extra)
    assert code == 0, err
    return digest


def test_previous_version_is_kept_and_older_ones_pruned(www: Path, server: FaultServer,
                                                        models: Path) -> None:
    first = install_version(www, server, models, "a")
    second = install_version(www, server, models, "b")
    third = install_version(www, server, models, "c", "--keep", "1")
    names = sorted(p.name for p in (models / ".versions").iterdir())
    assert names == sorted([f"{NAME}-{second[:16]}", f"{NAME}-{third[:16]}"])
    assert f"{NAME}-{first[:16]}" not in names


def test_rollback_switches_to_the_previous_version(www: Path, server: FaultServer,
                                                   models: Path) -> None:
    first = install_version(www, server, models, "a")
    install_version(www, server, models, "b")
    code, out, _ = run("rollback", "--name", NAME, "--models-dir", str(models))
    assert code == 0
    assert f"rolled back from {NAME}-" in out
    assert live_target(models) == f".versions/{NAME}-{first[:16]}"
    listed = json.loads(run("versions", "--name", NAME, "--models-dir", str(models))[1])
    assert [v["live"] for v in listed] == [False, True]


def test_rollback_forward_again_reuses_the_copy_on_disk(www: Path, server: FaultServer,
                                                        models: Path) -> None:
    install_version(www, server, models, "a")
    second = install_version(www, server, models, "b")
    assert run("rollback", "--name", NAME, "--models-dir", str(models))[0] == 0
    before = len(server.requests)
    code, out, _ = install(models, server.url("b.tar.gz"), second)
    assert code == 0
    assert "switched to the verified copy already on disk" in out
    assert len(server.requests) == before


def test_rollback_without_an_earlier_version(installed, models: Path) -> None:
    code, _, err = run("rollback", "--name", NAME, "--models-dir", str(models))
    assert code == 1
    assert "no intact earlier version of tiny" in err and "raise keep" in err
    assert live_target(models) == installed["link"]


def test_rollback_skips_a_damaged_version(www: Path, server: FaultServer, models: Path) -> None:
    first = install_version(www, server, models, "a")
    install_version(www, server, models, "b")
    (models / ".versions" / f"{NAME}-{first[:16]}" / "config.json").write_text("broken")
    code, out, err = run("rollback", "--name", NAME, "--models-dir", str(models))
    assert code == 1
    assert "skipping" in out and "no intact earlier version" in err


# --------------------------------------------------------------------------- command line


def test_script_runs_with_the_system_python(installed, models: Path) -> None:
    """The host runs it as a plain script with python3 (standard library only)."""
    result = subprocess.run(
        local_command("fetch_model", "check", "--name", NAME, "--models-dir", str(models),
                      python="python3"),
        capture_output=True, text=True, check=False, env={"PATH": os.environ["PATH"]}, cwd="/",
    )
    assert result.returncode == 0, result.stderr
    assert "intact" in result.stdout


@pytest.mark.parametrize("module", program_files("fetch_model"))
def test_script_imports_only_the_standard_library(module: str) -> None:
    source = (ROOT_DIR / module).read_text()
    imported = {
        line.split()[1].split(".")[0]
        for line in source.splitlines()
        if line.startswith(("import ", "from ")) and not line.startswith("from __future__")
    }
    imported -= {"hostside"}  # its own siblings, uploaded with it (hostside.program_files)
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


# --------------------------------------------------------------------------- Hugging Face


COMMIT = "c1899de289a04d12100db370d81485cdf75e47ca"


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[HfMirror]:
    pytest.importorskip("huggingface_hub")
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (repo / "config.json").write_text('{"tag": "hf"}')
    (repo / "model.safetensors").write_bytes(os.urandom(300_000))
    (repo / "sub" / "tokenizer.json").write_text("{}")
    srv = HfMirror(repo, "org/tiny", COMMIT).start()
    yield srv
    srv.stop()


def install_hf(models: Path, mirror: HfMirror, stdin: str = "") -> tuple[int, str, str]:
    real = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        return run("install", "--name", NAME, "--models-dir", str(models), "--hf", "org/tiny",
                   "--revision", COMMIT, "--endpoint", mirror.endpoint,
                   *(["--token-stdin"] if stdin else []))
    finally:
        sys.stdin = real


def test_hf_repo_from_a_mirror(mirror: HfMirror, models: Path) -> None:
    code, _, err = install_hf(models, mirror)
    assert code == 0, err
    assert live_target(models) == f".versions/{NAME}-{COMMIT[:16]}"
    manifest = json.loads((models / NAME / MANIFEST).read_text())
    assert manifest["revision"] == COMMIT
    assert set(manifest["files"]) == {"config.json", "model.safetensors", "sub/tokenizer.json"}
    assert not (models / NAME / ".cache").exists()
    assert run("check", "--name", NAME, "--models-dir", str(models), "--deep")[0] == 0


def test_hf_rerun_asks_the_mirror_nothing(mirror: HfMirror, models: Path) -> None:
    assert install_hf(models, mirror)[0] == 0
    before = len(mirror.requests)
    code, out, _ = install_hf(models, mirror)
    assert code == 0 and "installed and intact" in out
    assert len(mirror.requests) == before


def test_hf_token_is_sent_from_stdin(mirror: HfMirror, models: Path) -> None:
    code, _, err = install_hf(models, mirror, stdin="hf_secret_123\n")
    assert code == 0, err
    assert "Bearer hf_secret_123" in mirror.auth


@pytest.mark.parametrize("path", ["model.safetensors", "config.json"])
def test_hf_corrupt_file_is_refused(installed, mirror: HfMirror, models: Path,
                                    path: str) -> None:
    mirror.lie[path] = b"x" * len((mirror.folder / path).read_bytes())
    code, _, err = install_hf(models, mirror)
    assert code == 1
    assert f"org/tiny@{COMMIT}: {path} does not match the hub's hash" in err
    assert "deleted and the next deploy fetches it again" in err
    resumable = f"{NAME}-{COMMIT[:16]}.hf"
    assert_untouched(models, installed["link"], installed["config"], resumable)
    assert not (models / ".staging" / resumable / path).exists()


# --------------------------------------------------------------------------- list, remove


def install_named(www: Path, server: FaultServer, models: Path, name: str, tag: str) -> str:
    digest = make_tar(www / f"{name}-{tag}.tar.gz", model_members(tag))
    code, _, err = run(
        "install", "--name", name, "--models-dir", str(models),
        "--url", server.url(f"{name}-{tag}.tar.gz"), "--sha256", digest,
        "--retry-wait", "0.2", "--progress-every", "0",
    )  # fmt: skip
    assert code == 0, err
    return digest


def test_list_names_every_model_with_its_versions_and_size(www: Path, server: FaultServer,
                                                           models: Path) -> None:
    install_named(www, server, models, "llama", "a")
    install_named(www, server, models, "llama", "b")
    live = install_named(www, server, models, "llama-70b", "c")
    code, out, _ = run("list", "--models-dir", str(models))
    assert code == 0
    listed = {m["name"]: m for m in json.loads(out)}
    assert sorted(listed) == ["llama", "llama-70b"]  # a shared prefix never mixes them
    assert listed["llama"]["versions"] == 2
    assert listed["llama-70b"]["live"] == f"llama-70b-{live[:16]}"
    assert listed["llama-70b"]["bytes"] > 300_000


def test_list_of_an_empty_or_missing_folder(tmp_path: Path) -> None:
    assert json.loads(run("list", "--models-dir", str(tmp_path / "none"))[1]) == []


def test_remove_deletes_one_model_and_leaves_its_neighbour(www: Path, server: FaultServer,
                                                         models: Path, tmp_path: Path) -> None:
    install_named(www, server, models, "llama", "a")
    install_named(www, server, models, "llama", "b")
    keep = install_named(www, server, models, "llama-70b", "c")
    (models / ".staging" / f"llama-{'0' * 16}.partial").write_bytes(b"half")
    units = tmp_path / "units"
    units.mkdir()
    code, out, err = run("remove", "--name", "llama", "--models-dir", str(models),
                         "--units-dir", str(units))
    assert code == 0, err
    assert "llama: removed 2 versions" in out
    assert not (models / "llama").is_symlink()
    assert [m["name"] for m in json.loads(run("list", "--models-dir", str(models))[1])] == [
        "llama-70b"
    ]
    assert os.readlink(models / "llama-70b") == f".versions/llama-70b-{keep[:16]}"
    assert not list((models / ".staging").glob("llama-0*"))


def test_remove_is_refused_while_a_unit_uses_the_model(www: Path, server: FaultServer,
                                                       models: Path, tmp_path: Path) -> None:
    install_named(www, server, models, "llama", "a")
    units = tmp_path / "units"
    units.mkdir()
    (units / "vllm-chat.service").write_text(f"ExecStart=/v/python -m x --model {models}/llama\n")
    (units / "vllm-big.service").write_text(f"ExecStart=/v/python --model {models}/llama-70b\n")
    code, _, err = run("remove", "--name", "llama", "--models-dir", str(models),
                       "--units-dir", str(units))
    assert code == 1
    assert "still used by vllm-chat.service:" in err and "vllm-big" not in err
    assert (models / "llama").is_symlink()
