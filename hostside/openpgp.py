"""apt signing keys on hosts that have no gpg (standard library only, no sibling imports).

``show PATH`` prints the fingerprint of each primary key in a keyring file (binary or
ASCII-armoured), as ``gpg --show-keys`` would; ``install URL PATH FINGERPRINT`` fetches a key,
refuses it unless its fingerprint is the expected one, and writes it (binary) to PATH. The
KeyringFingerprints fact runs it before anything is uploaded, so it is sent as text
(``python3 -c``, :func:`hostside.program_source`) and must stay one self-contained file.

Example:
    python3 openpgp.py show /etc/apt/keyrings/vllm-fleet-nvidia.gpg
    python3 openpgp.py install https://…/3bf863cc.pub /etc/apt/keyrings/x.gpg EB69…63CC
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import tempfile
import urllib.request
from collections.abc import Iterator


def packets(data: bytes) -> Iterator[tuple[int, bytes]]:
    """The (tag, body) of each OpenPGP packet (old and new length formats)."""
    i = 0
    while i < len(data):
        tag = data[i]
        i += 1
        if not tag & 0x80:
            raise ValueError("not an OpenPGP key")
        if tag & 0x40:
            kind, first = tag & 0x3F, data[i]
            i += 1
            if first < 192:
                size = first
            elif first < 224:
                size = ((first - 192) << 8) + data[i] + 192
                i += 1
            elif first == 255:
                size = int.from_bytes(data[i : i + 4], "big")
                i += 4
            else:
                raise ValueError("partial packet lengths are not used in keys")
        else:
            kind, count = (tag >> 2) & 0x0F, {0: 1, 1: 2, 2: 4}[tag & 3]
            size = int.from_bytes(data[i : i + count], "big")
            i += count
        yield kind, data[i : i + size]
        i += size


def dearmor(data: bytes) -> bytes:
    """The binary key of an ASCII-armoured one (binary input is returned as it is)."""
    if not data.lstrip().startswith(b"-----BEGIN PGP"):
        return data
    body: list[str] = []
    started = False
    for line in data.decode("ascii").splitlines()[1:]:
        if started:
            if line.startswith(("=", "-----")):
                break
            body.append(line)
        elif not line.strip():
            started = True
    return base64.b64decode("".join(body))


def fingerprints(data: bytes) -> list[str]:
    """The v4 fingerprints of the primary keys (public-key packets, tag 6)."""
    return [
        hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body).hexdigest().upper()
        for kind, body in packets(data)
        if kind == 6 and body[:1] == b"\x04"
    ]


def show(path: str) -> None:
    """Print the fingerprints of a keyring file (``error: …`` when it is not one)."""
    try:
        with open(path, "rb") as handle:
            print(" ".join(fingerprints(dearmor(handle.read()))))
    except (OSError, ValueError, IndexError) as err:
        print(f"error: {err}")


def install(url: str, path: str, expected: str) -> None:
    """Fetch the key at ``url``; write it to ``path`` only if its fingerprint is ``expected``."""
    with urllib.request.urlopen(url, timeout=60) as reply:
        data = dearmor(reply.read())
    found = fingerprints(data)
    if found != [expected]:
        sys.exit(
            f"the key at {url} has fingerprint {' '.join(found) or '(none)'}, not the declared "
            f"{expected}: refusing it"
        )
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)
    print(f"installed key {expected} from {url} as {path}")


def main(argv: list[str]) -> int:
    """``show PATH`` or ``install URL PATH FINGERPRINT``."""
    if argv[:1] == ["show"] and len(argv) == 2:
        show(argv[1])
    elif argv[:1] == ["install"] and len(argv) == 4:
        install(*argv[1:4])
    else:
        print("usage: openpgp.py show PATH | install URL PATH FINGERPRINT", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
