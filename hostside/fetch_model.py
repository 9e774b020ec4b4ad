"""Install a model on this host: download, verify, unpack, switch atomically; check; roll back.

The installer's command line; the work is done by :mod:`hostside.models` (transport, archive
safety, the version store, the sources), split by concern. Runs on the host with the standard
library only (the Hugging Face source alone imports ``huggingface_hub``, so it runs with the
vLLM venv's python). A truncated download, a wrong checksum, a malicious archive or a full disk
never touch the version being served.

Commands (exit 0 on success, 1 with a message saying what happened and what to do)::

    fetch_model.py install --name NAME --models-dir DIR --url URL --sha256 HEX [--keep N] \\
        [--peer http://IP:PORT ... --peer-token-file FILE] [--keep-blob]
    fetch_model.py install --name NAME --models-dir DIR --file PATH --sha256 HEX
    fetch_model.py install --name NAME --models-dir DIR --hf REPO --revision COMMIT \\
        [--endpoint URL] [--token-stdin | --token-file FILE]
    fetch_model.py check --name NAME --models-dir DIR [--deep] [--json]   (exit 3: drift)
    fetch_model.py rollback --name NAME --models-dir DIR [--to ID16]
    fetch_model.py versions --name NAME --models-dir DIR
    fetch_model.py list --models-dir DIR
    fetch_model.py remove --name NAME --models-dir DIR [--units-dir DIR]
    fetch_model.py blobs --models-dir DIR                  (the kept archives, as JSON)
    fetch_model.py drop-blobs --models-dir DIR (--sha256 HEX ... | --all)

``--peer`` (repeated, tried in order before the origin ``--url``) fetches the archive from
other hosts of the fleet serving their kept copies (``peer_serve.py``), with the token in
``--peer-token-file`` (mode 0600; never an argument); ``--keep-blob`` keeps the verified
archive so that this host can serve it in turn (:mod:`hostside.models.blobs`,
:mod:`hostside.models.peers`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: siblings import as the hostside package (see hostside)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostside.models import blobs, common
from hostside.models.archive import is_archive
from hostside.models.common import NAME_PATTERN, FetchError, say
from hostside.models.huggingface import install_hf
from hostside.models.peers import sources_for
from hostside.models.sources import file_name, install_file, install_url
from hostside.models.store import Layout, check, installed, remove, rollback, versions
from hostside.peertoken import TokenError, read_token_file

EXIT_DRIFT = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Install, check and roll back models on this host (vllm-fleet)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="every installed model, as JSON")
    listing.add_argument("--models-dir", type=Path, required=True)
    kept = sub.add_parser("blobs", help="the verified archives kept for peers, as JSON")
    kept.add_argument("--models-dir", type=Path, required=True)
    dropping = sub.add_parser("drop-blobs", help="remove kept archives")
    dropping.add_argument("--models-dir", type=Path, required=True)
    which = dropping.add_mutually_exclusive_group(required=True)
    which.add_argument("--sha256", action="append", help="a blob to drop (repeat for more)")
    which.add_argument("--all", action="store_true", help="drop every kept blob")
    for command in ("install", "check", "rollback", "versions", "remove"):
        sp = sub.add_parser(command)
        sp.add_argument("--name", required=True)
        sp.add_argument("--models-dir", type=Path, required=True)
        if command == "remove":
            sp.add_argument("--units-dir", type=Path, default=Path("/etc/systemd/system"),
                            help="where the vLLM units that may still use it live")
        if command == "install":
            source = sp.add_mutually_exclusive_group(required=True)
            source.add_argument("--url")
            source.add_argument("--file", type=Path)
            source.add_argument("--hf")
            sp.add_argument("--sha256")
            sp.add_argument("--revision")
            sp.add_argument("--endpoint")
            sp.add_argument("--token-file", type=Path)
            sp.add_argument("--token-stdin", action="store_true",
                            help="read the Hugging Face token from the first line of stdin")
            sp.add_argument("--keep", type=int, default=1, help="older versions to keep")
            sp.add_argument("--unpack", choices=["auto", "yes", "no"], default="auto")
            sp.add_argument("--filename", help="name of a single file inside the version")
            sp.add_argument("--retries", type=int, default=6)
            sp.add_argument("--retry-wait", type=float, default=2.0)
            sp.add_argument("--progress-every", type=float, default=10.0)
            sp.add_argument("--deep", action="store_true",
                            help="re-hash a copy already on disk before reusing it")
            sp.add_argument("--peer", action="append", default=[], metavar="http://IP:PORT",
                            help="a host serving its kept copy; tried in order before --url")
            sp.add_argument("--peer-token-file", type=Path,
                            help="the file (mode 0600) holding the peers' token")
            sp.add_argument("--peer-retries", type=int, default=1)
            sp.add_argument("--peer-timeout", type=float, default=15.0,
                            help="seconds a peer may stay silent before it is dropped")
            sp.add_argument("--keep-blob", action="store_true",
                            help="keep the verified archive for peers (<models-dir>/.blobs/)")
            sp.add_argument("--no-fsync", action="store_true",
                            help="do not flush files to disk before switching (faster; a power "
                            "cut right after may leave a torn version for the next check)")
        if command == "check":
            sp.add_argument("--deep", action="store_true", help="re-hash every file")
            sp.add_argument("--json", action="store_true")
        if command == "rollback":
            sp.add_argument("--to", help="version id prefix to switch to")
    return parser


def _install(args: argparse.Namespace, layout: Layout) -> str:
    if args.hf:
        if not args.revision or not re.fullmatch(r"[0-9a-f]{40}", args.revision):
            raise FetchError("--revision must be a 40-hex commit")
        token = None
        if args.token_stdin:
            token = sys.stdin.readline().strip() or None
        elif args.token_file is not None:
            try:
                token = args.token_file.read_text().strip() or None
            finally:
                args.token_file.unlink(missing_ok=True)
        return install_hf(layout, args.hf, args.revision, args.keep, args.endpoint, token,
                          args.deep)
    sha256 = (args.sha256 or "").lower()
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise FetchError("--sha256 must be 64 hex digits")
    source = args.url or str(args.file)
    unpack_it = is_archive(source) if args.unpack == "auto" else args.unpack == "yes"
    name_in_version = args.filename or file_name(source)
    if args.file is not None:
        return install_file(layout, args.file, sha256, args.keep, unpack_it, name_in_version,
                            args.progress_every, args.deep, keep_blob=args.keep_blob)
    token = None
    if args.peer:
        if args.peer_token_file is None:
            raise FetchError("--peer needs --peer-token-file (the token is never an argument)")
        try:
            token = read_token_file(args.peer_token_file)
        except TokenError as err:
            raise FetchError(str(err)) from None
    try:
        sources = sources_for(args.url, sha256, args.peer, token, retries=args.retries,
                              peer_retries=args.peer_retries, peer_timeout=args.peer_timeout)
    except ValueError as err:
        raise FetchError(str(err)) from None
    return install_url(
        layout, sources, sha256, args.keep, unpack_it, name_in_version,
        retry_wait=args.retry_wait, progress_every=args.progress_every, deep=args.deep,
        keep_blob=args.keep_blob,
    )


def _check_install_args(args: argparse.Namespace) -> None:
    """Refuse what only a URL source can use."""
    if (args.peer or args.peer_token_file) and not args.url:
        raise FetchError("--peer and --peer-token-file go with --url (the origin, tried last); "
                         "a Hugging Face snapshot or a pushed file is not fetched from peers")
    if args.keep_blob and args.hf:
        raise FetchError("--keep-blob keeps an archive or single file by its sha256; a Hugging "
                         "Face snapshot has none")


#: The installs' log in the models folder: one JSON line per install (read by the start
#: recorder, hostside/startup_phases.py, as the "model install" before a server's start).
INSTALLS_LOG = ".installs.jsonl"


def log_install(models_dir: Path, name: str, seconds: float, summary: str) -> None:
    """Append one install's duration (download, verify, unpack, switch) to the installs' log;
    a log that cannot be written never fails the install."""
    entry = {"model": name, "ended_s": round(time.time(), 3), "seconds": round(seconds, 2),
             "summary": summary}  # fmt: skip
    path = models_dir / INSTALLS_LOG
    with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps(entry) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: 0 done, 1 failed (message on stderr), 3 drift found by check."""
    args = _parser().parse_args(argv)
    os.umask(0o022)
    if args.command == "list":
        print(json.dumps(installed(args.models_dir)))
        return 0
    if args.command == "blobs":
        print(json.dumps(blobs.listing(args.models_dir)))
        return 0
    if args.command == "drop-blobs":
        try:
            say(blobs.drop(args.models_dir, None if args.all else
                           [d.lower() for d in args.sha256]))
        except (ValueError, FetchError) as err:
            print(f"drop-blobs: {err}", file=sys.stderr)
            return 1
        return 0
    if not re.fullmatch(NAME_PATTERN, args.name):
        print(f"invalid model name {args.name!r}", file=sys.stderr)
        return 2
    layout = Layout(args.models_dir, args.name)
    common.DURABLE = not getattr(args, "no_fsync", False)
    try:
        if args.command == "check":
            report = check(layout, args.deep)
            if args.json:
                print(json.dumps(report))
                return 0
            for problem in report["problems"]:
                say(f"{args.name}: {problem['path']}: {problem['problem']}")
            if report["ok"]:
                say(f"{args.name}: {report['version']} intact "
                    f"({'deep: every file re-hashed' if args.deep else 'quick: sizes, mtimes'})")
                return 0
            say(f"{args.name}: {'not installed' if not report['installed'] else 'DRIFT'}")
            return EXIT_DRIFT
        if args.command == "versions":
            print(json.dumps(versions(layout) if layout.versions.is_dir() else []))
            return 0
        layout.prepare()
        with layout.locked():
            if args.command == "rollback":
                say(rollback(layout, args.to))
            elif args.command == "remove":
                digests = [str(m.get("sha256")) for _, m in layout.all_versions()
                           if re.fullmatch(blobs.BLOB_NAME, str(m.get("sha256")))
                           and blobs.blob_path(args.models_dir, str(m["sha256"])).is_file()]
                say(remove(layout, args.units_dir))
                if digests:
                    say(blobs.drop(args.models_dir, digests))
            else:
                _check_install_args(args)
                began = time.monotonic()
                said = _install(args, layout)
                log_install(args.models_dir, args.name, time.monotonic() - began, said)
                say(said)
    except FetchError as err:
        print(f"model {args.name}: {err}", file=sys.stderr, flush=True)
        return 1
    except OSError as err:
        print(f"model {args.name}: {err}; the previous model keeps serving", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
