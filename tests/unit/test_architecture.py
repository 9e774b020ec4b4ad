"""The house's arrows, read from the source with ``ast`` (docs/architecture.md draws them).

Every import of every module of the tool's packages — top level or inside a function — is an
arrow. These tests fail when an arrow points where docs/architecture.md says it may not, when
two modules import each other through any path, or when a module hides an import inside a
function (the way circles were hidden before); matplotlib is the one allowed, commented,
exception.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import hostside

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [
    "fleet", "facts", "operations", "deploys", "hostside", "loadgen", "cli", "sandbox",
]
#: Which of the tool's packages each package may import (itself included).
ALLOWED = {
    "hostside": {"hostside", "loadgen"},
    "loadgen": {"loadgen"},
    "sandbox": {"sandbox"},
    "fleet": {"fleet", "hostside"},
    "facts": {"facts", "hostside"},
    "operations": {"operations", "facts", "fleet", "hostside"},
    "deploys": {"deploys", "operations", "facts", "fleet", "hostside"},
    "cli": {"cli", "facts", "fleet", "hostside", "loadgen", "sandbox"},
}
#: The rooms inside fleet/, in pipeline order (docs/architecture.md has the map), and which
#: rooms each may import (itself included). ``load`` is fleet/load.py, the one entry. Every
#: arrow points back along the pipeline; checks and hostplan are siblings after the planner and
#: never import each other (what both need lives in catalog or planner).
ROOMS = {
    "read": {"read"},
    "catalog": {"catalog"},
    "spec": {"spec", "read", "catalog"},
    "planner": {"planner", "read", "spec", "catalog"},
    "checks": {"checks", "read", "spec", "catalog", "planner"},
    "hostplan": {"hostplan", "read", "spec", "catalog", "planner"},
    "judge": {"judge", "catalog"},
    "load": {"read", "spec", "catalog", "planner", "checks", "hostplan"},
}
#: Third-party libraries a package must not import: the model never talks to hosts or people
#: (nor runs programs or opens connections: the sandbox lookup and SSH live at the edge, cli/).
FORBIDDEN_LIBRARIES = {
    "fleet": {
        "pyinfra", "rich", "testinfra", "aiohttp", "matplotlib",
        "subprocess", "http", "urllib", "paramiko", "asyncssh", "docker",
    },
}
#: The only third-party library load generation may import (its client and runner; the modules a
#: host program imports need only the standard library, see below).
LOADGEN_LIBRARIES = {"aiohttp"}
#: The only imports allowed inside a function: heavy, optional, and commented where they are.
LOCAL_IMPORTS_ALLOWED = {"matplotlib", "matplotlib.pyplot"}
#: What host-side programs run by the vLLM venv's python may import, inside the function that
#: needs it and behind an ImportError that says so (the distro's python3 has neither).
VENV_LIBRARIES = {"vllm", "huggingface_hub"}
#: Files that are not modules of the tool (the verify suite is pytest's, run by `fleet verify`).
SKIP = {"cli/verify_suite"}


def modules() -> dict[str, Path]:
    """Every module of the tool's packages by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if any(str(rel).startswith(skip) for skip in SKIP):
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = modules()


def imports(path: Path) -> Iterator[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import statement of a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    local: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            local |= {
                id(sub) for sub in ast.walk(node) if isinstance(sub, ast.Import | ast.ImportFrom)
            }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, id(node) in local
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                # `from cli import remote` imports the module cli.remote; `from x import name`
                # imports x.
                yield (full if full in MODULES else node.module), node.lineno, id(node) in local


def project_edges() -> dict[str, set[str]]:
    """module → the tool's modules it imports."""
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for target, _, _ in imports(path):
            if target in MODULES and target != name:
                edges[name].add(target)
    return edges


def test_every_package_is_found() -> None:
    assert {name.split(".")[0] for name in MODULES} == set(PACKAGES)
    assert len(MODULES) > 60


@pytest.mark.parametrize("name", sorted(MODULES))
def test_arrows_point_only_where_the_map_allows(name: str) -> None:
    package = name.split(".")[0]
    wrong = [
        f"{MODULES[name].relative_to(ROOT)}:{line} imports {target}"
        for target, line, _ in imports(MODULES[name])
        if target.split(".")[0] in [*PACKAGES, "tests"]
        and target.split(".")[0] not in ALLOWED[package]
    ]
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package])}: " + "; ".join(wrong)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_forbidden_library(name: str) -> None:
    package = name.split(".")[0]
    banned = FORBIDDEN_LIBRARIES.get(package, set())
    wrong = [target for target, _, _ in imports(MODULES[name]) if target.split(".")[0] in banned]
    assert not wrong, f"{name} imports {wrong}: {package}/ must not talk to hosts or people"


def room_of(name: str) -> str | None:
    """The room of a module of fleet/ (``fleet.checks.flags`` → ``checks``), or None."""
    parts = name.split(".")
    if parts[0] != "fleet" or len(parts) < 2:
        return None
    return parts[1]


def wrong_room_arrows(name: str, targets: list[str]) -> list[str]:
    """The imports of fleet module ``name`` that point into a room it may not import.

    Example:
        >>> wrong_room_arrows("fleet.checks.flags", ["fleet.read.problems", "fleet.hostplan.types"])
        ['fleet.hostplan.types']
    """
    room = room_of(name)
    if room is None:
        return []
    return [
        target for target in targets
        if room_of(target) is not None and room_of(target) not in ROOMS[room]
    ]  # fmt: skip


