"""Model artifacts on a real sandbox host: the previous model keeps serving through every fault.

The session's shared vLLM host (tests/e2e/conftest.py) runs two real CPU vLLM servers, ``alpha``
(model tiny-a) and ``beta`` (model tiny-b), deployed once for the whole module (retiring the
servers of a module before, whose models are pruned); a loopback HTTP server in this
process (:mod:`faultserver`) serves the archives and misbehaves on demand. Each fault is a
real deploy of a changed fleet file for tiny-b: a wrong checksum, a truncated transfer, a
malicious archive and a full disk during unpacking all fail the deploy with a message saying
what happened and what to do, while beta's live link is unchanged, nothing partial is at the
live path and beta still answers a completion. A server that dies mid-download and comes back
is resumed (HTTP Range) and only beta restarts. Drift (a file changed on the host) is found by
``fleet models check`` (quick) and ``--deep``; ``fleet models rollback`` switches back and
restarts beta alone. The installer's own faults in detail: tests/test_fetch_model.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shlex
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from facts.models import ModelCheck
from fleet.catalog.paths import program_command, remote_program
from tests.support import e2e
from tests.support.e2e import ALPHA_PORT, BETA_PORT, changed_rows, deploy, on_host, output
from tests.support.faultserver import FaultServer

pytestmark = pytest.mark.e2e

HOST = e2e.VLLM_HOST
MODEL_PORT = 18766
MODELS = "/var/lib/vllm-fleet/models"
ARCHIVE = e2e.TESTMODEL / "tiny-llama.tar.gz"
V1_SHA = e2e.TESTMODEL_SHA

FLEET = """\
version: 1
defaults:
  vllm: {{version: "0.32.0", variant: cpu, cpu_kvcache_space_gib: 1}}
models:
  tiny-a: {{url: "http://127.0.0.1:{port}/tiny-llama.tar.gz", sha256: "{sha_a}"}}
  tiny-b:
    url: "http://127.0.0.1:{port}/{file_b}"
    sha256: "{sha_b}"
    keep: 1
    download: {{retries: 4, retry_wait: 1}}   # waits 1+2+4+8 s, not the default's 90 s
hosts:
  {host}:
    address: sandbox
    servers:
      alpha:
        model: tiny-a
        port: {alpha}
        args: {{max-model-len: 512, max-num-seqs: 4, enforce-eager: true}}
      beta:
        model: tiny-b
        port: {beta}
        args: {{max-model-len: 512, max-num-seqs: 4, enforce-eager: true}}
"""


def write_fleet(path: Path, file_b: str = "tiny-llama.tar.gz", sha_b: str = V1_SHA) -> Path:
    """The module's fleet file, with tiny-b pointing at ``file_b`` / ``sha_b``."""
    path.write_text(FLEET.format(port=MODEL_PORT, sha_a=V1_SHA, file_b=file_b, sha_b=sha_b,
                                 host=HOST, alpha=ALPHA_PORT, beta=BETA_PORT))
    return path


def repack(source: Path, target: Path, extra: dict[str, bytes]) -> str:
    """The test model's archive with extra members (a new, valid version); its sha256."""
    with tarfile.open(source, "r:gz") as old, tarfile.open(target, "w:gz") as new:
        top = None
        for member in old.getmembers():
            top = top or member.name.split("/")[0]
            new.addfile(member, old.extractfile(member) if member.isfile() else None)
        for name, data in extra.items():
            info = tarfile.TarInfo(name.replace("TOP", top or "."))
            info.size = len(data)
            info.mode = 0o644
            new.addfile(info, io.BytesIO(data))
    return hashlib.sha256(target.read_bytes()).hexdigest()


def fleet_cli(fleet: Path, *args: str) -> subprocess.CompletedProcess:
    """``fleet ARGS --fleet FLEET`` with the module's fleet file."""
    return e2e.fleet_cli(fleet, *args, "--fleet", str(fleet))


def drift(fleet: Path) -> subprocess.CompletedProcess:
    """``fleet drift FLEET --json``."""
    return e2e.fleet_cli(fleet, "drift", str(fleet), "--json")


def link(model: str) -> str:
    """Where a model's live link points on the host."""
    return on_host(f"readlink {MODELS}/{model}").stdout.strip()


def started(unit: str) -> str:
    """When the unit's current run began (changes on every restart)."""
    return on_host(f"systemctl show -p ActiveEnterTimestampMonotonic --value {unit}").stdout


