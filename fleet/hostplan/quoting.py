"""One quoting function per target syntax: systemd command-line words (``ExecStart=``),
systemd setting values, free-text settings (``Description=``), ``Environment=`` assignments,
unit comments, sysctl.d lines, ssh_config values, YAML scalars; environment-file values go through
:func:`hostside.envfile.quote`, the writer whose reader the host-side programs share.

:mod:`fleet.hostplan.emit` wraps each in a type of its own, and the templates print nothing else.

Every value of the fleet file that reaches a rendered file goes through one of these, and each
refuses (ValueError) what its syntax cannot carry, even though :mod:`fleet.spec.fields` has refused
it already: a second wall, so that a value that slips past a check still cannot start a new
line, directive or option.

Example:
    >>> systemd_quote("a b")
    '"a b"'
"""

from __future__ import annotations

import re

import yaml

from fleet.spec.fields import SYSCTL_KEY, SYSCTL_VALUE, refuse_control

_SAFE = re.compile(r"[A-Za-z0-9_./:=,+@-]+")
_SSH_VALUE = re.compile(r"[A-Za-z0-9_./:@~+-]+")
#: What a systemd setting value (a path, unit name, number, device) may hold: no blank (it
#: would split a list setting), no quote or backslash (list settings unquote them).
_SETTING = re.compile(r"[A-Za-z0-9_./:=,+@%*-]+")
#: Characters that change a setting's meaning when they begin its value (``-/path``: ignore if
#: missing, ``~``: invert a filter, ``+``/``!``/``@``/``:``: command prefixes).
_SETTING_PREFIXES = "-+~!@:;"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def systemd_quote(word: str) -> str:
    """Quote one word for an ExecStart= line (systemd's rules, not the shell's).

    Example:
        >>> systemd_quote('{"a": 1}')
        '"{\\\\"a\\\\": 1}"'
        >>> systemd_quote("50%")
        '"50%%"'
        >>> systemd_quote("x\\nUser=root")
        Traceback (most recent call last):
        ...
        ValueError: a command-line word cannot hold U+000A (a line break) (at position 2): it would end the line it is written on; write it on one line
    """  # noqa: E501
    refuse_control(word.replace("\t", " "), "a command-line word")  # a tab is fine in quotes
    word = word.replace("%", "%%").replace("$", "$$")
    if _SAFE.fullmatch(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sysctl_line(key: str, value: int | str) -> str:
    """One ``key = value`` line of a sysctl.d drop-in.

    Example:
        >>> sysctl_line("net.core.somaxconn", 65535)
        'net.core.somaxconn = 65535'
        >>> sysctl_line("kernel.core_pattern", "|/tmp/x")
        Traceback (most recent call last):
        ...
        ValueError: sysctl value '|/tmp/x' of kernel.core_pattern: sysctl.d takes numbers or words of letters, digits and space . _ : , + - here
    """  # noqa: E501
    text = str(value)
    if not SYSCTL_KEY.fullmatch(key):
        raise ValueError(f"{key!r} is not a sysctl key")
    if not SYSCTL_VALUE.fullmatch(text):
        raise ValueError(
            f"sysctl value {text!r} of {key}: sysctl.d takes numbers or words of letters, digits "
            "and space . _ : , + - here"
        )
    return f"{key} = {text}"


def ssh_config_value(value: str | int) -> str:
    """One value of an ssh_config directive (a host name, user, port or path).

    ssh_config has no escape for a line break, and a space or quote would change how the line
    splits: such values are refused rather than quoted.

    Example:
        >>> ssh_config_value("10.0.0.1"), ssh_config_value(2222)
        ('10.0.0.1', '2222')
        >>> ssh_config_value("x\\nProxyCommand id")
        Traceback (most recent call last):
        ...
        ValueError: an ssh_config value cannot hold U+000A (a line break) (at position 2): it would end the line it is written on; write it on one line
    """  # noqa: E501
    text = refuse_control(str(value), "an ssh_config value")
    if not _SSH_VALUE.fullmatch(text):
        raise ValueError(f"{text!r} cannot be written into an ssh_config safely")
    return text


def setting_value(value: str | int) -> str:
    """One value of a unit setting that takes a path, unit name, number or device: refused when
    it holds a blank, quote or backslash, or begins with a character that changes the setting's
    meaning; ``%`` escaped (systemd expands specifiers in settings).

    Example:
        >>> setting_value("/var/lib/vllm-chat"), setting_value(65536), setting_value("50%")
        ('/var/lib/vllm-chat', '65536', '50%%')
        >>> setting_value("x y")
        Traceback (most recent call last):
        ...
        ValueError: 'x y' cannot be a systemd setting value: it may hold letters, digits and _ . / : = , + @ % * - only
    """  # noqa: E501
    text = refuse_control(str(value), "a systemd setting value")
    if not _SETTING.fullmatch(text):
        raise ValueError(
            f"{text!r} cannot be a systemd setting value: it may hold letters, digits and "
            "_ . / : = , + @ % * - only"
        )
    if text[0] in _SETTING_PREFIXES:
        raise ValueError(f"{text!r} cannot be a systemd setting value: it begins with {text[0]!r}")
    return text.replace("%", "%%")


def setting_text(text: str) -> str:
    """Free text on one line for a setting such as ``Description=`` (``%`` escaped; a line
    break, control character or trailing backslash, which would continue the line, refused).

    Example:
        >>> setting_text("Qwen 50% (fast)")
        'Qwen 50%% (fast)'
    """
    refuse_control(text, "a unit's text")
    if text.endswith("\\"):
        raise ValueError(f"{text!r}: a unit line cannot end with a backslash (it continues it)")
    return text.replace("%", "%%")


def environment_assignment(name: str, value: str) -> str:
    """One ``NAME=value`` operand of an ``Environment=`` line, quoted so that it stays one
    assignment: systemd splits that line at blanks into several, unquotes ``"…"``, reads ``\\``
    escapes and expands specifiers (not ``$``).

    Example:
        >>> environment_assignment("RAY_ADDRESS", "10.0.0.1:6379")
        'RAY_ADDRESS=10.0.0.1:6379'
        >>> environment_assignment("A", 'x y "z" 5%')
        '"A=x y \\\\"z\\\\" 5%%"'
    """
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not an environment variable name")
    refuse_control(value.replace("\t", " "), "an environment value")
    text = f"{name}={value}".replace("%", "%%")
    if _SAFE.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def comment_text(text: str) -> str:
    """Free text for a comment line (a unit's, a drop-in's, a shell profile's): one line, no
    control character, no trailing backslash (systemd would join the next line to the comment).

    Example:
        >>> comment_text("server chat: Qwen/Qwen3-8B on 0.0.0.0:8000")
        'server chat: Qwen/Qwen3-8B on 0.0.0.0:8000'
        >>> comment_text("x\\nExecStartPre=+/bin/id")
        Traceback (most recent call last):
        ...
        ValueError: a comment cannot hold U+000A (a line break) (at position 2): it would end the line it is written on; write it on one line
    """  # noqa: E501
    refuse_control(text, "a comment")
    if text.endswith("\\"):
        raise ValueError(f"{text!r}: a comment cannot end with a backslash (it continues the line)")
    return text


def yaml_scalar(value: str | int | float | bool) -> str:
    """One YAML scalar as ``yaml.safe_dump`` writes it on one line (quoted where YAML needs it).

    Example:
        >>> yaml_scalar("a: b"), yaml_scalar(9090), yaml_scalar("yes")
        ("'a: b'", '9090', "'yes'")
    """
    if not isinstance(value, str | int | float | bool):
        raise ValueError(f"a YAML scalar is text or a number, not {type(value).__name__}")
    if isinstance(value, str):
        refuse_control(value, "a YAML scalar")
    text = yaml.safe_dump({"k": value}, width=10**9, allow_unicode=True)
    if not text.startswith("k: ") or text.count("\n") != 1:
        raise ValueError(f"{value!r} does not fit on one YAML line")
    return text[3:-1]


def shell_word(text: str) -> str:
    """A word that means itself to the shell bare and inside double quotes (a path, a version):
    refused, not quoted, when it holds anything else.

    Example:
        >>> shell_word("/usr/local/cuda-12.8")
        '/usr/local/cuda-12.8'
    """
    if not re.fullmatch(r"[A-Za-z0-9_./+-]+", text) or text[0] == "-":
        raise ValueError(f"{text!r} cannot be written into a shell file safely")
    return text


def apt_word(text: str, option: bool = False) -> str:
    """One word of an apt source line or an apt_preferences field (a URL, a keyring path, a
    package name, a version pattern): refused, not quoted, when it holds what apt reads as a
    separator there — a blank, ``#`` (the rest of a source line is a comment), a control
    character, a leading ``[`` (a source line's options) or, inside those options
    (``option``), a ``]`` (which ends them).

    Example:
        >>> apt_word("https://[fd00::5]/cuda")
        'https://[fd00::5]/cuda'
        >>> apt_word("https://a.test/x#b")
        Traceback (most recent call last):
        ...
        ValueError: 'https://a.test/x#b' cannot be one word of an apt file: it holds '#'
    """
    refuse_control(text, "an apt file's word")
    if not text:
        raise ValueError("an apt file's word cannot be empty")
    found = next((c for c in text if c in " \t#" or (option and c == "]")), None)
    if found is None and text[0] == "[":
        found = "[ at its start"
    if found is not None:
        raise ValueError(f"{text!r} cannot be one word of an apt file: it holds {found!r}")
    return text
