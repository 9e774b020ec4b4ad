"""Running the host programs (``hostside/``) in tests as a host runs them: by their file, with
the system ``python3``, from another directory, in a bare environment.

Example:
    run_program("request", stdin='{"url": "http://127.0.0.1:1", "path": "/health", '
                '"env_file": "/nonexistent"}').returncode   # → 1 (nothing answered)
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hostside import envfile, local_command

#: The API key of the probe tests' servers (``tests/unit/hostside``).
PROBE_KEY = "sk-probe-1"


def run_program(program: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """Run ``hostside/PROGRAM.py`` with ``args`` (and ``stdin``); its result, never raising on
    a non-zero exit."""
    return subprocess.run(
        local_command(program, *args, python="python3"), input=stdin, capture_output=True,
        text=True, check=False, cwd="/", env={"PATH": os.environ["PATH"]}, timeout=60,
    )  # fmt: skip


def key_env_file(folder: Path, key: str = PROBE_KEY) -> str:
    """An environment file holding ``VLLM_API_KEY=key`` as the deploy writes it; its path."""
    path = folder / "s.env"
    path.write_text(envfile.dumps({"VLLM_API_KEY": key}, comment="c"))
    return str(path)
