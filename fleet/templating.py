"""The one Jinja environment for everything under templates/ (units, drop-ins, env files).

Example:
    >>> systemd_text("50% of %n")
    '50%% of %%n'
    >>> "LimitNOFILE=65536" in template("vllm-nofile.conf.j2").render(nofile=65536)
    True
"""

from __future__ import annotations

from pathlib import Path

import jinja2

#: Where the templates are: inside the package when installed from a wheel (pyproject.toml
#: ships the checkout's top-level templates/ as fleet/templates), the checkout's templates/
#: otherwise. Jinja takes the first folder that has a template.
TEMPLATE_DIRS = [
    Path(__file__).resolve().parent / "templates",
    Path(__file__).resolve().parent.parent / "templates",
]


def systemd_text(text: str) -> str:
    """Escape free text for a unit setting where systemd expands specifiers (``%``)."""
    return text.replace("%", "%%")


_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader([str(d) for d in TEMPLATE_DIRS if d.is_dir()]),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)
_env.filters["systemd_text"] = systemd_text


def template(name: str) -> jinja2.Template:
    """A template from templates/, strict about undefined values."""
    return _env.get_template(name)
