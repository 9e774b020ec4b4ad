"""Templates print emitted values only, and each emitter writes a value its syntax reads back
exactly (issue 21, item 1: safe by construction).

The readers are systemd's rules (:mod:`tests.support.systemdwords`), the environment-file reader
the hosts use (:mod:`hostside.envfile`), PyYAML and :mod:`shlex`; the renders are the real call
sites (:func:`fleet.hostplan.render.host_plan`) over every correct fleet file of the tree.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import jinja2
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.hostplan import emit
from fleet.hostplan.monitoring import rendered_files
from fleet.hostplan.render import host_plan
from fleet.hostplan.stack import pin_text
from fleet.hostplan.templating import ENV, RawValueError, render
from fleet.load import load_fleet
from hostside import envfile
from tests.support import systemdwords

ROOT = Path(__file__).resolve().parents[3]
CORPUS = sorted([*ROOT.glob("inventory/*.yaml"), *ROOT.glob("inventory/examples/*.yaml"),
                 *ROOT.glob("tests/data/valid/*.yaml")])  # fmt: skip
TEMPLATES = sorted(path.name for path in (ROOT / "templates").glob("*.j2"))

#: What a hostile value holds: systemd's and the shell's special characters, non-ASCII.
HOSTILE = st.text(
    alphabet=st.one_of(
        st.sampled_from([*" ;+-!@%$\"'\\`{}[]#=:,|&<>*?~()^/.", "é", "你", "😀", "\u00a0"]),
        st.characters(min_codepoint=0x30, max_codepoint=0x7A),
    ),
    max_size=30,
)
PROFILE = settings(max_examples=300, derandomize=True, deadline=None, database=None)


# --------------------------------------------------------------------------------------------
# The environment refuses raw values
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", ["65536", 65536, 65536.0, ["65536"], None, ("a",), {"a": 1}],
                         ids=["str", "int", "float", "list", "None", "tuple", "dict"])
def test_a_raw_value_is_refused_naming_template_and_type(raw: object) -> None:
    with pytest.raises(RawValueError) as error:
        render("vllm-nofile.conf.j2", nofile=raw)
    message = str(error.value)
    assert "template vllm-nofile.conf.j2" in message
    assert f"a raw {type(raw).__name__}" in message
    assert "fleet.hostplan.emit" in message


@pytest.mark.parametrize("source", ['{{ "AF_INET AF_UNIX" }}', "{{ 1 + 2 }}", "{{ v.text }}",
                                    '{% with f="x" %}{{ f }}{% endwith %}', "{{ v ~ '' }}"])
def test_a_literal_or_computed_value_printed_by_a_template_is_refused_too(source: str) -> None:
    with pytest.raises(RawValueError):
        ENV.from_string(source).render(v=emit.setting("x"))


def test_a_missing_value_is_named_as_missing() -> None:
    with pytest.raises(jinja2.UndefinedError, match="'nofile' is undefined"):
        render("vllm-nofile.conf.j2")


def test_an_emitted_value_of_any_type_prints_as_its_text() -> None:
    assert ENV.from_string("{{ v }}|{{ w }}").render(
        v=emit.setting("a"), w=emit.comment("b c")) == "a|b c"


def test_no_filter_wraps_a_raw_value() -> None:
    """The one filter composes emitted settings; Jinja's own (join, string, …) are gone."""
    assert set(ENV.filters) == {"settings"}
    with pytest.raises(RawValueError):
        ENV.from_string("{{ v | settings }}").render(v=["a", "b"])
    with pytest.raises(jinja2.TemplateAssertionError):
        ENV.from_string("{{ v | join(' ') }}")
    got = ENV.from_string("{{ v | settings }}").render(v=[emit.setting("a"), emit.setting("b")])
    assert got == "a b"


@pytest.mark.parametrize("kind", [emit.Word, emit.Command, emit.Setting, emit.Text,
                                  emit.Assignment, emit.Comment, emit.EnvFile, emit.SysctlLine,
                                  emit.SshValue, emit.YamlScalar, emit.ShellWord])
def test_emitted_values_are_made_by_their_emitter_only(kind: type[emit.Emitted]) -> None:
    with pytest.raises(TypeError, match=f"made by fleet.hostplan.emit.{kind.made_by}"):
        kind("x")


def test_emitted_values_are_immutable() -> None:
    value = emit.word("x")
    with pytest.raises(AttributeError):
        value.text = "; +id"  # type: ignore[misc]


def test_a_unit_line_may_not_end_with_a_backslash() -> None:
    """systemd would join the next line to it (a directive swallowed into a comment)."""
    with pytest.raises(ValueError, match="backslash"):
        emit.comment("trailing \\")
    with pytest.raises(ValueError, match="backslash"):
        emit.text("trailing \\")


# --------------------------------------------------------------------------------------------
# Each emitter round-trips hostile values through its syntax's reader
# --------------------------------------------------------------------------------------------

