"""Fetching a verified file from a list of sources: peers first, the origin last.

A peer is another host of the fleet serving its kept blobs (``hostside/peer_serve.py``) at
``http://ADDRESS:PORT/blobs/<sha256>``. The installer tries the sources in order; each transfer
is verified by SHA256 before anything is unpacked or switched, exactly as from the origin. A
source that refuses (401, 403, 404, 503 twice), cannot be reached, stalls past its timeout,
sends no length, dies mid-transfer or sends bytes that do not match is **dropped**, named in the
output, and the next one is tried; the origin, last, keeps the retries of the model's
``download:`` setting and its errors are the install's.

Safe resume across sources: the partial file is named by the digest it must reach, so the next
source continues it (a peer that died at 60 % costs the next one only 40 %). A prefix from a bad
source would poison that copy, and then the digest cannot tell which source lied: a *spliced*
copy that does not match is deleted and fetched whole from the current source once more, which
is dropped only if its own whole copy fails too. A source is blamed only for a copy it alone
sent.

What goes where: the peer token (``Authorization: Bearer``) only to peers, never on a redirect
(a peer's redirect is refused) and never through a proxy (peers are reached directly, whatever
``http_proxy`` says); the origin gets its plain request, as without peers. Peer URLs hold an IP
address and a port, nothing else, so no origin credential can ride along.

Example:
    >>> peer_base("http://10.0.0.21:7070/"), peer_base("http://[fd00::5]:7070")
    ('http://10.0.0.21:7070', 'http://[fd00::5]:7070')
"""

from __future__ import annotations

import ipaddress
import re
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hostside.models.common import DiskFull, FetchError, say
from hostside.models.transport import ChecksumMismatch, Download

_PEER = re.compile(r"http://(?P<host>[0-9.]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})/?")


def peer_base(url: str) -> str:
    """The base URL of a peer (``http://ADDRESS:PORT``), or ValueError saying why not.

    >>> peer_base("http://peer.example:7070")
    Traceback (most recent call last):
    ...
    ValueError: a peer is http://IP:PORT (an address of the fleet's private network), not 'http://peer.example:7070'
    """
    match = _PEER.fullmatch(url)
    if match is not None:
        try:
            ipaddress.ip_address(match["host"].strip("[]"))
        except ValueError:
            match = None
    if match is None or not 0 < int(match["port"]) < 65536:
        raise ValueError(
            "a peer is http://IP:PORT (an address of the fleet's private network), "
            f"not {url!r}"
        )
    return f"http://{match['host']}:{int(match['port'])}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A peer that answers with a redirect is refused, not followed."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def peer_opener() -> urllib.request.OpenerDirector:
    """An opener that reaches peers directly (no proxy) and follows no redirect."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


@dataclass(frozen=True)
class Source:
    """One place the file can come from.

    + url: the file's URL
    + label: how messages name it (``peer http://10.0.0.21:7070``, ``the origin``)
    + retries, timeout: its patience
    + headers: what it is sent (a peer's token; never shown)
    + opener: how it is reached (None: urllib's default, proxies included)
    + peer: a peer (its answer must carry a length, so what it sends is bounded)
    """

    url: str
    label: str
    retries: int
    timeout: float
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    opener: Any = field(default=None, repr=False)
    peer: bool = False


def sources_for(origin: str, sha256: str, peers: list[str], token: str | None, *,
                retries: int, peer_retries: int, peer_timeout: float) -> list[Source]:
    """The peers' blob URLs (in the order given), then the origin.

    >>> [s.label for s in sources_for("https://o/m.tar", "a" * 64, ["http://10.0.0.2:7070"],
    ...                               "t" * 16, retries=6, peer_retries=1, peer_timeout=15)]
    ['peer http://10.0.0.2:7070', 'the origin']
    """
    if peers and token is None:
        raise FetchError("peers need a token: give --peer-token-file")
    found = []
    opener = peer_opener() if peers else None
    for peer in peers:
        base = peer_base(peer)
        found.append(Source(f"{base}/blobs/{sha256}", f"peer {base}", peer_retries, peer_timeout,
                            {"Authorization": f"Bearer {token}"}, opener, peer=True))
    found.append(Source(origin, "the origin", retries, 60.0))
    return found


def download_first(name: str, sources: list[Source], partial: Path, sha256: str, *,
                   retry_wait: float, progress_every: float, need_extra: Any,
                   durable: bool) -> tuple[int, Source]:
    """Fetch ``partial`` from the first source that delivers the pinned bytes; its size and
    that source. Every other failure drops the source (said) and moves on; the last source's
    failure, or a full disk, is the caller's."""
    carried: tuple[Any, int] | None = None
    for index, source in enumerate(sources):
        if len(sources) > 1:
            say(f"{name}: fetching from {source.label}")
        whole_again = False
        while True:
            download = Download(
                name, source.url, partial, sha256, retries=source.retries,
                retry_wait=retry_wait, progress_every=progress_every, timeout=source.timeout,
                need_extra=need_extra, durable=durable, headers=source.headers,
                opener=source.opener, adopt=True, carried=carried, need_length=source.peer,
            )  # fmt: skip
            try:
                return download.run(), source
            except DiskFull:
                raise
            except ChecksumMismatch as err:
                carried = None
                if err.spliced and not whole_again:
                    say(f"{name}: {err}; fetching the whole file from {source.label}")
                    whole_again = True
                    continue
                failure: FetchError = err
            except FetchError as err:
                carried = (download.digest, download.written) if download.digest else None
                failure = err
            break
        if index == len(sources) - 1:
            raise failure
        reason = ("it sent bytes that do not match the sha256"
                  if isinstance(failure, ChecksumMismatch) else str(failure))
        say(f"{name}: {source.label} dropped ({reason}); trying {sources[index + 1].label}")
    raise FetchError(f"{name}: no source to fetch from")
