"""Loading fleet files: valid files load, each invalid file fails with its located problem.

Every file under ``tests/data/invalid`` starts with the problem it must produce::

    # expect: LINE DOTTED.PATH words that must appear in the message and hint

``(file)`` stands for the empty path of a problem with the whole file (YAML syntax, not a
mapping). The CLI tests run ``fleet check`` in-process through :func:`cli.main.main` (and once
as the installed console script); the fuzz test feeds it mutated valid files.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from cli import main as cli
from cli.main import main
from fleet.load import MAX_FILE_BYTES, FleetError, Problem, load_fleet, load_text
from fleet.planner.fit import utilization

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data"
VALID = sorted((DATA / "valid").glob("*.yaml"))
INVALID = sorted((DATA / "invalid").glob("*.yaml"))
INVENTORY = sorted((ROOT / "inventory").rglob("*.yaml"))
EXPECT = re.compile(r"^# expect: (?P<line>\d+) (?P<path>\S+) (?P<words>.+)$")


@dataclass(frozen=True)
class Expected:
    """The problem an invalid file must produce, from its ``# expect:`` line."""

    line: int
    path: str
    words: str


def first_line(path: Path) -> str:
    """The first line of a corpus file, in whatever encoding the file is written (some are
    UTF-16 or Latin-1 on purpose)."""
    raw = path.read_bytes()
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        text = raw.decode("utf-16")
    elif raw[1:2] == b"\0":
        text = raw.decode("utf-16-le")
    else:
        text = raw.decode("utf-8-sig", "replace")
    return text.splitlines()[0]


def expected(path: Path) -> Expected:
    """Parse the first line of an invalid file."""
    first = first_line(path)
    match = EXPECT.match(first)
    assert match, f"{path.name}: first line must be '# expect: LINE PATH words', got {first!r}"
    return Expected(int(match["line"]), match["path"], match["words"])


def dotted(problem: Problem) -> str:
    """A problem's path as written in ``# expect:`` lines."""
    return ".".join(str(part) for part in problem.path) or "(file)"


def text(problem: Problem) -> str:
    """What a person reads after the path: the message and the hint."""
    return problem.message + (f"; {problem.hint}" if problem.hint else "")


def problems_of(path: Path) -> list[Problem]:
    """The problems of a file that must not load."""
    with pytest.raises(FleetError) as info:
        load_fleet(path)
    return info.value.problems


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- the data folders themselves ---------------------------------------------------------------


def test_there_are_enough_valid_files():
    assert len(VALID) >= 4


def test_there_are_enough_invalid_files():
    assert len(INVALID) >= 30


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_file_states_its_expected_error(path):
    assert EXPECT.match(first_line(path))


# --- invalid files ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_file_raises_fleet_error(path):
    with pytest.raises(FleetError):
        load_fleet(path)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_file_reports_expected_problem(path):
    want = expected(path)
    found = problems_of(path)
    assert any(
        p.line == want.line and dotted(p) == want.path and want.words in text(p) for p in found
    ), f"expected {want}, got:\n" + "\n".join(str(p) for p in found)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_file_reports_exactly_one_problem(path):
    found = problems_of(path)
    assert len(found) == 1, "\n".join(str(p) for p in found)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_problem_text_starts_with_file_and_line(path):
    want = expected(path)
    found = problems_of(path)
    assert any(str(p).startswith(f"{path}:{want.line}:") for p in found), [str(p) for p in found]


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_fleet_error_text_lists_every_problem(path):
    with pytest.raises(FleetError) as info:
        load_fleet(path)
    assert str(info.value).splitlines() == [str(p) for p in info.value.problems]


# --- valid files -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", VALID + INVENTORY, ids=relative)
def test_valid_file_loads(path):
    fleet = load_fleet(path)
    assert fleet.version == 1


def test_workstation_server_args_keep_their_values():
    fleet = load_fleet(DATA / "valid" / "rtx4090-workstation.yaml")
    server = fleet.hosts["ws-4090"].servers["chat"]
    assert server.args == {
        "max-model-len": 2048,
        "gpu-memory-utilization": 0.92,
        "max-num-seqs": 256,
    }


def test_gpu0_sharers_sum_below_one():
    host = load_fleet(DATA / "valid" / "quad-4090d.yaml").hosts["quad-4090d"]
    total = sum(utilization(host, s) for s in host.servers.values() if s.gpus == [0])
    assert total < 1


