"""Emitted values: text already written in its target syntax, the only thing a template prints.

Each type below is made by one emitter function, which writes a raw value in one syntax through
:mod:`fleet.hostplan.quoting` (or :mod:`hostside.envfile`) and refuses what that syntax cannot
carry. The
Jinja environment (:mod:`fleet.hostplan.templating`) prints an :class:`Emitted` and raises on
anything
else (a plain ``str``, ``int``, list, ``None``), so a value cannot reach a rendered file unquoted
by forgetting: it has no way in but through its emitter.

=================  =====================================  ======================================
type               emitter                                syntax
=================  =====================================  ======================================
:class:`Command`   :func:`command`                        an ``ExecStart*=`` command line
:class:`Word`      :func:`word`                           one command-line word
:class:`Setting`   :func:`setting`, :func:`setting_list`  a unit setting's path/name/number
:class:`Text`      :func:`text`                           a free-text setting (``Description=``)
:class:`Assignment`  :func:`assignment`                   one ``Environment=`` assignment
:class:`Comment`   :func:`comment`                        the text of a comment line
:class:`EnvFile`   :func:`env_file`                       an ``EnvironmentFile=`` file
:class:`SysctlLine`  :func:`sysctl`                       a sysctl.d line
:class:`SshValue`  :func:`ssh_value`                      an ssh_config value
:class:`YamlScalar`  :func:`yaml_scalar`                  a Prometheus/Alertmanager YAML scalar
:class:`ShellWord`  :func:`shell_word`                    a word in a shell file
:class:`AptWord`   :func:`apt_word`                       a word of an apt source or pin file
=================  =====================================  ======================================

Example:
    >>> command(["/opt/venv/bin/python", "-m", "x", "--name", "a b; +id"])
    Command('/opt/venv/bin/python -m x --name "a b; +id"')
    >>> Word("rm -rf /")
    Traceback (most recent call last):
    ...
    TypeError: a Word is made by fleet.hostplan.emit.word() only
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar

from fleet.hostplan import quoting
from hostside import envfile

#: Held by the emitter functions only: an emitted value cannot be made from outside.
_KEY = object()


class Emitted:
    """Text written in one target syntax by its emitter (immutable; compared by type and text)."""

    __slots__ = ("text",)
    #: The emitter function that makes this type (for the messages).
    made_by: ClassVar[str] = ""
    text: str

    def __init__(self, text: str, _key: object = None) -> None:
        if _key is not _KEY:
            raise TypeError(
                f"a {type(self).__name__} is made by fleet.hostplan.emit.{self.made_by}() only"
            )
        object.__setattr__(self, "text", text)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a {type(self).__name__} cannot be changed")

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.text == self.text  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self), self.text))


class Word(Emitted):
    """One systemd command-line word (quoted, ``%`` and ``$`` doubled)."""

    made_by = "word"


class Command(Emitted):
    """A whole systemd command line: an absolute program path, then quoted words."""

    made_by = "command"


class Setting(Emitted):
    """A unit setting's value (path, unit name, number, device), or several joined by blanks."""

    made_by = "setting"


class Text(Emitted):
    """Free text on one line for a setting such as ``Description=`` (``%`` escaped)."""

    made_by = "text"


class Assignment(Emitted):
    """One ``NAME=value`` operand of an ``Environment=`` line."""

    made_by = "assignment"


class Comment(Emitted):
    """The text of a comment line: one line, nothing that ends or continues it."""

    made_by = "comment"


class EnvFile(Emitted):
    """The whole text of an environment file (:func:`hostside.envfile.dumps`)."""

    made_by = "env_file"


class SysctlLine(Emitted):
    """One ``key = value`` line of a sysctl.d drop-in."""

    made_by = "sysctl"


class SshValue(Emitted):
    """One ssh_config directive's value."""

    made_by = "ssh_value"


class YamlScalar(Emitted):
    """One YAML scalar on one line, as ``yaml.safe_dump`` writes it."""

    made_by = "yaml_scalar"


class ShellWord(Emitted):
    """A word that means itself to the shell, bare or inside double quotes."""

    made_by = "shell_word"


class AptWord(Emitted):
    """One word of an apt source line or apt_preferences field."""

    made_by = "apt_word"


#: systemd's ``$MAINPID``, the one variable reference a command line holds (a value's ``$`` is
#: doubled by :func:`word`, so no value can make one).
MAINPID = Word("$MAINPID", _KEY)


def word(value: str | int) -> Word:
    """One command-line word (:func:`fleet.hostplan.quoting.systemd_quote`).

    Example:
        >>> word(";"), word("+touch"), word("50%")
        (Word('";"'), Word('+touch'), Word('"50%%"'))
    """
    return Word(quoting.systemd_quote(str(value)), _KEY)


