"""The unit-file reader of the render fuzzer (tests/support/renderparse.py) on the examples of
systemd's own manual pages (systemd.service "Command lines", systemd.exec ``Environment=``,
systemd.syntax), and on the shapes a broken render would take."""

from __future__ import annotations

import pytest

from tests.support.renderparse import (
    ParseError,
    environment,
    exec_commands,
    parse_unit,
    specifiers,
    variables,
)


def argvs(value: str) -> list[list[str]]:
    return [command.argv for command in exec_commands(value)]


# systemd.service(5), "Command lines" -------------------------------------------------------


def test_man_service_quoting_example() -> None:
    # 'ExecStart=/bin/echo one ; /bin/echo "two two"' runs two commands.
    assert argvs('/bin/echo one ; /bin/echo "two two"') == [
        ["/bin/echo", "one"], ["/bin/echo", "two two"]]


def test_man_service_semicolon_and_escaped_semicolon() -> None:
    # 'ExecStart=echo / >/dev/null & \; ls' : the arguments are "/", ">/dev/null", "&", ";", "ls".
    assert argvs("echo / >/dev/null & \\; ls") == [["echo", "/", ">/dev/null", "&", ";", "ls"]]


def test_man_service_single_quotes_and_escape() -> None:
    # ExecStart=/bin/echo $ONE $TWO "$TWO" ${TWO} : variables stay as written, reported.
    [command] = exec_commands('/bin/echo $ONE $TWO "$TWO" ${TWO}')
    assert command.argv == ["/bin/echo", "$ONE", "$TWO", "$TWO", "${TWO}"]
    assert command.variables == ["ONE", "TWO", "TWO", "TWO"]


def test_man_service_dollar_dollar_and_percent() -> None:
    [command] = exec_commands("/bin/sh -c 'echo $$HOME %%n'")
    assert command.argv == ["/bin/sh", "-c", "echo $HOME %n"]
    assert command.variables == [] and command.specifiers == []


def test_specifiers_are_reported() -> None:
    [command] = exec_commands("/bin/echo %n 100%")
    assert command.specifiers == ["%n", "%"]
    assert specifiers("%%%%") == ("%%", [])


def test_prefixes() -> None:
    commands = exec_commands("+/bin/a ; -/bin/b ; !!/bin/c ; @/bin/d argv0 ; :/bin/e $X")
    assert [c.prefixes for c in commands] == ["+", "-", "!!", "@", ":"]
    assert [c.argv[0] for c in commands] == ["/bin/a", "/bin/b", "/bin/c", "/bin/d", "/bin/e"]
    assert [c.privileged for c in commands] == [True, False, True, False, False]


def test_the_issue_head_address_is_three_commands_one_as_root() -> None:
    line = ("+/opt/vllm-fleet/venv/bin/python /x/wait_joined.py --head node-a --connect "
            "fe80::1%i --help ; +touch PWNED ; +echo :29500 --pid $MAINPID --timeout 600")
    commands = exec_commands(line)
    assert [c.argv[0] for c in commands] == ["/opt/vllm-fleet/venv/bin/python", "touch", "echo"]
    assert all(c.privileged for c in commands)
    assert commands[0].specifiers == ["%i"]


def test_semicolon_inside_a_word_or_quotes_is_no_separator() -> None:
    assert argvs('/bin/a "x ; y" b; \';\' c;d') == [["/bin/a", "x ; y", "b;", ";", "c;d"]]


def test_quotes_inside_a_word_and_escapes() -> None:
    assert argvs(r'/bin/a pre"fix x"post \x41\101\u00e9\t \"q\" "a\"b\\c" \s') == [
        ["/bin/a", "prefix xpost", "AAé\t", '"q"', 'a"b\\c', " "]]


@pytest.mark.parametrize("bad", ['/bin/a "open', "/bin/a \\q", "/bin/a \\x0", "/bin/a \\000",
                                 "/bin/a end\\"])
def test_what_systemd_refuses(bad: str) -> None:
    with pytest.raises(ParseError):
        exec_commands(bad)


def test_variables_rules() -> None:
    assert variables("$MAINPID") == ("$MAINPID", ["MAINPID"])
    assert variables("--pid=$MAINPID") == ("--pid=$MAINPID", [])
    assert variables("$$MAINPID") == ("$MAINPID", [])
    assert variables("${A}${B}") == ("${A}${B}", ["A", "B"])


# systemd.exec(5), Environment= --------------------------------------------------------------


def test_man_exec_environment_example() -> None:
    # Environment="VAR1=word1 word2" VAR2=word3 "VAR3=$word 5 6"
    found = environment('"VAR1=word1 word2" VAR2=word3 "VAR3=$word 5 6"')
    assert found.env == {"VAR1": "word1 word2", "VAR2": "word3", "VAR3": "$word 5 6"}
    assert found.invalid == [] and found.count == 3


def test_environment_extra_assignment_and_invalid_words() -> None:
    found = environment("RAY_ADDRESS=fe80::1%i VLLM_SERVER_DEV_MODE=1 junk 1X=2")
    assert found.env == {"RAY_ADDRESS": "fe80::1%i", "VLLM_SERVER_DEV_MODE": "1"}
    assert found.invalid == ["junk", "1X=2"] and found.specifiers == ["%i"]


def test_environment_quoted_escapes_and_percent() -> None:
    found = environment(r'"A=x \"y\" 50%%" B=c\sd')
    assert found.env == {"A": 'x "y" 50%', "B": "c d"}


# systemd.syntax(5): sections, comments, continuation -----------------------------------------


def test_unit_sections_comments_and_blanks() -> None:
    unit = parse_unit("# head\n\n[Unit]\nDescription = a b  \n; semi\n[Service]\n"
                      "ExecStart=/bin/a\nExecStart=\n")
    assert unit.sections == ["Unit", "Service"]
    assert unit.comments == ["# head", "; semi"]
    assert unit.directive_keys() == [("Unit", "Description"), ("Service", "ExecStart"),
                           ("Service", "ExecStart")]
    assert unit.values("Description") == ["a b"]
    assert unit.values("ExecStart", "Service") == ["/bin/a", ""]


def test_continuation_joins_lines_and_skips_comments() -> None:
    # systemd.syntax's example: a comment inside a continued directive is ignored.
    unit = parse_unit("[Section A]\nKeyOne=value 1 \\\n# comment\n  value 2\nKeyTwo=x\n")
    assert [(d.key, d.value, d.continued) for d in unit.directives] == [
        ("KeyOne", "value 1    value 2", True), ("KeyTwo", "x", False)]


def test_a_comment_ending_in_a_backslash_swallows_the_next_line() -> None:
    unit = parse_unit("[Unit]\n# name\\\nUser=root\nA=1\n")
    assert unit.values("User") == [] and unit.values("A") == ["1"]
    assert unit.comments == ["# name User=root"]


def test_two_backslashes_do_not_continue() -> None:
    unit = parse_unit("[S]\nA=x\\\\\nB=y\n")
    assert unit.values("A") == ["x\\\\"] and unit.values("B") == ["y"]


@pytest.mark.parametrize("bad", ["[Unit\nA=1\n", "A=1\n", "[S]\nno equals\n"])
def test_unit_errors(bad: str) -> None:
    with pytest.raises(ParseError):
        parse_unit(bad)
