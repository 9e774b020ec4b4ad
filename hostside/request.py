"""One HTTP request to a vLLM server, made on its own host (servers bind to loopback by default).

Used by ``fleet complete`` and by the ``fleet verify`` suite, over ssh. It reads a JSON payload
on stdin, takes the API key from the server's environment file with the one reader
(:mod:`hostside.envfile`, systemd's rules), so the key is never on a command line, and prints
one JSON line ``{"status": N, "body": "..."}``.

Payload: ``{"port": 18000, "path": "/v1/models", "body": null | {...}, "auth": true,
"env_file": "/etc/vllm-fleet/chat.env"}`` (``auth`` false: no key is sent).

Example:
    echo '{"port": 18000, "path": "/health", "body": null, "auth": false,
           "env_file": "/etc/vllm-fleet/chat.env"}' | python3 request.py
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: siblings import as the hostside package (see hostside)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostside import envfile


def request(payload: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    """Make the request; return ``{"status": N, "body": text}`` (HTTP errors included)."""
    body = payload.get("body")
    req = urllib.request.Request(
        f"http://127.0.0.1:{int(payload['port'])}{payload['path']}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    key = envfile.read_value(payload["env_file"], "VLLM_API_KEY")
    if key and payload.get("auth", True):
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as reply:
            return {"status": reply.status, "body": reply.read().decode()}
    except urllib.error.HTTPError as err:
        return {"status": err.code, "body": err.read().decode(errors="replace")}


def main() -> int:
    """Read the payload on stdin, print the answer as one JSON line; 1 if nothing answered."""
    try:
        print(json.dumps(request(json.load(sys.stdin))))
    except (urllib.error.URLError, OSError, ValueError, KeyError) as err:
        print(f"request failed: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
