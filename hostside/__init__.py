"""Programs that run on the fleet's hosts (Python standard library only; Python ≥ 3.10).

This package is their single owner: the deploys upload each program together with the package
modules it imports (:func:`program_files`) below ``/usr/local/lib/vllm-fleet/``: the program
and its siblings into ``hostside/`` (:func:`fleet.catalog.paths.remote_program`), the modules of
:mod:`loadgen`'s standard-library core it imports (the canary's TTFT, TPOT, percentiles and
prompts) into ``loadgen/`` beside it; each file only when its content differs. The control
machine imports the same modules in its tests.

**One way to run a program**, everywhere: by its file, ``python3 <dir>/hostside/<name>.py …``
(:func:`fleet.catalog.paths.program_command` builds that line for a host, :func:`local_command` for
this checkout). A program that imports its siblings starts with the one idiom below, which puts
the folder above ``hostside/`` first on ``sys.path`` when it runs as a file, so that
``from hostside import envfile`` (or ``from loadgen import stats``) finds the uploaded module on
a host and the checkout's here::

    if not __package__:  # run as a file: siblings import as the hostside package
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

A program that a fact runs before anything is uploaded (:mod:`hostside.openpgp`) imports no
sibling, so that its text alone runs with ``python3 -c`` (:func:`program_source`).

Example:
    >>> local_path("wait_healthy").name
    'wait_healthy.py'
    >>> program_files("check_ready")[1:]
    ['hostside/check_ready.py', 'hostside/envfile.py', 'hostside/tlsprobe.py']
    >>> program_files("openpgp")
    ['hostside/openpgp.py']
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
#: The folder that holds this package and the others a host program may import (the checkout,
#: site-packages; ``/usr/local/lib/vllm-fleet`` on a host).
ROOT_DIR = PACKAGE_DIR.parent
#: The packages whose modules a host program may import, uploaded with it: its own, and the
#: standard-library core of load generation (:mod:`loadgen`).
UPLOADED_PACKAGES = ("hostside", "loadgen")


def local_path(program: str) -> Path:
    """The file of a host-side program in this package (``fetch_model`` → …/fetch_model.py)."""
    path = PACKAGE_DIR / f"{program.replace('.', '/')}.py"
    if not path.is_file():
        raise ValueError(f"no host-side program {program!r} in {PACKAGE_DIR}")
    return path


def program_source(program: str) -> str:
    """The text of a host-side program, for running it with ``python3 -c`` before anything
    is uploaded (facts read before the deploy's first operation); it must import no sibling."""
    files = program_files(program)
    if files != [f"hostside/{program}.py"]:
        raise ValueError(f"{program} imports {files}: it cannot run as python3 -c text alone")
    return local_path(program).read_text(encoding="utf-8")


def local_command(program: str, *args: str, python: str = sys.executable) -> list[str]:
    """The command line that runs a program of this checkout as a host runs it (tests, benches).

    Example:
        >>> local_command("check_ready", "--port", "1", python="python3")[2:]
        ['--port', '1']
    """
    return [python, str(local_path(program)), *args]


def _imported_modules(path: Path) -> set[str]:
    """The modules of :data:`UPLOADED_PACKAGES` a file imports (``hostside.models.store`` …)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] in UPLOADED_PACKAGES}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
            node.module.split(".")[0] in UPLOADED_PACKAGES
        ):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if _module_file(candidate) else node.module)
    return found


def _module_file(module: str) -> Path | None:
    """The file of a dotted module (a package's ``__init__.py``), if there is one."""
    relative = Path(*module.split("."))
    for path in (ROOT_DIR / relative.with_suffix(".py"), ROOT_DIR / relative / "__init__.py"):
        if path.is_file():
            return path
    return None


def program_files(program: str) -> list[str]:
    """Every file a program needs on the host, relative to :data:`ROOT_DIR`: the program, the
    modules it imports (transitively) and the ``__init__.py`` of each package on the way.

    Example:
        >>> [f for f in program_files("canary") if f.startswith("loadgen/")][:2]
        ['loadgen/__init__.py', 'loadgen/prompts.py']
    """
    todo = [local_path(program)]
    needed: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in needed:
            continue
        needed.add(path)
        for module in _imported_modules(path):
            found = _module_file(module)
            if found is None:
                raise ValueError(f"{path.name} imports {module}, which is not in {ROOT_DIR}")
            parts = module.split(".")
            for depth in range(1, len(parts)):
                package = ROOT_DIR.joinpath(*parts[:depth], "__init__.py")
                if package.is_file():
                    todo.append(package)
            todo.append(found)
    return sorted(str(path.relative_to(ROOT_DIR)) for path in needed)