def test_h200_server_spans_eight_gpus():
    server = load_fleet(DATA / "valid" / "h200-tp8.yaml").hosts["hgx-h200-01"].servers["deepseek"]
    assert (server.parallel_size, server.gpus) == (8, list(range(8)))


# --- defaults ----------------------------------------------------------------------------------

DEFAULTS_FLEET = """\
version: 1
defaults:
  gpus: {count: 1}
  os:
    nvidia: {driver: "570"}
    cuda: "12.8"
    python: "3.11"
    cpu_governor: performance
    sysctl: {vm.swappiness: 1, fs.file-max: 2097152}
  vllm: {version: "0.32.0", variant: cu129}
hosts:
  plain:
    address: 10.0.0.1
  custom:
    address: 10.0.0.2
    os:
      python: "3.12"
      sysctl: {vm.swappiness: 10}
"""


@pytest.fixture(scope="module")
def defaults_fleet():
    return load_text(DEFAULTS_FLEET, "defaults.yaml")


def test_host_without_overrides_gets_all_defaults(defaults_fleet):
    os_ = defaults_fleet.hosts["plain"].os
    assert (os_.cuda, os_.python, os_.cpu_governor.value) == ("12.8", "3.11", "performance")


def test_host_override_replaces_one_key_of_defaults(defaults_fleet):
    assert defaults_fleet.hosts["custom"].os.python == "3.12"


def test_host_override_keeps_other_keys_of_defaults(defaults_fleet):
    os_ = defaults_fleet.hosts["custom"].os
    assert (os_.cuda, os_.cpu_governor.value) == ("12.8", "performance")


def test_host_override_merges_nested_mappings(defaults_fleet):
    assert defaults_fleet.hosts["custom"].os.sysctl == {"vm.swappiness": 10, "fs.file-max": 2097152}


def test_host_override_does_not_leak_into_other_hosts(defaults_fleet):
    assert defaults_fleet.hosts["plain"].os.sysctl == {"vm.swappiness": 1, "fs.file-max": 2097152}


BROKEN_DEFAULT = """\
version: 1
defaults:
  os:
    cuda: "twelve"
  vllm: {version: "0.32.0", variant: cpu}
hosts:
  a: {address: 10.0.0.1}
  b: {address: 10.0.0.2}
"""


def test_error_in_defaults_is_located_at_the_defaults_line():
    with pytest.raises(FleetError) as info:
        load_text(BROKEN_DEFAULT, "d.yaml")
    [problem] = info.value.problems
    assert (problem.line, problem.path) == (4, ("defaults", "os", "cuda"))


def test_error_in_defaults_is_reported_once_for_two_hosts():
    with pytest.raises(FleetError) as info:
        load_text(BROKEN_DEFAULT, "d.yaml")
    assert len(info.value.problems) == 1


def test_error_in_host_override_is_located_at_the_host():
    broken = BROKEN_DEFAULT.replace('"twelve"', '"12.8"').replace(
        "b: {address: 10.0.0.2}", 'b: {address: 10.0.0.2, os: {cuda: "x"}}'
    )
    with pytest.raises(FleetError) as info:
        load_text(broken, "d.yaml")
    assert [(p.line, p.path) for p in info.value.problems] == [(8, ("hosts", "b", "os", "cuda"))]


def test_control_character_is_located():
    with pytest.raises(FleetError) as info:
        load_text("version: 1\nhosts:\n  a: \x00\n", "c.yaml")
    assert str(info.value).startswith("c.yaml:3:6: hosts.a: a control character (U+0000, NUL)")


# --- fleet check -------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def wide_consoles(monkeypatch):
    """In-process runs print as on a wide terminal."""
    monkeypatch.setattr(cli, "out", Console(highlight=False, width=1000))
    monkeypatch.setattr(cli, "err", Console(stderr=True, highlight=False, width=1000))


@pytest.mark.parametrize("path", VALID + INVENTORY, ids=relative)
def test_check_exits_0_on_valid_file(path, capsys):
    assert main(["check", str(path)]) == 0


