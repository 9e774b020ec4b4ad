"""The version store: layout, manifests, the atomic switch, checks, rollback, prune, remove.

Layout under the models directory::

    NAME -> .versions/NAME-<id16>    the live path servers use: a symbolic link
    .versions/NAME-<id16>/           one verified version: its files and .fleet-manifest.json
    .staging/                        (0700) downloads in progress, unpacking, upload drop-off

``<id16>`` is the first 16 hex digits of the archive's (or single file's) SHA256, or of the
Hugging Face commit. A version goes live only once it is complete and verified, in one
rename; ``keep`` older versions stay for rollback. :func:`install` is the one shape every source
shares: reuse an intact copy already on disk, else fetch into staging and make it live.

Example:
    >>> Layout(Path("/m"), "tiny").version("ab" * 20).name
    'tiny-abababababababab'
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from hostside.models import common
from hostside.models.common import NAME_PATTERN, FetchError, human_bytes, say
from hostside.models.transport import hash_file

MANIFEST = ".fleet-manifest.json"
MANIFEST_FORMAT = 2


class Layout:
    """Paths of one model under the models directory."""

    def __init__(self, models_dir: Path, name: str) -> None:
        self.models_dir = models_dir
        self.name = name
        self.live = models_dir / name
        self.versions = models_dir / ".versions"
        self.staging = models_dir / ".staging"

    def version(self, ident: str) -> Path:
        """The directory of one version."""
        return self.versions / f"{self.name}-{ident[:16]}"

    def prepare(self) -> None:
        """Create the directories with their modes (staging is private to root)."""
        for folder, mode in ((self.models_dir, 0o755), (self.versions, 0o755),
                             (self.staging, 0o700)):
            folder.mkdir(mode=mode, parents=True, exist_ok=True)
            os.chmod(folder, mode)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One installer per model at a time."""
        with open(self.staging / f"{self.name}.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(f"{self.name}: another installer is running for this model; waiting")
                fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def current(self) -> Path | None:
        """The version the live link points to, if it is one of ours."""
        if not self.live.is_symlink():
            return None
        target = Path(os.path.realpath(self.live))
        return target if target.parent == Path(os.path.realpath(self.versions)) else None

    def all_versions(self) -> list[tuple[Path, dict[str, Any]]]:
        """Installed versions with a manifest, newest first."""
        found = []
        for path in self.versions.glob(f"{self.name}-*"):
            if path.is_symlink() or not path.is_dir():
                continue
            manifest = read_manifest(path)
            if manifest is not None and manifest.get("name") == self.name:
                found.append((path, manifest))
        found.sort(key=lambda item: item[1].get("installed_at", 0), reverse=True)
        return found


def read_manifest(version: Path) -> dict[str, Any] | None:
    """The manifest of a version directory, None if missing or unreadable."""
    try:
        return json.loads((version / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest last, atomically: a version without one is not a version."""
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.chmod(tmp, 0o644)
    os.replace(tmp, root / MANIFEST)


def switch(live: Path, version: Path) -> None:
    """Point ``live`` at ``version`` in one atomic rename."""
    if live.exists() and not live.is_symlink():
        aside = live.with_name(f".versions/{live.name}-unmanaged-{int(time.time())}")
        say(f"{live} was not a managed link; moved it to {aside}")
        live.rename(aside)
    temporary = live.with_name(f".{live.name}.new")
    if temporary.is_symlink() or temporary.exists():
        temporary.unlink()
    os.symlink(os.path.relpath(version, live.parent), temporary)
    os.replace(temporary, live)
    common.fsync_dir(live.parent)


_RENAME_EXCHANGE = 2


def place(staged: Path, version: Path) -> None:
    """Move a staged version into place; a damaged copy there is swapped out atomically."""
    if not version.exists():
        staged.rename(version)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    at_fdcwd = -100
    if renameat2 is not None and renameat2(
        at_fdcwd, os.fsencode(staged), at_fdcwd, os.fsencode(version), _RENAME_EXCHANGE
    ) == 0:
        shutil.rmtree(staged)  # now the damaged copy
        return
    old = version.with_name(version.name + f".damaged-{os.getpid()}")
    version.rename(old)
    staged.rename(version)
    shutil.rmtree(old, ignore_errors=True)


def prune(layout: Layout, keep: int) -> list[str]:
    """Remove versions beyond the live one and ``keep`` older ones; return what went."""
    current = layout.current()
    kept = 0
    removed = []
    for path, _ in layout.all_versions():
        if current is not None and path == current:
            continue
        if kept < keep:
            kept += 1
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    return removed


# --------------------------------------------------------------------------- checks


def check_version(version: Path, deep: bool = False) -> list[dict[str, str]]:
    """Problems of one installed version against its manifest (empty: it is intact).

    Quick: every file's presence, type, size and modification time, every link's target,
    nothing added. Deep: also every file's SHA256 (reads everything).
    """
    manifest = read_manifest(version)
    if manifest is None:
        return [{"path": MANIFEST, "problem": "the manifest is missing or unreadable"}]
    problems = []
    files: dict[str, dict[str, Any]] = manifest.get("files", {})
    links: dict[str, str] = manifest.get("links", {})
    for relative, meta in sorted(files.items()):
        path = version / relative
        try:
            st = os.lstat(path)
        except OSError:
            problems.append({"path": relative, "problem": "missing"})
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.append({"path": relative, "problem": "not a regular file any more"})
            continue
        if st.st_size != meta.get("size"):
            problems.append(
                {"path": relative, "problem": f"size {st.st_size}, expected {meta.get('size')}"}
            )
            continue
        if "mtime_ns" in meta and st.st_mtime_ns != meta["mtime_ns"]:
            problems.append({"path": relative, "problem": "modified after install (mtime)"})
            continue
        if deep:
            digest = hashlib.sha256()
            hash_file(path, [digest])
            if digest.hexdigest() != meta.get("sha256"):
                problems.append(
                    {"path": relative, "problem": "content differs from the manifest (sha256)"}
                )
    for relative, target in sorted(links.items()):
        try:
            actual = os.readlink(version / relative)
        except OSError:
            problems.append({"path": relative, "problem": "link missing"})
            continue
        if actual != target:
            problems.append({"path": relative, "problem": f"link points to {actual!r}"})
    known = set(files) | set(links) | {MANIFEST}
    for dirpath, dirnames, filenames in os.walk(version):
        base = os.path.relpath(dirpath, version)
        for entry in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            relative = entry if base == "." else f"{base}/{entry}"
            if relative not in known:
                problems.append({"path": relative, "problem": "not part of the model (added)"})
    return problems


def check(layout: Layout, deep: bool = False) -> dict[str, Any]:
    """The state of a model's live path: installed version, manifest summary, problems."""
    report: dict[str, Any] = {
        "name": layout.name,
        "path": str(layout.live),
        "installed": False,
        "ok": False,
        "deep": deep,
        "problems": [],
    }
    if not layout.live.is_symlink():
        if layout.live.exists():
            report["problems"].append({"path": ".", "problem": "not a managed link"})
        return report
    version = Path(os.path.realpath(layout.live))
    manifest = read_manifest(version)
    if manifest is None:
        report["problems"].append({"path": MANIFEST, "problem": "missing or unreadable"})
        return report
    report.update(
        installed=True,
        version=version.name,
        id=manifest.get("id"),
        sha256=manifest.get("sha256"),
        revision=manifest.get("revision"),
        source=manifest.get("source"),
        files=len(manifest.get("files", {})),
        bytes=sum(int(f.get("size", 0)) for f in manifest.get("files", {}).values()),
    )
    report["problems"] = check_version(version, deep)
    report["ok"] = not report["problems"]
    return report


def versions(layout: Layout) -> list[dict[str, Any]]:
    """Installed versions of a model, newest first, with the live one marked."""
    current = layout.current()
    return [
        {
            "version": path.name,
            "id": manifest.get("id"),
            "installed_at": manifest.get("installed_at"),
            "live": path == current,
            "source": manifest.get("source"),
        }
        for path, manifest in layout.all_versions()
    ]


def rollback(layout: Layout, to: str | None = None) -> str:
    """Switch the live link back to the previous (or the given) intact version."""
    current = layout.current()
    candidates = [(p, m) for p, m in layout.all_versions() if p != current]
    if to:
        candidates = [(p, m) for p, m in candidates if str(m.get("id", "")).startswith(to)]
    elif current is not None:
        now = (read_manifest(current) or {}).get("installed_at", float("inf"))
        older = [(p, m) for p, m in candidates if m.get("installed_at", 0) < now]
        candidates = older or candidates
    for path, _manifest in candidates:
        problems = check_version(path)
        if problems:
            say(f"{layout.name}: skipping {path.name}: {problems[0]['path']} "
                f"{problems[0]['problem']}")
            continue
        switch(layout.live, path)
        before = current.name if current is not None else "nothing"
        return f"{layout.name}: rolled back from {before} to {path.name}"
    wanted = f" matching {to!r}" if to else ""
    raise FetchError(
        f"no intact earlier version{wanted} of {layout.name} to roll back to (versions: "
        f"{', '.join(p.name for p, _ in layout.all_versions()) or 'none'}); raise keep in the "
        "fleet file to keep more"
    )




def reuse(layout: Layout, ident: str, keep: int, deep: bool = False) -> str | None:
    """Switch to an intact copy of this version already on disk; None if there is none."""
    version = layout.version(ident)
    manifest = read_manifest(version)
    if manifest is None or manifest.get("id") != ident:
        return None
    problems = check_version(version, deep)
    if problems:
        say(
            f"{layout.name}: the copy on disk of {version.name} is damaged ({problems[0]['path']}: "
            f"{problems[0]['problem']}, {len(problems)} problem(s)); installing it again"
        )
        return None
    if layout.current() == Path(os.path.realpath(version)):
        prune(layout, keep)
        return f"{layout.name}: {version.name} is installed and intact"
    switch(layout.live, version)
    prune(layout, keep)
    return f"{layout.name}: switched to the verified copy already on disk ({version.name})"


def finish_install(
    layout: Layout, staged: Path, ident: str, keep: int, manifest: dict[str, Any]
) -> str:
    """Write the manifest, move the version into place, switch the live link, prune."""
    manifest.update(format=MANIFEST_FORMAT, name=layout.name, id=ident,
                    installed_at=time.time())
    write_manifest(staged, manifest)
    version = layout.version(ident)
    place(staged, version)
    common.fsync_dir(layout.versions)
    previous = layout.current()
    switch(layout.live, version)
    removed = prune(layout, keep)
    files = manifest["files"]
    total = sum(int(f.get("size", 0)) for f in files.values())
    summary = (
        f"{layout.name}: installed {version.name} ({len(files)} files, {human_bytes(total)})"
    )
    if previous is not None and previous != version:
        summary += f"; previous {previous.name} kept for rollback"
    if removed:
        summary += f"; removed {', '.join(removed)}"
    return summary


class Staged(NamedTuple):
    """A verified version in staging, ready to go live.

    + root: the folder that becomes the version (inside ``work``, or ``work`` itself)
    + manifest: its source, digest, size, files and links
    + work: the staging folder to remove afterwards, whatever happens
    """

    root: Path
    manifest: dict[str, Any]
    work: Path


def install(
    layout: Layout,
    ident: str,
    keep: int,
    fetch: Callable[[], Staged],
    *,
    deep: bool = False,
    reused: Callable[[], None] = lambda: None,
) -> str:
    """The one install every source shares: reuse, or fetch and make live; return a summary.

    An intact copy of version ``ident`` already on disk is switched to (``reused`` runs then,
    e.g. to drop an upload); otherwise ``fetch`` puts a verified version into staging and
    :func:`finish_install` writes its manifest, moves it into place, switches and prunes.
    """
    found = reuse(layout, ident, keep, deep)
    if found:
        reused()
        return found
    staged = fetch()
    try:
        return finish_install(layout, staged.root, ident, keep, staged.manifest)
    finally:
        shutil.rmtree(staged.work, ignore_errors=True)


# --------------------------------------------------------------------------- list, remove


def _tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (links not followed)."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total


def installed(models_dir: Path) -> list[dict[str, Any]]:
    """Every model with a version under ``models_dir``: name, live version, versions, bytes.

    A model is named by its versions' manifests, so names that share a prefix
    (``llama``, ``llama-70b``) never mix.
    """
    versions_dir = models_dir / ".versions"
    by_name: dict[str, list[Path]] = {}
    if versions_dir.is_dir():
        for path in sorted(versions_dir.iterdir()):
            if path.is_symlink() or not path.is_dir():
                continue
            name = (read_manifest(path) or {}).get("name")
            if isinstance(name, str) and re.fullmatch(NAME_PATTERN, name):
                by_name.setdefault(name, []).append(path)
    result = []
    for name, paths in sorted(by_name.items()):
        current = Layout(models_dir, name).current()
        result.append({
            "name": name,
            "live": current.name if current is not None else None,
            "versions": len(paths),
            "bytes": sum(_tree_bytes(p) for p in paths),
        })
    return result


def users_of(layout: Layout, units_dir: Path) -> list[str]:
    """The vLLM units under ``units_dir`` whose text names this model's live path."""
    needle = str(layout.live)
    users = []
    for unit in sorted(units_dir.glob("vllm-*.service")):
        with contextlib.suppress(OSError):
            text = unit.read_text(errors="replace")
            if re.search(re.escape(needle) + r"(?![A-Za-z0-9._-])", text):
                users.append(unit.name)
    return users


def remove(layout: Layout, units_dir: Path) -> str:
    """Remove a model: its live link, every version and any unfinished download of it.

    Refused while a vLLM unit still names it: remove or change that server first.
    """
    users = users_of(layout, units_dir)
    if users:
        raise FetchError(f"still used by {', '.join(users)}: take the server out of the fleet "
                         "file and deploy (which removes its unit) before removing the model")
    paths = [p for p, _ in layout.all_versions()]
    total = sum(_tree_bytes(p) for p in paths)
    if layout.live.is_symlink():
        layout.live.unlink()
    for path in paths:
        shutil.rmtree(path)
    staged = re.compile(re.escape(layout.name) + r"-[0-9a-f]{16}\..*")
    if layout.staging.is_dir():
        for entry in layout.staging.iterdir():
            if staged.fullmatch(entry.name) or entry.name == f"{layout.name}.lock":
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
    if not paths:
        return f"{layout.name}: not installed; nothing to remove"
    return (f"{layout.name}: removed {len(paths)} version{'s' if len(paths) != 1 else ''} "
            f"({human_bytes(total)})")