def answers(port: int) -> bool:
    """Whether the server on ``port`` answers a real completion."""
    body = json.dumps({"model": "", "prompt": "Hello", "max_tokens": 4})
    script = (
        "import json, sys, urllib.request as u; "
        f"m = json.load(u.urlopen('http://127.0.0.1:{port}/v1/models', timeout=30))"
        "['data'][0]['id']; "
        f"b = json.loads({body!r}); b['model'] = m; "
        f"r = u.urlopen(u.Request('http://127.0.0.1:{port}/v1/completions', "
        "data=json.dumps(b).encode(), headers={'Content-Type': 'application/json'}), "
        "timeout=120); sys.exit(0 if json.load(r)['choices'][0]['text'] is not None else 1)"
    )
    return on_host(f"python3 -c {shlex.quote(script)}").returncode == 0


def staging_unpacked() -> list[str]:
    """Unpacking or download directories left in staging (there must be none)."""
    listing = on_host(f"ls -A {MODELS}/.staging").stdout.split()
    return [name for name in listing if name.endswith((".d", ".hf"))]


@pytest.fixture(scope="module")
def www(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Archives: the test model, two valid new versions, a malicious one, a disk filler."""
    folder = tmp_path_factory.mktemp("www")
    (folder / "tiny-llama.tar.gz").write_bytes(ARCHIVE.read_bytes())
    shas = {
        "v2": repack(ARCHIVE, folder / "v2.tar.gz", {"TOP/NOTES.md": b"version 2\n"}),
        "v3": repack(ARCHIVE, folder / "v3.tar.gz", {"TOP/NOTES.md": b"version 3\n"}),
        "evil": repack(ARCHIVE, folder / "evil.tar.gz", {"TOP/../../escape.txt": b"x"}),
        "filler": repack(ARCHIVE, folder / "filler.tar.gz", {"TOP/pad.bin": bytes(64 << 20)}),
    }
    (folder / "shas.json").write_text(json.dumps(shas))
    return folder


@pytest.fixture(scope="module")
def shas(www: Path) -> dict[str, str]:
    return json.loads((www / "shas.json").read_text())


@pytest.fixture(scope="module")
def server(www: Path) -> Iterator[FaultServer]:
    srv = FaultServer(www, port=MODEL_PORT).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def converged(vllm_host, server: FaultServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both servers deployed with version 1 of both models, alone on the shared host."""
    fleet = write_fleet(tmp_path_factory.mktemp("fleet") / "fleet.yaml")
    result = deploy(fleet)
    assert result.returncode == 0, output(result)[-6000:]
    e2e.prune_other_models(fleet)
    return fleet


@pytest.fixture
def fleet_dir(tmp_path: Path) -> Path:
    return tmp_path


def assert_beta_keeps_serving(link_before: str) -> None:
    """The fault left beta alone: same live version, nothing being unpacked, still serving."""
    assert link("tiny-b") == link_before
    assert staging_unpacked() == []
    assert on_host("systemctl is-active vllm-beta.service").stdout.strip() == "active"
    assert answers(BETA_PORT)


# --------------------------------------------------------------------------- converge


def test_both_servers_answer(converged) -> None:
    assert answers(ALPHA_PORT) and answers(BETA_PORT)


def test_live_links_point_at_verified_versions(converged) -> None:
    assert link("tiny-a") == f".versions/tiny-a-{V1_SHA[:16]}"
    report = json.loads(on_host(shlex.join(program_command(
        "fetch_model", "check", "--name", "tiny-b", "--models-dir", MODELS, "--deep", "--json",
    ))).stdout)
    assert report["ok"] and report["id"] == V1_SHA


def test_rerun_changes_nothing(converged) -> None:
    result = deploy(converged)
    text = output(result)
    assert result.returncode == 0, text[-4000:]
    assert changed_rows(text) == [], text[-3000:]


# --------------------------------------------------------------------------- faults


def test_wrong_checksum_keeps_serving(converged, fleet_dir: Path, shas) -> None:
    before = link("tiny-b")
    result = deploy(write_fleet(fleet_dir / "f.yaml", "v2.tar.gz", "0" * 64))
    assert result.returncode != 0
    assert f"expected sha256 {'0' * 64}, got {shas['v2']}" in output(result)
    assert "previous model keeps serving" in output(result)
    assert_beta_keeps_serving(before)


def test_truncated_transfer_keeps_serving(converged, fleet_dir: Path, server: FaultServer,
                                          shas) -> None:
    before = link("tiny-b")
    server.faults.cut_at, server.faults.cuts, server.faults.ignore_range = 100_000, 10, True
    try:
        result = deploy(write_fleet(fleet_dir / "f.yaml", "v3.tar.gz", shas["v3"]))
    finally:
        server.faults.cuts, server.faults.ignore_range = 0, False
    text = output(result)
    assert result.returncode != 0
    assert "is truncated: 97.66 KiB of" in text, text[-4000:]
    assert "arrived after 5 attempts" in text, text[-4000:]  # 1 + download.retries
    assert "the next deploy resumes from byte 100000" in text
    assert_beta_keeps_serving(before)
    on_host(f"rm -f {MODELS}/.staging/tiny-b-*.partial*")


def test_malicious_archive_keeps_serving(converged, fleet_dir: Path, shas) -> None:
    before = link("tiny-b")
    result = deploy(write_fleet(fleet_dir / "f.yaml", "evil.tar.gz", shas["evil"]))
    text = output(result)
    assert result.returncode != 0
    assert "escape.txt' points outside the model directory" in text, text[-4000:]
    assert on_host("ls /var/lib/vllm-fleet/escape.txt").returncode != 0
    assert_beta_keeps_serving(before)


def test_disk_full_while_unpacking_keeps_serving(converged, fleet_dir: Path, shas) -> None:
    before = link("tiny-b")
    staging = f"{MODELS}/.staging"
    mounted = on_host(f"mount -t tmpfs -o size=16m,mode=0700 tmpfs {staging}")
    assert mounted.returncode == 0, mounted.stderr
    try:
        result = deploy(write_fleet(fleet_dir / "f.yaml", "filler.tar.gz", shas["filler"]))
        assert staging_unpacked() == []
    finally:
        on_host(f"umount {staging}")
    text = output(result)
    assert result.returncode != 0
    assert "the disk filled up while unpacking tiny-b" in text, text[-4000:]
    assert "Free space (or lower keep), then deploy again" in text
    assert_beta_keeps_serving(before)


# --------------------------------------------------------------------------- resume, restarts


@pytest.fixture(scope="module")
def resumed(converged, server: FaultServer, www: Path, shas, tmp_path_factory) -> dict:
    """Deploy v2 of tiny-b while the server dies mid-download and comes back 3 s later."""
    units = {unit: started(unit) for unit in ("vllm-alpha.service", "vllm-beta.service")}
    size = (www / "v2.tar.gz").stat().st_size
    server.faults.cut_at, server.faults.cuts, server.faults.down_for = size // 2, 1, 3.0
    first = len(server.requests)
    fleet = write_fleet(tmp_path_factory.mktemp("v2") / "f.yaml", "v2.tar.gz", shas["v2"])
    result = deploy(fleet)
    return {"result": result, "before": units, "cut": size // 2, "fleet": fleet,
            "requests": server.requests[first:], "events": list(server.faults.events)}


def test_resumed_download_succeeds(resumed, shas) -> None:
    text = output(resumed["result"])
    assert resumed["result"].returncode == 0, text[-6000:]
    assert f"cut at {resumed['cut']}" in resumed["events"]
    asked = [(r["path"], r["range"]) for r in resumed["requests"]]
    assert ("/v2.tar.gz", f"bytes={resumed['cut']}-") in asked, asked
    assert "retrying in" in text
    assert link("tiny-b") == f".versions/tiny-b-{shas['v2'][:16]}"


def test_progress_is_shown_per_host(resumed) -> None:
    assert re.search(rf"\[{HOST}\].*tiny-b: .* \(100\.0%\) at .*/s, ETA", output(
        resumed["result"])), output(resumed["result"])[-4000:]


def test_only_the_changed_models_server_restarted(resumed) -> None:
    assert started("vllm-alpha.service") == resumed["before"]["vllm-alpha.service"]
    assert started("vllm-beta.service") != resumed["before"]["vllm-beta.service"]
    assert answers(BETA_PORT) and answers(ALPHA_PORT)


# --------------------------------------------------------------------------- drift, rollback


def test_quick_check_reports_a_changed_file(resumed) -> None:
    config = f"{MODELS}/tiny-a/config.json"
    on_host(f"cp -p {config} /root/config.bak && echo ' ' >> {config}")
    try:
        result = fleet_cli(resumed["fleet"], "models", "check", HOST)
    finally:
        on_host(f"mv /root/config.bak {config}")
    assert result.returncode == 2, output(result)
    assert "config.json: size" in result.stdout
    assert "deploy again" in result.stderr


def test_deep_check_reports_same_size_same_mtime_corruption(resumed) -> None:
    weights = f"{MODELS}/tiny-a/model.safetensors"
    flip = (
        "import os, sys; p = sys.argv[1]; st = os.stat(p); b = bytearray(open(p, 'rb').read()); "
        "b[4096] ^= 0xFF; open(p, 'wb').write(b); os.utime(p, ns=(st.st_atime_ns, "
        "st.st_mtime_ns))"
    )
    on_host(f"cp -p {weights} /root/weights.bak && python3 -c \"{flip}\" {weights}")
    try:
        quick = fleet_cli(resumed["fleet"], "models", "check", HOST, "tiny-a")
        deep = fleet_cli(resumed["fleet"], "models", "check", HOST, "tiny-a", "--deep")
    finally:
        on_host(f"mv /root/weights.bak {weights}")
    assert quick.returncode == 0, output(quick)
    assert deep.returncode == 2, output(deep)
    assert "model.safetensors: content differs from the manifest" in deep.stdout


def test_drift_fact_is_the_installers_check(resumed) -> None:
    """What `fleet drift --deep` can call: facts.models.ModelCheck, parsed from the host."""
    fact = ModelCheck()
    command = fact.command(remote_program("fetch_model"), "tiny-b", MODELS, True)
    report = fact.process(on_host(command.get_raw_value()).stdout.splitlines())
    assert report is not None and report["ok"] and report["deep"]


@pytest.fixture(scope="module")
def rolled_back(resumed) -> dict:
    before = {unit: started(unit) for unit in ("vllm-alpha.service", "vllm-beta.service")}
    result = fleet_cli(resumed["fleet"], "models", "rollback", HOST, "tiny-b")
    return {"result": result, "before": before}


def test_rollback_switches_back(rolled_back) -> None:
    result = rolled_back["result"]
    assert result.returncode == 0, output(result)
    assert "rolled back from tiny-b-" in result.stdout
    assert link("tiny-b") == f".versions/tiny-b-{V1_SHA[:16]}"


def test_rollback_restarts_only_that_models_servers(rolled_back) -> None:
    assert "restarted vllm-beta.service; it answers a completion" in rolled_back["result"].stdout
    assert started("vllm-alpha.service") == rolled_back["before"]["vllm-alpha.service"]
    assert started("vllm-beta.service") != rolled_back["before"]["vllm-beta.service"]
    assert answers(BETA_PORT)


def test_check_after_rollback_names_the_fleet_files_version(rolled_back, resumed, shas) -> None:
    result = fleet_cli(resumed["fleet"], "models", "check", HOST, "tiny-b")
    assert result.returncode == 2
    assert f"the fleet file names {shas['v2'][:16]}" in result.stdout


# Last in the module: it takes server beta and its model out of the fleet file.


def alpha_only(path: Path) -> Path:
    """The module's fleet file without server beta and model tiny-b."""
    text = write_fleet(path).read_text()
    lines = text.splitlines(keepends=True)
    beta = next(i for i, line in enumerate(lines) if line.strip() == "beta:")
    start = next(i for i, line in enumerate(lines) if line.strip() == "tiny-b:")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("    "))
    kept = lines[:start] + lines[end:beta]
    path.write_text("".join(kept))
    return path