def test_check_reports_valid_file_on_stdout(capsys):
    main(["check", str(DATA / "valid" / "rtx4090-workstation.yaml")])
    assert "valid — 1 host, 1 server, 1 model" in capsys.readouterr().out


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_check_exits_1_on_invalid_file(path, capsys):
    assert main(["check", str(path)]) == 1


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_check_prints_the_located_problem(path, capsys):
    main(["check", str(path)])
    assert f"{path}:{expected(path).line}:" in capsys.readouterr().err


def test_check_exits_1_when_any_of_several_files_is_invalid(capsys):
    assert main(["check", str(VALID[0]), str(INVALID[0])]) == 1


def test_check_still_checks_files_after_an_invalid_one(capsys):
    main(["check", str(INVALID[0]), str(VALID[0])])
    assert f"{VALID[0]}: valid" in capsys.readouterr().out


@pytest.fixture
def garbage(tmp_path):
    path = tmp_path / "garbage.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    return path


@pytest.fixture(params=["directory", "missing", "binary"])
def unreadable(request, tmp_path, garbage):
    """Things that are not fleet files at all."""
    return {
        "directory": tmp_path,
        "missing": tmp_path / "no-such-fleet.yaml",
        "binary": garbage,
    }[request.param]


def test_check_exits_1_on_unreadable_path(unreadable, capsys):
    assert main(["check", str(unreadable)]) == 1


def test_check_names_the_unreadable_path(unreadable, capsys):
    main(["check", str(unreadable)])
    assert f"{unreadable}: invalid" in capsys.readouterr().err


