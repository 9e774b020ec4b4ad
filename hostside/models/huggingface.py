"""The Hugging Face source: a repo at a pinned commit, every file verified against the hub.

The only part of the installer that needs a library (``huggingface_hub``, imported when used):
the deploy runs the installer with the vLLM venv's python for these models.

Example:
    >>> git_blob_sha1(0).hexdigest()
    'e69de29bb2d1d6434b8b29ae775ad8c2e48c5391'
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from typing import Any

from hostside.models.common import FetchError, free_bytes, human_bytes, say
from hostside.models.store import Layout, Staged, install
from hostside.models.transport import hash_file


def git_blob_sha1(size: int) -> Any:
    """A sha1 digest primed like git's blob ids (``blob <size>\\0`` + content).

    >>> d = git_blob_sha1(0); d.hexdigest()
    'e69de29bb2d1d6434b8b29ae775ad8c2e48c5391'
    """
    digest = hashlib.sha1(usedforsecurity=False)
    digest.update(f"blob {size}\0".encode())
    return digest


def install_hf(
    layout: Layout,
    repo: str,
    revision: str,
    keep: int,
    endpoint: str | None,
    token: str | None,
    deep: bool = False,
) -> str:
    """Download a Hugging Face repo at a pinned commit; verify every file against the hub.

    huggingface_hub fetches (and resumes) the files into staging; then each file is hashed
    once: LFS files must match the hub's sha256, the others git's blob id, before the
    version goes live.
    """
    return install(
        layout, revision, keep, lambda: _fetch(layout, repo, revision, endpoint, token),
        deep=deep,
    )


def _fetch(
    layout: Layout, repo: str, revision: str, endpoint: str | None, token: str | None
) -> Staged:
    """Download the repo into staging and verify every file; the version is not live yet."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # our own lines instead
    try:  # optional: only this source needs it, and only the vLLM venv's python has it
        import huggingface_hub
    except ImportError:
        raise FetchError(
            f"huggingface_hub is not installed for {sys.executable}; run the installer with "
            "the vLLM venv's python (the deploy does)"
        ) from None
    api = huggingface_hub.HfApi(endpoint=endpoint, token=token)
    try:
        entries = [
            entry for entry in api.list_repo_tree(repo, revision=revision, recursive=True)
            if entry.__class__.__name__ == "RepoFile"
        ]
    except Exception as err:
        raise FetchError(
            f"cannot list {repo} at {revision} on {endpoint or 'the Hugging Face hub'}: {err}. "
            "Check the repo, the revision, the token and the endpoint; the previous model "
            "keeps serving"
        ) from None
    total = sum(int(entry.size or 0) for entry in entries)
    free = free_bytes(layout.staging)
    if total > free:
        raise FetchError(
            f"not enough free space in {layout.models_dir} for {layout.name}: need "
            f"{human_bytes(total)}, {human_bytes(free)} free; free space, then deploy again"
        )
    work = layout.staging / f"{layout.name}-{revision[:16]}.hf"
    say(f"{layout.name}: {len(entries)} files, {human_bytes(total)} from {repo}@{revision[:12]}")
    try:
        huggingface_hub.snapshot_download(
            repo, revision=revision, local_dir=work, endpoint=endpoint, token=token
        )
    except Exception as err:
        raise FetchError(
            f"download of {repo}@{revision} failed: {err}. What arrived is kept in {work} and "
            "resumed by the next deploy; the previous model keeps serving"
        ) from None
    shutil.rmtree(work / ".cache", ignore_errors=True)
    files: dict[str, dict[str, Any]] = {}
    for entry in entries:
        path = work / entry.path
        sha256 = hashlib.sha256()
        lfs = getattr(entry, "lfs", None)
        expected_sha256 = (lfs.get("sha256") if isinstance(lfs, dict) else
                           getattr(lfs, "sha256", None))
        digests = [sha256]
        blob = None
        if not expected_sha256:
            blob = git_blob_sha1(path.stat().st_size if path.exists() else 0)
            digests.append(blob)
        try:
            size = hash_file(path, digests)
        except OSError as err:
            raise FetchError(f"{repo}@{revision}: {entry.path} did not arrive ({err})") from None
        wrong = (expected_sha256 and sha256.hexdigest() != expected_sha256) or (
            blob is not None and blob.hexdigest() != entry.blob_id
        )
        if wrong:
            path.unlink(missing_ok=True)
            raise FetchError(
                f"{repo}@{revision}: {entry.path} does not match the hub's hash (corrupt or "
                "interrupted download); it was deleted and the next deploy fetches it again. "
                "The previous model keeps serving"
            )
        os.chmod(path, 0o644)
        files[entry.path] = {"size": size, "sha256": sha256.hexdigest(),
                             "mtime_ns": path.stat().st_mtime_ns}
    for dirpath, dirnames, _ in os.walk(work):
        for dirname in dirnames:
            os.chmod(os.path.join(dirpath, dirname), 0o755)
    os.chmod(work, 0o755)
    manifest = {
        "source": {"kind": "hf", "repo": repo, "endpoint": endpoint},
        "revision": revision,
        "sha256": None,
        "size": total,
        "files": files,
        "links": {},
    }
    return Staged(work, manifest, work)