@PROFILE
@given(st.lists(HOSTILE, max_size=6))
def test_command_words_read_back_as_one_command(words: list[str]) -> None:
    line = emit.command(["/opt/prog", *words]).text
    for prefix in ("", "+"):
        assert systemdwords.commands(prefix + line) == [
            systemdwords.Exec(prefix=prefix, argv=["/opt/prog", *words])]
    unit = f"[Service]\nExecStartPost=+{line}\nUser=x\n"
    assert [key for key, _ in systemdwords.lines(unit)] == ["[Service]", "ExecStartPost", "User"]


@pytest.mark.parametrize("hostile", [";", "+touch", "-x", "!id", "@sh", "%n", "$HOME", "${X}",
                                     "a ; +touch PWNED ; +echo", "\\;", "'", '"', "\\", "é 你"])
def test_a_word_never_separates_prefixes_or_expands(hostile: str) -> None:
    line = emit.command(["/opt/prog", "--x", hostile, "--pid", emit.MAINPID]).text
    assert systemdwords.commands("+" + line) == [systemdwords.Exec(
        prefix="+", argv=["/opt/prog", "--x", hostile, "--pid", "$MAINPID"])]


@pytest.mark.parametrize("first", ["+/bin/sh", "-/bin/sh", "sh", "", "@/bin/sh", "!/bin/sh"])
def test_a_command_begins_with_an_absolute_program(first: str) -> None:
    with pytest.raises(ValueError, match="absolute program path"):
        emit.command([first, "x"])


def test_a_command_needs_a_program() -> None:
    with pytest.raises(ValueError):
        emit.command([])


@PROFILE
@given(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), HOSTILE)
def test_an_assignment_reads_back_as_exactly_one_variable(name: str, value: str) -> None:
    text = emit.assignment(name, value).text
    assert systemdwords.environment(text) == {name: value}
    unit = f"[Service]\nEnvironment={text}\n"
    assert systemdwords.lines(unit)[1] == ("Environment", text)


def test_the_ray_address_of_a_hostile_zone_id_stays_one_assignment() -> None:
    value = "fe80::1%i VLLM_SERVER_DEV_MODE=1 :6379"
    text = emit.assignment("RAY_ADDRESS", value).text
    assert systemdwords.environment(text) == {"RAY_ADDRESS": value}


@PROFILE
@given(st.from_regex(r"[A-Za-z0-9_./:=,+@%*-]{1,30}", fullmatch=True))
def test_a_setting_reads_back_exactly(value: str) -> None:
    if value[0] in "-+~!@:;":
        with pytest.raises(ValueError, match="begins with"):
            emit.setting(value)
        return
    assert systemdwords.specifiers(emit.setting(value).text) == value


@pytest.mark.parametrize("bad", ["a b", "a\tb", "a\nUser=root", "", "-/x", "~@mount", "'q'",
                                 '"q"', "a\\b", "é"])
def test_a_setting_refuses_what_would_split_or_change_it(bad: str) -> None:
    with pytest.raises(ValueError):
        emit.setting(bad)
    with pytest.raises(ValueError):
        emit.setting_list(["ok", bad])


@PROFILE
@given(HOSTILE.map(str.strip).filter(lambda s: not s.endswith("\\")))
def test_free_text_and_comments_stay_on_their_line(value: str) -> None:
    unit = (f"# {emit.comment(value).text}\n[Unit]\nDescription={emit.text(value).text}\n"
            "After=x\n")
    got = systemdwords.lines(unit)
    assert [key for key, _ in got] == ["[Unit]", "Description", "After"]
    assert systemdwords.specifiers(got[1][1]) == value


@pytest.mark.parametrize("bad", ["a\nExecStartPre=+/bin/id", "a\rb", "a\x85b", "a\u2028b",
                                 "a\x00b", "a\x1b[2Jb"])
def test_a_comment_refuses_line_breaks_and_control_characters(bad: str) -> None:
    with pytest.raises(ValueError):
        emit.comment(bad)
    with pytest.raises(ValueError):
        emit.text(bad)


@PROFILE
@given(st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), HOSTILE,
                       max_size=4), HOSTILE.filter(lambda s: not s.endswith("\\")))
def test_an_env_file_reads_back_exactly(env: dict[str, str], note: str) -> None:
    text = emit.env_file(env, note=note).text
    assert envfile.loads(text) == env
    assert text.count("\n") == len(env) + 1


def test_a_sysctl_line_reads_back_and_refuses_a_pipe() -> None:
    assert emit.sysctl("net.ipv4.tcp_rmem", "4096 87380 6291456").text.split(" = ") == [
        "net.ipv4.tcp_rmem", "4096 87380 6291456"]
    with pytest.raises(ValueError):
        emit.sysctl("kernel.core_pattern", "|/bin/sh")


@pytest.mark.parametrize("bad", ["a b", "x\nProxyCommand id", '"q"', "a#b"])
def test_an_ssh_value_refuses_what_would_split_its_line(bad: str) -> None:
    assert emit.ssh_value("~/.ssh/id_ed25519").text == "~/.ssh/id_ed25519"
    with pytest.raises(ValueError):
        emit.ssh_value(bad)


