"""Readiness of a vLLM server: a real completion, not just /health. Standard library only.

Reads the server's API key (VLLM_API_KEY) from its environment file on the host, so the key
never appears on a command line. ``--url`` is the server's base URL as its plan reaches it
(:class:`fleet.planner.reach.Reach`: bind address, loopback for every interface, scheme);
``--cafile``/``--tls-name`` for an https server (:mod:`hostside.tlsprobe`).

Example:
    python3 check_ready.py --url http://127.0.0.2:18000 --model tiny \
        --env-file /etc/vllm-fleet/tiny.env
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

if not __package__:  # run as a file: siblings import as the hostside package (see hostside)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostside import envfile, tlsprobe


def complete(url: str, model: str, key: str | None, cafile: str | None = None,
             tls_name: str | None = None) -> dict:
    """One short completion from the server at base URL ``url``; return the parsed reply
    (https with ``cafile``: trusting it alone, for ``tls_name``)."""
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 8, "temperature": 0})
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v1/completions",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with tlsprobe.urlopen(request, 120, cafile, tls_name) as reply:
        return json.load(reply)


def main(argv: list[str] | None = None) -> int:
    """Exit 0 once a completion returns tokens; 1 with the last error after the timeout."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="the server's base URL")
    parser.add_argument("--model", required=True)
    parser.add_argument("--env-file", required=True)
    parser.add_argument("--timeout", type=float, default=300)
    tlsprobe.add_arguments(parser)
    args = parser.parse_args(argv)
    key = envfile.read_value(args.env_file, "VLLM_API_KEY")
    deadline = time.monotonic() + args.timeout
    error = "no attempt"
    while time.monotonic() < deadline:
        try:
            reply = complete(args.url, args.model, key, args.cafile, args.tls_name)
            tokens = reply.get("usage", {}).get("completion_tokens", 0)
            if tokens > 0:
                text = reply["choices"][0]["text"]
                print(f"{args.model} at {args.url} answered {tokens} tokens: {text!r}")
                return 0
            error = f"a completion with no tokens: {reply}"
        except urllib.error.HTTPError as err:
            error = f"HTTP {err.code}: {err.read(300).decode(errors='replace')}"
        except (urllib.error.URLError, OSError, ValueError, KeyError) as err:
            error = str(err)
        time.sleep(2)
    print(f"{args.model} at {args.url} is not ready: {error}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