def command(words: Sequence[str | int | Word]) -> Command:
    """A command line from its words, the program first (an absolute path: the ``+``/``-``/``!``
    prefix that changes how systemd runs it is the template's, never a value's).

    Example:
        >>> command(["/bin/echo", "a", ";", "+id"]).text
        '/bin/echo a ";" +id'
        >>> command(["+/bin/sh"])
        Traceback (most recent call last):
        ...
        ValueError: a command line begins with an absolute program path, not '+/bin/sh'
    """
    if not words:
        raise ValueError("a command line needs a program")
    program = words[0] if isinstance(words[0], str) else None
    if program is None or not program.startswith("/"):
        raise ValueError(f"a command line begins with an absolute program path, not {words[0]!r}")
    parts = [w if isinstance(w, Word) else word(w) for w in words]
    return Command(" ".join(part.text for part in parts), _KEY)


def setting(value: str | int) -> Setting:
    """A unit setting's value (:func:`fleet.hostplan.quoting.setting_value`).

    Example:
        >>> setting("vllm-chat.service"), setting(65536)
        (Setting('vllm-chat.service'), Setting('65536'))
    """
    return Setting(quoting.setting_value(value), _KEY)


def setting_list(values: Iterable[str | int | Setting]) -> Setting:
    """Several setting values on one line, blank-separated (``CacheDirectory=a b``).

    Example:
        >>> setting_list(["vllm-chat", "vllm-chat/tmp"])
        Setting('vllm-chat vllm-chat/tmp')
    """
    parts = [v if isinstance(v, Setting) else setting(v) for v in values]
    if not parts:
        raise ValueError("an empty list would reset the setting")
    return Setting(" ".join(part.text for part in parts), _KEY)


def text(value: str) -> Text:
    """Free text for ``Description=`` (:func:`fleet.hostplan.quoting.setting_text`).

    Example:
        >>> text("vLLM server chat (50%)")
        Text('vLLM server chat (50%%)')
    """
    return Text(quoting.setting_text(value), _KEY)


def assignment(name: str, value: str | int) -> Assignment:
    """One ``Environment=`` assignment (:func:`fleet.hostplan.quoting.environment_assignment`).

    Example:
        >>> assignment("RAY_ADDRESS", "fe80::1%i X=1")
        Assignment('"RAY_ADDRESS=fe80::1%%i X=1"')
    """
    return Assignment(quoting.environment_assignment(name, str(value)), _KEY)


def comment(value: str | int) -> Comment:
    """The text of a comment (:func:`fleet.hostplan.quoting.comment_text`).

    Example:
        >>> comment("server chat, GPUs 0 1")
        Comment('server chat, GPUs 0 1')
    """
    return Comment(quoting.comment_text(str(value)), _KEY)


def env_file(env: Mapping[str, str], note: str | None = None) -> EnvFile:
    """An environment file (:func:`hostside.envfile.dumps`, whose reader the hosts share), its
    first line an optional comment.

    Example:
        >>> env_file({"A": "x y"}, note="made here").text
        '# made here\\nA="x y"\\n'
    """
    return EnvFile(
        envfile.dumps(env, comment=None if note is None else quoting.comment_text(note)), _KEY
    )


def sysctl(key: str, value: int | str) -> SysctlLine:
    """One sysctl.d line (:func:`fleet.hostplan.quoting.sysctl_line`).

    Example:
        >>> sysctl("vm.swappiness", 10)
        SysctlLine('vm.swappiness = 10')
    """
    return SysctlLine(quoting.sysctl_line(key, value), _KEY)


def ssh_value(value: str | int) -> SshValue:
    """One ssh_config value (:func:`fleet.hostplan.quoting.ssh_config_value`).

    Example:
        >>> ssh_value(2222)
        SshValue('2222')
    """
    return SshValue(quoting.ssh_config_value(value), _KEY)


def yaml_scalar(value: str | int | float | bool) -> YamlScalar:
    """One YAML scalar (:func:`fleet.hostplan.quoting.yaml_scalar`).

    Example:
        >>> yaml_scalar("up == 0")
        YamlScalar('up == 0')
    """
    return YamlScalar(quoting.yaml_scalar(value), _KEY)


def shell_word(value: str) -> ShellWord:
    """A word for a shell file (:func:`fleet.hostplan.quoting.shell_word`).

    Example:
        >>> shell_word("/usr/local/cuda-12.8")
        ShellWord('/usr/local/cuda-12.8')
    """
    return ShellWord(quoting.shell_word(value), _KEY)


def apt_word(value: str, option: bool = False) -> AptWord:
    """A word for an apt source or pin file (:func:`fleet.hostplan.quoting.apt_word`;
    ``option``: inside a source line's ``[…]``).

    Example:
        >>> apt_word("nvidia-driver-570")
        AptWord('nvidia-driver-570')
    """
    return AptWord(quoting.apt_word(value, option), _KEY)
