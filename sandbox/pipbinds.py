"""pip configuration inherited from this machine, bound into each sandbox host.

The host's pip configuration (config files, find-links folders, ``file://`` indexes, constraint
files) is bound read-only at the same paths, the way real sites reach an internal mirror; the
pip cache read-write.

Example:
    >>> _local_path("file:///srv/wheels/simple/six/"), _local_path("https://pypi.org/simple")
    (PosixPath('/srv/wheels/simple/six'), None)
"""

from __future__ import annotations

import configparser
import logging
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

log = logging.getLogger(__name__)



def _pip_config_files() -> list[Path]:
    """The pip config files root's pip reads on this machine (global, then user)."""
    xdg_dirs = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")
    home = Path.home()
    xdg_home = Path(os.environ.get("XDG_CONFIG_HOME", home / ".config"))
    candidates = [Path(d) / "pip/pip.conf" for d in xdg_dirs if d]
    candidates += [Path("/etc/pip.conf"), home / ".pip/pip.conf", xdg_home / "pip/pip.conf"]
    return [p for p in dict.fromkeys(candidates) if p.is_file()]


def pip_binds(image: Path) -> list[tuple[Path, Path, bool]]:
    """(host path, container path, read-only) for the host's pip config and what it points at.

    Config files and the folders they reference (find-links, roots of ``file://`` indexes,
    constraint/requirement files) are bound at the same path. A file's folder is bound whole
    unless the image has that folder (binding would hide the image's files): then the file
    alone. The host's pip cache is bound read-write when present.

    Example:
        pip_binds(image.build_image())
        # → [(PosixPath('/etc/pip.conf'), PosixPath('/etc/pip.conf'), True),
        # →  (PosixPath('/etc/xdg/pip'), PosixPath('/etc/xdg/pip'), True), ...]
    """
    wanted: list[Path] = []

    def file_or_folder(path: Path) -> None:
        folder = path.parent
        in_image = (image / folder.relative_to("/")).exists()
        wanted.append(path if in_image or len(folder.parts) < 3 else folder)

    for conf in _pip_config_files():
        file_or_folder(conf)
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            parser.read(conf)
        except configparser.Error as exc:
            log.warning("ignoring unreadable pip config %s: %s", conf, exc)
            continue
        for section in parser.sections():
            for key, value in parser.items(section):
                key = key.replace("_", "-")
                for item in value.split():
                    path = _local_path(item)
                    if path is None or not path.exists():
                        continue
                    if key in ("index-url", "extra-index-url"):
                        root = path if path.is_dir() else path.parent
                        wanted.append(root.parent if root.name == "simple" else root)
                    elif key == "find-links":
                        wanted.append(path if path.is_dir() else path.parent)
                    elif key in ("constraint", "requirement"):
                        file_or_folder(path)
                    elif (
                        key in ("cert", "client-cert")
                        and not (image / path.relative_to("/")).exists()
                    ):
                        wanted.append(path)
    binds: list[tuple[Path, Path, bool]] = []
    for path in sorted(set(wanted)):
        if any(path.is_relative_to(b) for b, _, _ in binds):
            continue
        binds.append((path, path, True))
    cache = Path.home() / ".cache/pip"
    if cache.is_dir():
        binds.append((cache, Path("/root/.cache/pip"), False))
    return binds


def _local_path(item: str) -> Path | None:
    """An absolute local path from a pip config value (path or file:// URL), else None."""
    if item.startswith("file:"):
        path = unquote(urlparse(item).path)
    elif item.startswith("/"):
        path = item
    else:
        return None
    return Path(os.path.normpath(path))

