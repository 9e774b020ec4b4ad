"""vllm-fleet installs as a package: a wheel built from the checkout gives a working ``fleet``.

The wheel is built from this checkout and installed (not editable) into a new venv, whose only
view of the tool is the wheel's files: the checkout's editable install is not on its path (the
venv borrows the dependencies' folder through a plain path line, which does not run their
``.pth`` hooks), and the commands run from a temporary directory. Templates, flag lists, the
host-side programs and the verify suite must therefore travel inside the wheel.
"""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          check=False)  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A venv holding the wheel of this checkout; its ``fleet`` and a folder to run it in."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    # Build from a clean copy of the tracked files, as a fresh clone would.
    files = run(["git", "ls-files", "-z"], ROOT).stdout.split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                 "--disable-pip-version-check", "-w", str(base / "dist"), str(source)], base,
                timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stderr
    wheel = next((base / "dist").glob("vllm_fleet-*.whl"))
    venv = base / "venv"
    assert run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base).returncode == 0
    venv_site = next((venv / "lib").glob("python3*/site-packages"))
    (venv_site / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    install = run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                   "install", "--no-deps", "--quiet", "--disable-pip-version-check", str(wheel)],
                  base, timeout=300)  # fmt: skip
    assert install.returncode == 0, install.stderr
    work = base / "elsewhere"
    work.mkdir()
    shutil.copy(ROOT / "inventory" / "sandbox.yaml", work / "fleet.yaml")
    shutil.copy(ROOT / "inventory" / "examples" / "quad-4090d.yaml", work / "quad.yaml")
    return {"fleet": venv / "bin" / "fleet", "python": venv / "bin" / "python", "work": work,
            "venv": venv}  # fmt: skip


def test_the_tool_comes_from_the_wheel_not_the_checkout(installed) -> None:
    code = "import cli, fleet, hostside, deploys, loadgen; print(cli.__file__, loadgen.__file__)"
    result = run([str(installed["python"]), "-c", code], installed["work"])
    assert result.returncode == 0, result.stderr
    for path in result.stdout.split():
        assert Path(path).is_relative_to(installed["venv"]), path


def test_check_works_outside_the_checkout(installed) -> None:
    result = run([str(installed["fleet"]), "check", "fleet.yaml", "quad.yaml"], installed["work"])
    assert result.returncode == 0, result.stderr
    assert "fleet.yaml: valid — 1 host, 1 server, 1 model" in result.stdout


def test_check_still_validates_flags_from_the_shipped_lists(installed) -> None:
    bad = installed["work"] / "bad.yaml"
    bad.write_text((installed["work"] / "fleet.yaml").read_text().replace(
        "max-num-seqs: 8", "max-num-seq: 8"))  # fmt: skip
    result = run([str(installed["fleet"]), "check", "bad.yaml"], installed["work"])
    assert result.returncode == 1
    assert "did you mean 'max-num-seqs'?" in result.stderr


def test_render_uses_the_shipped_templates(installed) -> None:
    result = run([str(installed["fleet"]), "render", "fleet.yaml"], installed["work"])
    assert result.returncode == 0, result.stderr
    assert "ExecStart=/opt/vllm-fleet/venv/bin/python -m vllm.entrypoints" in result.stdout
    assert "VLLM_CPU_KVCACHE_SPACE=1" in result.stdout


def test_plan_works(installed) -> None:
    result = run([str(installed["fleet"]), "plan", "quad.yaml", "--json"], installed["work"])
    assert result.returncode == 0, result.stderr
    assert {s["server"] for s in json.loads(result.stdout)["servers"]} >= {"vlm", "guard"}


def test_schema_works(installed) -> None:
    result = run([str(installed["fleet"]), "schema"], installed["work"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["title"]


@pytest.mark.parametrize(
    "command",
    ["check", "plan", "render", "sandbox", "modelserver", "verify", "complete", "bench", "drift",
     "models", "schema"],
)  # fmt: skip
def test_every_subcommand_starts(installed, command: str) -> None:
    result = run([str(installed["fleet"]), command, "--help"], installed["work"])
    assert result.returncode == 0, result.stderr
    assert f"fleet {command}" in result.stdout


@pytest.mark.parametrize("name", ["wait_healthy", "fetch_model", "check_ready", "validate_args"])
def test_host_programs_ship_in_the_wheel(installed, name: str) -> None:
    code = f"import hostside; print(hostside.local_path({name!r}))"
    result = run([str(installed["python"]), "-c", code], installed["work"])
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).is_relative_to(installed["venv"])


def test_the_canary_uploads_loadgen_from_the_wheel(installed) -> None:
    code = ("import hostside; print(*[hostside.ROOT_DIR / f for f in "
            "hostside.program_files('canary')])")
    result = run([str(installed["python"]), "-c", code], installed["work"])
    assert result.returncode == 0, result.stderr
    files = [Path(name) for name in result.stdout.split()]
    assert any(path.name == "timing.py" for path in files)
    assert all(path.is_file() and path.is_relative_to(installed["venv"]) for path in files)


def test_the_verify_suite_ships_in_the_wheel(installed) -> None:
    code = "from cli.main import VERIFY_SUITE as s; print(sorted(p.name for p in s.iterdir()))"
    result = run([str(installed["python"]), "-c", code], installed["work"])
    assert result.returncode == 0, result.stderr
    assert "conftest.py" in result.stdout and "test_server.py" in result.stdout