def test_every_module_of_fleet_is_in_a_room() -> None:
    rooms = {room_of(name) for name in MODULES if name.startswith("fleet.")}
    assert rooms == set(ROOMS), f"rooms on disk {sorted(rooms)} != the map's {sorted(ROOMS)}"


def test_checks_and_hostplan_never_import_each_other() -> None:
    assert "hostplan" not in ROOMS["checks"] and "checks" not in ROOMS["hostplan"]


def test_a_forbidden_inner_arrow_is_seen() -> None:
    assert wrong_room_arrows("fleet.read.source", ["fleet.spec.models"]) == ["fleet.spec.models"]
    assert wrong_room_arrows("fleet.checks.ledger", ["fleet.hostplan.types"])
    assert wrong_room_arrows("fleet.judge.health", ["fleet.planner.fit"])
    assert not wrong_room_arrows("fleet.checks.ledger", ["fleet.planner.fit", "hostside"])


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("fleet.")))
def test_arrows_inside_fleet_point_only_where_the_map_allows(name: str) -> None:
    targets = {target: line for target, line, _ in imports(MODULES[name])}
    wrong = wrong_room_arrows(name, list(targets))
    assert not wrong, f"fleet/{room_of(name)} may import only {sorted(ROOMS[room_of(name)])}: " + (
        "; ".join(f"{MODULES[name].relative_to(ROOT)}:{targets[t]} imports {t}" for t in wrong)
    )


def uploaded_modules() -> set[str]:
    """The modules of other packages that some host program imports: the deploy uploads them
    with it (:func:`hostside.program_files`), so a bare host's python3 must run them too."""
    found = set()
    for program in MODULES:
        if program.split(".")[0] == "hostside" and MODULES[program].name != "__init__.py":
            for file in hostside.program_files(program.removeprefix("hostside.")):
                name = file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                if name.split(".")[0] != "hostside":
                    found.add(name)
    return found


UPLOADED = uploaded_modules()
STANDALONE = sorted(
    n for n in MODULES if n.split(".")[0] in {"hostside", "sandbox"} or n in UPLOADED
)


def test_the_canary_uploads_the_shared_figures() -> None:
    assert {"loadgen", "loadgen.timing", "loadgen.stats", "loadgen.prompts"} <= UPLOADED


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.split(".")[0] == "loadgen"))
def test_load_generation_needs_only_aiohttp_beyond_the_standard_library(name: str) -> None:
    outside = [
        target for target, _, _ in imports(MODULES[name])
        if target.split(".")[0] not in sys.stdlib_module_names
        and target.split(".")[0] not in {"loadgen", "__future__", *LOADGEN_LIBRARIES}
    ]  # fmt: skip
    assert not outside, f"{name} imports {outside}: load generation needs only aiohttp"


@pytest.mark.parametrize("name", STANDALONE)
def test_host_programs_and_sandbox_use_only_the_standard_library(name: str) -> None:
    package = name.split(".")[0]
    outside = [
        target for target, _, _ in imports(MODULES[name])
        if target.split(".")[0] not in sys.stdlib_module_names
        and target.split(".")[0] not in {*ALLOWED[package], "__future__", *VENV_LIBRARIES}
    ]  # fmt: skip
    assert not outside, f"{name} imports {outside}: it must run on a bare host's python3"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_function_local_imports(name: str) -> None:
    hidden = [
        f"line {line}: {target}"
        for target, line, local in imports(MODULES[name])
        if local and target not in LOCAL_IMPORTS_ALLOWED
        and not (name.startswith("hostside") and target.split(".")[0] in VENV_LIBRARIES)
    ]
    assert not hidden, f"{name} imports inside a function ({hidden}); import at the top"


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the modules along it, or None.

    Example:
        >>> find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}})
        ['a', 'b', 'c', 'a']
        >>> find_cycle({"a": {"b"}, "b": set()}) is None
        True
    """
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_sees_a_circle() -> None:
    assert find_cycle({"x": {"y"}, "y": {"x"}}) == ["x", "y", "x"]


def test_no_import_circles() -> None:
    cycle = find_cycle(project_edges())
    assert cycle is None, "import circle: " + " → ".join(cycle or [])


def test_the_map_names_every_module_of_fleet() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [
        str(path.relative_to(ROOT)) for name, path in MODULES.items()
        if name.startswith("fleet.") and path.name != "__init__.py"
        and f"`{path.relative_to(ROOT)}`" not in text
    ]  # fmt: skip
    assert not missing, f"docs/architecture.md has no line for {missing}"


DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_paths_the_docs_name_inside_fleet_exist(doc: Path) -> None:
    named = set(re.findall(r"(?<![\w/.-])(fleet/[\w/]+\.(?:py|json|txt))", doc.read_text("utf-8")))
    placeholder = re.compile(r"[A-Z]+\.\w+$")  # vllm_flags/X.json: a file of that folder
    gone = sorted(p for p in named if not (ROOT / p).exists() and not placeholder.search(p))
    assert not gone, f"{doc.name} names paths that do not exist: {gone}"
