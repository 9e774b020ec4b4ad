"""Download a model archive, verify its SHA256 in the same pass, and install it atomically.

Runs on the host (standard library only). The live path ``MODELS/NAME`` is a symbolic link to
``MODELS/.versions/NAME-<sha16>``; it is switched in one rename only after the archive verified
and extracted completely, so a truncated download, a wrong checksum or a failed extraction never
touches the model that is being served. The previous version is kept for rollback.

Example:
    python3 fetch_model.py --name tiny --url http://127.0.0.1:8765/tiny.tar.gz \\
        --sha256 <64 hex> --models-dir /var/lib/vllm-fleet/models
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath

CHUNK = 1 << 20
MANIFEST = ".fleet-manifest.json"


class FetchError(Exception):
    """A failure a person can act on; the previous model is untouched."""


def download(url: str, dest: Path, expected: str) -> int:
    """Stream ``url`` into ``dest`` while hashing; return the size. Raise on any mismatch."""
    digest = hashlib.sha256()
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=60) as reply, dest.open("wb") as out:
            length = reply.headers.get("Content-Length")
            while chunk := reply.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
    except (urllib.error.URLError, OSError) as err:
        raise FetchError(f"download of {url} failed after {size} bytes: {err}") from None
    if length is not None and int(length) != size:
        raise FetchError(
            f"download of {url} is truncated: {size} of {length} bytes arrived; "
            "the previous model is still in place — check the network or proxy and deploy again"
        )
    actual = digest.hexdigest()
    if actual != expected:
        raise FetchError(
            f"checksum mismatch for {url}: expected sha256 {expected}, got {actual} "
            f"({size} bytes); the archive is corrupt, truncated or not the one the fleet file "
            "names — the previous model is still in place"
        )
    return size


def _safe_name(member: tarfile.TarInfo) -> PurePosixPath:
    path = PurePosixPath(member.name)
    if path.is_absolute() or ".." in path.parts:
        raise FetchError(f"archive member {member.name!r} points outside the model directory")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise FetchError(f"archive member {member.name!r} is a device, FIFO or other special file")
    if member.issym() or member.islnk():
        target = PurePosixPath(member.linkname)
        base = path.parent if member.issym() else PurePosixPath()
        joined = PurePosixPath(os.path.normpath(str(base / target)))
        if target.is_absolute() or joined.parts[:1] == ("..",):
            raise FetchError(
                f"archive link {member.name!r} → {member.linkname!r} escapes the model"
            )
    return path


def extract(archive: Path, dest: Path) -> dict[str, dict[str, object]]:
    """Extract safely into ``dest`` (one top-level folder is stripped); return the manifest files.

    Files are hashed while they are written; modes become 0644 (files) and 0755 (folders).
    """
    files: dict[str, dict[str, object]] = {}
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        names = [_safe_name(m) for m in members]
        tops = {n.parts[0] for n in names if n.parts and n.parts[0] != "."}
        strip = len(tops) == 1 and all(
            m.isdir() or len(n.parts) > 1 for m, n in zip(members, names, strict=True)
        )
        dest.mkdir(mode=0o755)
        for member, name in zip(members, names, strict=True):
            parts = [p for p in name.parts if p != "."]
            if strip:
                parts = parts[1:]
            if not parts:
                continue
            target = dest.joinpath(*parts)
            relative = "/".join(parts)
            if member.isdir():
                target.mkdir(mode=0o755, parents=True, exist_ok=True)
                continue
            target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            if member.issym():
                os.symlink(member.linkname, target)
                continue
            if member.islnk():
                link = [p for p in PurePosixPath(member.linkname).parts if p != "."]
                source = dest.joinpath(*(link[1:] if strip else link))
                shutil.copyfile(source, target)
                os.chmod(target, 0o644)
                files[relative] = dict(files.get("/".join(link[1:] if strip else link), {}))
                continue
            digest = hashlib.sha256()
            source_file = tar.extractfile(member)
            assert source_file is not None
            with source_file, open(target, "wb") as out:
                while chunk := source_file.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            os.chmod(target, 0o644)
            files[relative] = {"size": member.size, "sha256": digest.hexdigest()}
    for root, dirs, _ in os.walk(dest):
        for folder in dirs:
            os.chmod(os.path.join(root, folder), 0o755)
    os.chmod(dest, 0o755)
    return files


def switch(live: Path, version: Path) -> None:
    """Point ``live`` at ``version`` in one atomic rename."""
    if live.exists() and not live.is_symlink():
        live.rename(live.with_name(f".versions/{live.name}-unmanaged-{int(time.time())}"))
    temporary = live.with_name(f".{live.name}.new")
    if temporary.is_symlink() or temporary.exists():
        temporary.unlink()
    os.symlink(os.path.relpath(version, live.parent), temporary)
    os.replace(temporary, live)


def prune(versions: Path, name: str, keep: set[Path], count: int) -> None:
    """Remove old versions of ``name`` beyond the ``count`` most recent, never those in keep."""
    mine = sorted(
        (p for p in versions.glob(f"{name}-*") if p.is_dir() and not p.is_symlink()),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in mine[count:]:
        if old not in keep:
            shutil.rmtree(old, ignore_errors=True)


def install(name: str, url: str, sha256: str, models_dir: Path, keep: int = 1) -> str:
    """Download, verify, extract and switch; return a one-line summary."""
    versions = models_dir / ".versions"
    staging = models_dir / ".staging"
    for folder in (models_dir, versions, staging):
        folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(models_dir, 0o755)
    os.chmod(versions, 0o755)
    live = models_dir / name
    version = versions / f"{name}-{sha256[:16]}"
    previous = live.resolve() if live.is_symlink() else None
    if (version / MANIFEST).exists():
        switch(live, version)
        return f"{name}: switched to the verified copy already on disk ({sha256[:16]})"
    partial = staging / f"{name}-{sha256[:16]}.partial"
    unpacked = staging / f"{name}-{sha256[:16]}.d"
    shutil.rmtree(unpacked, ignore_errors=True)
    try:
        size = download(url, partial, sha256)
        try:
            files = extract(partial, unpacked)
        except (tarfile.TarError, EOFError, OSError) as err:
            raise FetchError(f"cannot extract the archive of {name}: {err}") from None
        manifest = {"name": name, "url": url, "sha256": sha256, "size": size, "files": files}
        (unpacked / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        os.chmod(unpacked / MANIFEST, 0o644)
        if version.exists():
            shutil.rmtree(version)
        unpacked.rename(version)
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(unpacked, ignore_errors=True)
    switch(live, version)
    prune(versions, name, {version, *([previous] if previous else [])}, keep + 1)
    total = sum(int(f.get("size", 0)) for f in files.values())
    return f"{name}: installed {sha256[:16]} ({len(files)} files, {total} bytes)"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: exit 0 installed, 1 with a message on failure."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--name", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--sha256", required=True)
    parser.add_argument("--models-dir", type=Path, required=True)
    parser.add_argument("--keep", type=int, default=1, help="previous versions to keep")
    args = parser.parse_args(argv)
    os.umask(0o022)
    try:
        print(install(args.name, args.url, args.sha256.lower(), args.models_dir, args.keep))
    except FetchError as err:
        print(f"model {args.name}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
