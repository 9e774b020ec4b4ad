"""The one Jinja environment for everything under templates/ (units, drop-ins, profiles).

It prints emitted values only (:mod:`fleet.hostplan.emit`): its ``finalize`` raises
:class:`RawValueError`, naming the template and the value's type, for anything else that a
``{{ … }}`` would print — a plain ``str``, ``int``, ``float``, list or ``None``, even a literal
written in the template — so that no value reaches a host file without going through the
quoting of its syntax. The only filter composes emitted values (``settings``: several
:class:`fleet.hostplan.emit.Setting` on one line); none wraps a raw one.

Example:
    >>> from fleet.hostplan import emit
    >>> "LimitNOFILE=65536" in render("vllm-nofile.conf.j2", nofile=emit.setting(65536))
    True
    >>> try:
    ...     render("vllm-nofile.conf.j2", nofile=65536)
    ... except RawValueError as error:
    ...     print(error)
    template vllm-nofile.conf.j2 prints a raw int: every printed value must be made by a fleet.hostplan.emit emitter (emit.word, emit.setting, emit.comment, …) for its syntax
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import jinja2

from fleet.hostplan.emit import Emitted, Setting, setting_list

#: Where the templates are: inside the package when installed from a wheel (pyproject.toml
#: ships the checkout's top-level templates/ as fleet/templates), the checkout's templates/
#: otherwise. Jinja takes the first folder that has a template.
TEMPLATE_DIRS = [
    Path(__file__).resolve().parents[1] / "templates",
    Path(__file__).resolve().parents[2] / "templates",
]


class RawValueError(TypeError):
    """A template printed something that is not an emitted value."""


@jinja2.pass_context
def _finalize(context: jinja2.runtime.Context, value: object) -> str:
    """The text of an emitted value; :class:`RawValueError` for anything else."""
    if isinstance(value, Emitted):
        return value.text
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()  # names the missing variable (StrictUndefined)
    raise RawValueError(
        f"template {context.name} prints a raw {type(value).__name__}: every printed value "
        "must be made by a fleet.hostplan.emit emitter (emit.word, emit.setting, emit.comment, …) "
        "for its syntax"
    )


def _settings(values: Iterable[Setting]) -> Setting:
    """Jinja filter: emitted settings on one line (``{{ dirs | settings }}``); raw ones refused."""
    values = list(values)
    for value in values:
        if not isinstance(value, Setting):
            raise RawValueError(f"the settings filter joins emitted settings, not a raw "
                                f"{type(value).__name__}")
    return setting_list(values)


#: The environment: strict about undefined values, and about raw ones (``finalize``).
ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader([str(d) for d in TEMPLATE_DIRS if d.is_dir()]),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
    finalize=_finalize,
)
ENV.filters = {"settings": _settings}


def template(name: str) -> jinja2.Template:
    """A template from templates/, strict about undefined values and raw ones."""
    return ENV.get_template(name)


def render(name: str, **values: object) -> str:
    """The text of template ``name`` with ``values`` (emitted values, or what holds them).

    A line that ends with a backslash (systemd would join the next line to it) is refused too.
    """
    text = template(name).render(**values)
    for number, line in enumerate(text.splitlines(), 1):
        if line.endswith("\\"):
            raise ValueError(f"template {name} line {number} ends with a backslash: {line!r}")
    return text
