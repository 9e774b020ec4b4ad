"""One HTTP request to a vLLM server, made on its own host (servers bind to loopback by default).

Used by ``fleet complete``, ``fleet status``, ``fleet doctor`` and the ``fleet verify`` suite,
over ssh. It reads a JSON payload on stdin, takes the API key from the server's environment
file with the one reader (:mod:`hostside.envfile`, systemd's rules), so the key is never on a
command line, and prints one JSON line ``{"status": N, "body": "..."}``.

Payload: ``{"url": "http://127.0.0.2:18000", "port": 18000, "path": "/v1/models",
"body": null | {...}, "auth": true, "env_file": "/etc/vllm-fleet/chat.env"}`` (``auth`` false:
no key is sent; ``cafile`` and ``tls_name``, an https server's trust as its plan says,
:mod:`hostside.tlsprobe`). ``url`` is the server's base URL as its plan reaches it
(:class:`fleet.planner.reach.Reach`); without it (an older client), ``http://127.0.0.1:PORT``.

Example:
    echo '{"url": "http://127.0.0.1:18000", "path": "/health", "body": null, "auth": false,
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

from hostside import envfile, tlsprobe


def target(payload: dict[str, Any]) -> str:
    """The URL a payload asks for: its ``url`` (or, from an older client, loopback and its
    ``port``) and its ``path``.

    Example:
        >>> target({"url": "http://[::1]:8000/", "port": 8000, "path": "/health"})
        'http://[::1]:8000/health'
        >>> target({"port": 8000, "path": "/v1/models"})
        'http://127.0.0.1:8000/v1/models'
    """
    base = payload.get("url") or f"http://127.0.0.1:{int(payload['port'])}"
    return f"{str(base).rstrip('/')}{payload['path']}"


def request(payload: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    """Make the request; return ``{"status": N, "body": text}`` (HTTP errors included)."""
    body = payload.get("body")
    req = urllib.request.Request(
        target(payload),
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json"},
    )
    key = envfile.read_value(payload["env_file"], "VLLM_API_KEY")
    if key and payload.get("auth", True):
        req.add_header("Authorization", f"Bearer {key}")
    try:
        trust = payload.get("cafile"), payload.get("tls_name")
        with tlsprobe.urlopen(req, timeout, *trust) as reply:
            return {"status": reply.status, "body": reply.read().decode()}
    except urllib.error.HTTPError as err:
        return {"status": err.code, "body": err.read().decode(errors="replace")}


def main() -> int:
    """Read the payload on stdin, print the answer as one JSON line; 1 if nothing answered.
    With ``"certificate": true`` the answer is the SHA-256 of the certificate the server serves
    (``{"certificate": HEX}``, :func:`hostside.tlsprobe.served_fingerprint`)."""
    try:
        payload = json.load(sys.stdin)
        if payload.get("certificate"):
            # asked only by clients that know TLS, which always send the url
            print(json.dumps({"certificate": tlsprobe.served_fingerprint(
                payload["url"], payload.get("tls_name"))}))
            return 0
        print(json.dumps(request(payload)))
    except (urllib.error.URLError, OSError, ValueError, KeyError) as err:
        print(f"request failed: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