@pytest.mark.parametrize("bad", ["/x y", "$(id)", "/a;b", "-x", "`id`", '/a"b', "/a*"])
def test_a_shell_word_means_itself_or_is_refused(bad: str) -> None:
    assert shlex.split(emit.shell_word("/usr/local/cuda-13.0").text) == ["/usr/local/cuda-13.0"]
    with pytest.raises(ValueError):
        emit.shell_word(bad)


@PROFILE
@given(st.one_of(HOSTILE, st.integers(), st.booleans(),
                 st.floats(allow_nan=False, allow_infinity=False)))
def test_a_yaml_scalar_reads_back_exactly(value: object) -> None:
    text = emit.yaml_scalar(value).text  # type: ignore[arg-type]
    assert "\n" not in text
    assert yaml.safe_load(f"k: {text}\nother: 1\n") == {"k": value, "other": 1}


# --------------------------------------------------------------------------------------------
# Every template, rendered by its real call site, prints through emitters only
# --------------------------------------------------------------------------------------------

def _all_rendered(monkeypatch: pytest.MonkeyPatch) -> tuple[set[str], list[tuple[str, str]]]:
    """Every template name the renders load, and every rendered (where, text) of the corpus."""
    loaded: set[str] = set()
    real = ENV.get_template

    def recording(name: str, *args: object, **kwargs: object) -> jinja2.Template:
        loaded.add(str(name))
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ENV, "get_template", recording)
    texts: list[tuple[str, str]] = []
    for path in CORPUS:
        fleet = load_fleet(path)
        for host in fleet.hosts:
            plan = host_plan(fleet, host, secrets=lambda ref: 'k3y "x" $y %n')
            where = f"{path.name}:{host}"
            for server in plan.servers:
                texts.append((f"{where}:{server.unit}", server.unit_text))
                if server.ray_head:
                    texts.append((f"{where}:{server.ray_head.unit}", server.ray_head.unit_text))
            texts += [(f"{where}:{r.unit}", r.unit_text) for r in plan.routers]
            texts += [(f"{where}:{p}", t) for p, t in rendered_files(plan.monitoring)
                      if p.endswith((".conf", ".service"))]
            stack = plan.stack
            texts.append((f"{where}:nofile", stack.nofile.text))
            if stack.governor:
                texts.append((f"{where}:governor", stack.governor.unit_text))
            if stack.nvidia:
                texts.append((f"{where}:persistenced", stack.nvidia.persistenced_text))
    return loaded, texts


def test_every_template_is_rendered_by_its_call_site_through_emitters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each template under templates/ is loaded by a real render over the corpus (ray,
    multi-node, endpoints, monitoring with alertmanager and GPU textfile, governor, CUDA): the
    renders succeed, so every value they print is emitted (finalize raises on anything else)."""
    loaded, texts = _all_rendered(monkeypatch)
    assert sorted(loaded) == TEMPLATES
    execs = 0
    for where, text in texts:
        for key, value in systemdwords.lines(text):
            if key.startswith("Exec") and value:
                found = systemdwords.commands(value)
                assert len(found) == 1, (where, key, value)
                assert found[0].prefix in ("", "+"), (where, key, value)
                assert found[0].argv[0].startswith("/"), (where, key, value)
                execs += 1
            elif key == "Environment":
                assert len(systemdwords.environment(value)) == 1, (where, value)
    assert execs > 100


@pytest.mark.parametrize(
    "value", ["a b", "https://a.test/x#frag", "[trusted=yes]", "tab\there", "nl\nx", ""]
)
def test_an_apt_word_refuses_what_apt_reads_as_a_separator(value: str) -> None:
    """A blank splits an apt source line, ``#`` comments out the rest, a leading ``[`` opens
    options (``[trusted=yes]`` would turn signature checks off)."""
    with pytest.raises(ValueError):
        emit.apt_word(value)


def test_inside_a_source_lines_options_a_bracket_ends_them() -> None:
    """``signed-by=/k] [trusted=yes`` would close the options early and add another."""
    assert emit.apt_word("/usr/share/keyrings/a.gpg", option=True).text.endswith(".gpg")
    with pytest.raises(ValueError):
        emit.apt_word("/k]", option=True)
    assert emit.apt_word("https://m.example/a]b[c").text == "https://m.example/a]b[c"


def test_the_apt_files_are_built_from_apt_words_and_read_back_as_written() -> None:
    """The source line is four fields to apt and the pin file three fields; each value is one
    word of them, exactly as given."""
    text = pin_text(["nvidia-driver-570", "nvidia-fabricmanager-570"], "570.172.08")
    fields = dict(line.split(": ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert fields == {"Package": "nvidia-driver-570 nvidia-fabricmanager-570",
                      "Pin": "version 570.172.08-*", "Pin-Priority": "1001"}
    with pytest.raises(ValueError):
        pin_text(["nvidia-driver-570\nPin: version *"], "570")
