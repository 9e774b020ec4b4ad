"""How a vLLM server is reached: one description, decided once from its bind address and flags.

Every probe and client of a server (the readiness wait in its unit, the readiness completion,
a replica's roll and the canary's rollback, the router's worker URL) reaches it through a
:class:`Reach`: the scheme it speaks, the address it is reached at, its port, and the root path
it was told it sits under.

- **Scheme**: ``https`` when the server has ``tls`` (vLLM then gets ``--ssl-certfile`` and
  ``--ssl-keyfile``: uvicorn serves TLS when either is set, ``Config.is_ssl``), else ``http``.
- **Trust** (``https`` only): the probes verify the served certificate against ``cafile``, a
  file on the host (the fleet file's ``tls.ca``, or the deployed certificate itself, pinned),
  for ``tls_name``, the address clients use (the bind address; the host's address when it binds
  every interface), which the certificate's names must cover (``fleet check``). A probe that
  connects to loopback still checks that name (``hostside/tlsprobe.py``).
- **Address**: where the server listens (``host:``); a bind to every interface is reached on its
  own host's loopback of that family (``0.0.0.0`` → ``127.0.0.1``, ``::`` → ``::1``).
- **Root path** (``root-path`` in ``args``): vLLM 0.32 sets it as FastAPI's ``app.root_path``
  (``vllm/entrypoints/launchers/app.py``), which prefixes no route: Starlette's
  ``get_route_path`` strips the root path from a request's path when it is there and routes the
  path as it is otherwise, so ``/health`` and ``ROOT/health`` both answer. The probes keep the
  plain paths (:attr:`Reach.url` has no root path); the root path is kept for clients behind the
  path-based proxy it describes.

Example:
    >>> from fleet.spec.models import Server
    >>> tls = {"certificate": {"file": "/c.pem"}, "key": {"file": "/k.pem"}}
    >>> reach = server_reach(Server(model="m", port=8000, host="::", tls=tls,
    ...                             args={"root-path": "/api"}), "gpu-1.example")
    >>> reach.url, reach.root_path, reach.tls_name
    ('https://[::1]:8000', '/api', 'gpu-1.example')
    >>> server_reach(Server(model="m", port=8000, host="127.0.0.2")).url
    'http://127.0.0.2:8000'
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from fleet.catalog.paths import tls_path
from fleet.spec.addresses import bracket, is_any, local_address
from fleet.spec.models import Server


@dataclass(frozen=True)
class Reach:
    """Where and how a server answers.

    + scheme: ``http`` or ``https``
    + address: the address it is reached at (no brackets; a host name stays a name)
    + port: its API port
    + root_path: vLLM's ``--root-path`` ("" without one); not part of :attr:`url`
    + cafile: ``https``: the file on the host whose certificates the probes trust ("" for http)
    + tls_name: ``https``: the name the served certificate must cover ("" for http)

    Example:
        >>> Reach("http", "fd00::5", 8000).url, Reach("https", "10.0.0.5", 443, "/v").url
        ('http://[fd00::5]:8000', 'https://10.0.0.5:443')
        >>> Reach("http", "127.0.0.2", 8000).at("10.0.0.7").url
        'http://10.0.0.7:8000'
    """

    scheme: Literal["http", "https"]
    address: str
    port: int
    root_path: str = ""
    cafile: str = ""
    tls_name: str = ""

    @property
    def probe_args(self) -> list[str]:
        """The TLS words of a host program that probes the server (``--cafile F --tls-name N``;
        none for http).

        Example:
            >>> Reach("https", "127.0.0.1", 8443, "", "/etc/c.pem", "10.0.0.5").probe_args
            ['--cafile', '/etc/c.pem', '--tls-name', '10.0.0.5']
            >>> Reach("http", "127.0.0.1", 8000).probe_args
            []
        """
        if self.scheme != "https":
            return []
        return ["--cafile", self.cafile, "--tls-name", self.tls_name]

    @property
    def trust(self) -> dict[str, str]:
        """The TLS keys of a ``hostside/request.py`` payload (none for http).

        Example:
            >>> Reach("https", "127.0.0.1", 8443, "", "/etc/c.pem", "10.0.0.5").trust
            {'cafile': '/etc/c.pem', 'tls_name': '10.0.0.5'}
        """
        if self.scheme != "https":
            return {}
        return {"cafile": self.cafile, "tls_name": self.tls_name}

    @property
    def url(self) -> str:
        """The base URL the probes append ``/health``, ``/metrics``, ``/v1/...`` to."""
        return f"{self.scheme}://{bracket(self.address)}:{self.port}"

    def at(self, address: str) -> Reach:
        """The same server reached at another address (from another host)."""
        return replace(self, address=address)


def scheme_of(server: Server) -> Literal["http", "https"]:
    """``https`` when the server has ``tls``, else ``http``.

    Example:
        >>> tls = {"certificate": {"file": "/c.pem"}, "key": {"file": "/k.pem"}}
        >>> scheme_of(Server(model="m", port=1, tls=tls)), scheme_of(Server(model="m", port=1))
        ('https', 'http')
    """
    return "https" if server.tls is not None else "http"


def client_name(server: Server, host_address: str) -> str:
    """The address clients use for ``server`` of a host at ``host_address``: its bind address,
    or the host's address when it binds every interface (what its certificate must cover).

    Example:
        >>> client_name(Server(model="m", port=1, host="0.0.0.0"), "gpu-1.example")
        'gpu-1.example'
        >>> client_name(Server(model="m", port=1, host="10.0.0.5"), "gpu-1.example")
        '10.0.0.5'
    """
    return host_address if is_any(server.host) else server.host


def probe_address(bind: str) -> str:
    """Where a server bound to ``bind`` is reached on its own host: the bind address, or the
    loopback of its family for every interface (:func:`fleet.spec.addresses.local_address`).

    Example:
        >>> [probe_address(a) for a in ("0.0.0.0", "::", "127.0.0.2", "10.44.0.11", "::1")]
        ['127.0.0.1', '::1', '127.0.0.2', '10.44.0.11', '::1']
    """
    return local_address(bind)


def server_reach(server: Server, host_address: str | None = None, name: str = "") -> Reach:
    """How ``server`` (named ``name``) is reached on its own host (every deploy-side probe);
    ``host_address``: its host's address, the name a TLS server bound to every interface is
    checked for (default: the bind address's loopback); ``name`` places the probes' CA file.

    Example:
        >>> from fleet.spec.models import Server
        >>> server_reach(Server(model="m", port=18000, host="10.44.0.11")).url
        'http://10.44.0.11:18000'
        >>> tls = {"certificate": {"file": "/c.pem"}, "key": {"file": "/k.pem"}}
        >>> server_reach(Server(model="m", port=8443, tls=tls), name="chat").probe_args
        ['--cafile', '/etc/vllm-fleet/chat.tls-ca.pem', '--tls-name', '127.0.0.1']
    """
    root = server.args.get("root-path")
    address = probe_address(server.host)
    https = server.tls is not None
    return Reach(
        scheme=scheme_of(server),
        address=address,
        port=server.port,
        root_path=root if isinstance(root, str) else "",
        cafile=tls_path(name, "ca") if https and name else "",
        tls_name=client_name(server, host_address or address) if https else "",
    )