def test_taking_a_server_and_its_model_out_of_the_fleet(converged, tmp_path: Path) -> None:
    """The deploy stops and removes server beta; its model stays on disk (never deleted by a
    deploy) until `fleet models prune --yes`; drift names both leftovers on the way."""
    fleet = alpha_only(tmp_path / "alpha-only.yaml")
    alpha_started = started("vllm-alpha.service")
    report = drift(fleet)
    rows = [r for r in json.loads(report.stdout)["rows"] if r["status"] == "drift"]
    assert {"unit vllm-beta.service", "model tiny-b"} <= {r["item"] for r in rows}, report.stdout

    result = deploy(fleet)
    assert result.returncode == 0, output(result)[-4000:]
    assert "server 'beta' is no longer in the fleet file" in output(result)
    assert on_host("systemctl cat vllm-beta.service").returncode != 0
    assert on_host("test -e /etc/vllm-fleet/beta.env").returncode != 0
    assert not answers(BETA_PORT)
    assert answers(ALPHA_PORT)
    assert started("vllm-alpha.service") == alpha_started, "alpha was restarted"
    assert link("tiny-b"), "a deploy must not delete model data"

    listed = fleet_cli(fleet, "models", "prune")
    assert listed.returncode == 0, output(listed)
    assert "tiny-b" in listed.stdout and "kept (dry run)" in listed.stdout
    assert "tiny-a" not in listed.stdout
    assert link("tiny-b")

    pruned = fleet_cli(fleet, "models", "prune", "--yes")
    assert pruned.returncode == 0, output(pruned)
    assert "removed" in pruned.stdout
    assert not link("tiny-b")
    assert on_host(f"ls {MODELS}/.versions | grep -c '^tiny-b-'").stdout.strip() == "0"
    assert link("tiny-a") and answers(ALPHA_PORT)

    again = fleet_cli(fleet, "models", "prune")
    assert "nothing to prune" in again.stdout
    clean = drift(fleet)
    leftovers = [r["item"] for r in json.loads(clean.stdout)["rows"]
                 if r["item"] in ("unit vllm-beta.service", "model tiny-b")]
    assert leftovers == []