def test_check_prints_no_traceback_for_unreadable_path(unreadable, capsys):
    main(["check", str(unreadable)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err


FLEET_SCRIPT = Path(sys.executable).parent / "fleet"


@pytest.fixture(scope="module")
def script_runs(tmp_path_factory):
    """``fleet check`` as the installed console script: valid, invalid, missing, garbage."""
    tmp = tmp_path_factory.mktemp("script")
    garbage = tmp / "garbage.yaml"
    garbage.write_bytes(bytes(range(256)) * 4)
    cases = {
        "valid": VALID[0],
        "invalid": DATA / "invalid" / "unknown-key-host.yaml",
        "missing": tmp / "missing.yaml",
        "binary": garbage,
    }
    return {
        name: subprocess.run(
            [str(FLEET_SCRIPT), "check", str(path)],
            capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
        )
        for name, path in cases.items()
    }


@pytest.mark.parametrize(
    ("case", "code"), [("valid", 0), ("invalid", 1), ("missing", 1), ("binary", 1)]
)
def test_console_script_exit_code(script_runs, case, code):
    assert script_runs[case].returncode == code, script_runs[case].stderr


@pytest.mark.parametrize("case", ["valid", "invalid", "missing", "binary"])
def test_console_script_prints_no_traceback(script_runs, case):
    assert "Traceback" not in script_runs[case].stdout + script_runs[case].stderr


def test_console_script_prints_each_problem_on_one_line(script_runs):
    assert "unknown-key-host.yaml:9:5: hosts.box.gpu: unknown key; did you mean 'gpus'?" in (
        script_runs["invalid"].stderr
    )


# --- fuzz: mutated valid files never crash `fleet check` -------------------------------------

MUTANTS_PER_FILE = 200
TOKENS = [
    "", "~", "null", "-1", "0", "70000", "1e309", ".nan", "-.inf", "true", "yes", "0x1F",
    "0o17", "1.5", "[", "]", "{", "}", "'", '"', "&a", "*a", "*nowhere", "<<: *a", "!!binary x",
    "!!python/object/apply:os.system ['true']", "!custom 1", "2001-01-01", "12:30:00", "[1, 2]",
    "{a: 1}", "[[[]]]", "|", ">-", "%YAML 1.1", "? complex", "- item", "@", "`", "é", "日本",
    "\\x00", "\x00", "\x85", "\ufeff", "x" * 300, "9" * 400, "'unterminated", "a: b: c", "#",
    "---", "...", "%", "$HOME",
]


def mutate(source: str, rng: random.Random) -> str:
    """Apply one to three random edits to YAML text."""
    lines = source.split("\n")
    for _ in range(rng.randint(1, 3)):
        index = rng.randrange(len(lines))
        line = lines[index]
        kind = rng.choice(["delete", "duplicate", "swap", "indent", "value"])
        if kind == "delete":
            del lines[index]
            if not lines:
                lines = [""]
        elif kind == "duplicate":
            lines.insert(index, line)
        elif kind == "swap" and len(line) >= 2:
            at = rng.randrange(len(line) - 1)
            lines[index] = line[:at] + line[at + 1] + line[at] + line[at + 2 :]
        elif kind == "indent":
            change = rng.choice(["  ", " ", "\t", 1, 2, 4])
            if isinstance(change, str):
                lines[index] = change + line
            elif line[:change].isspace():
                lines[index] = line[change:]
        elif kind == "value" and ":" in line:
            key, _, _ = line.partition(":")
            lines[index] = f"{key}: {rng.choice(TOKENS)}"
    return "\n".join(lines)


FUZZ_CASES = [(path, number) for path in VALID for number in range(MUTANTS_PER_FILE)]


@pytest.mark.parametrize(
    ("path", "number"), FUZZ_CASES, ids=[f"{p.stem}-{n:03d}" for p, n in FUZZ_CASES]
)
def test_check_survives_mutated_file(path, number, tmp_path, capsys):
    rng = random.Random(f"{path.name}:{number}")
    mutant = tmp_path / path.name
    mutant.write_text(mutate(path.read_text(encoding="utf-8"), rng), encoding="utf-8")
    assert main(["check", str(mutant)]) in (0, 1)


@pytest.mark.parametrize(
    ("path", "number"), FUZZ_CASES, ids=[f"{p.stem}-{n:03d}" for p, n in FUZZ_CASES]
)
def test_mutated_file_problems_name_a_line(path, number):
    rng = random.Random(f"{path.name}:{number}")
    try:
        load_text(mutate(path.read_text(encoding="utf-8"), rng), "mutant.yaml")
    except FleetError as error:
        assert all(p.line is not None for p in error.problems), [str(p) for p in error.problems]


# --- bounds: size, devices, time ---------------------------------------------------------------


def test_file_over_the_size_limit_is_refused_at_line_1(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_bytes(b"# comment\n" * (MAX_FILE_BYTES // 10 + 1))
    [problem] = problems_of(path)
    assert (problem.line, problem.message) == (1, "the file is larger than 8192 KiB")


def test_text_over_the_size_limit_is_refused():
    with pytest.raises(FleetError) as info:
        load_text("#" * (MAX_FILE_BYTES + 1), "big.yaml")
    assert "larger than 8192 KiB" in str(info.value)


def test_check_on_a_device_reads_a_bounded_amount(capsys):
    assert main(["check", "/dev/zero"]) == 1
    assert "/dev/zero:1: (file): the file is larger than 8192 KiB" in capsys.readouterr().err


def test_config_from_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    text = (DATA / "invalid" / "config-dev-zero.yaml").read_text().replace("/dev/zero", str(fifo))
    with pytest.raises(FleetError) as info:
        load_text(text, str(tmp_path / "f.yaml"))
    assert f"{fifo} is not a regular file" in str(info.value)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_file_is_refused_within_a_second(path):
    """Within a second of this process's own CPU (no pathological work: a billion laughs, a
    read of /dev/zero), and without blocking (wall time bounded too, but generously: another
    process keeping a core busy must not fail it)."""
    start, cpu = time.monotonic(), time.process_time()
    problems_of(path)
    assert time.process_time() - cpu < 1.0
    assert time.monotonic() - start < 30


# --- warnings come back through the caller's list ---------------------------------------------


def test_load_fleet_appends_warnings_to_the_given_list():
    found: list = []
    load_fleet(DATA / "valid" / "quad-4090d.yaml", warnings=found)
    assert all(w.severity == "warning" for w in found)


def test_load_text_without_a_list_still_loads():
    assert load_text("version: 1\nhosts: {}\n").hosts == {}


# --- YAML forms that stay accepted --------------------------------------------------------------


def test_merge_key_copies_the_anchored_server():
    server = load_fleet(DATA / "valid" / "yaml-anchors.yaml").hosts["box-2"].servers["chat"]
    assert (server.model, server.port, server.args) == ("m", 8001, {"max-model-len": 2048})


def test_utf8_byte_order_mark_keeps_line_numbers():
    text = (DATA / "invalid" / "encoding-utf8-bom-error.yaml").read_bytes()
    assert text.startswith(b"\xef\xbb\xbf")
    assert [p.line for p in problems_of(DATA / "invalid" / "encoding-utf8-bom-error.yaml")] == [14]
