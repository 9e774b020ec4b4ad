"""Every path vllm-fleet owns on a host, in one place.

The deploys, ``fleet drift``, ``fleet verify`` and the host-side programs all take their paths
from here (through the typed host plan), so no two places can disagree about where a unit, an
environment file or a model lives.

Example:
    >>> unit_path("tiny"), env_path("tiny")
    ('/etc/systemd/system/vllm-tiny.service', '/etc/vllm-fleet/tiny.env')
    >>> model_path("tiny-llama")
    '/var/lib/vllm-fleet/models/tiny-llama'
"""

from __future__ import annotations

# -- the tool's own software -------------------------------------------------------------------
#: Host-side programs: the ``hostside`` package is uploaded below it, with the ``loadgen`` modules
#: its programs import beside it (``hostside.program_files``).
REMOTE_DIR = "/usr/local/lib/vllm-fleet"
#: The ``hostside`` package on a host (its programs and the modules they import).
HOSTSIDE_DIR = f"{REMOTE_DIR}/hostside"
#: The vLLM venv.
VENV_DIR = "/opt/vllm-fleet/venv"
#: A small venv holding the pinned uv, and uv's managed interpreters.
UV_DIR = "/opt/vllm-fleet/uv"
PYTHON_DIR = "/opt/vllm-fleet/python"

# -- servers ----------------------------------------------------------------------------------
SERVICE_USER = "vllm"
#: The service user's login shell (none).
SERVICE_SHELL = "/usr/sbin/nologin"
#: The service user's home (not created: each server has its own state directory).
SERVICE_HOME = "/var/lib/vllm-fleet"
UNIT_DIR = "/etc/systemd/system"
#: Environment files (0600, root): one per server, the only place secrets are written.
ENV_DIR = "/etc/vllm-fleet"
#: Saved copies of the last working unit and environment of each server.
PREVIOUS_DIR = "/var/lib/vllm-fleet/previous"

# -- models -----------------------------------------------------------------------------------
MODELS_DIR = "/var/lib/vllm-fleet/models"

# -- OS and GPU stack -------------------------------------------------------------------------
SYSCTL_DROPIN = "/etc/sysctl.d/90-vllm-fleet.conf"
PERSISTENCED_DROPIN = "/etc/systemd/system/nvidia-persistenced.service.d/50-vllm-fleet.conf"
CUDA_PROFILE = "/etc/profile.d/vllm-fleet-cuda.sh"
GOVERNOR_UNIT = "vllm-fleet-cpu-governor.service"
#: A prefix drop-in: systemd applies ``vllm-.service.d/`` to every ``vllm-*.service``.
NOFILE_DROPIN = "/etc/systemd/system/vllm-.service.d/50-vllm-fleet-nofile.conf"
NOUVEAU_BLACKLIST = "/etc/modprobe.d/vllm-fleet-blacklist-nouveau.conf"
NVIDIA_KEYRING = "/etc/apt/keyrings/vllm-fleet-nvidia.gpg"
NVIDIA_SOURCES = "/etc/apt/sources.list.d/vllm-fleet-nvidia.list"
NVIDIA_PREFERENCES = "/etc/apt/preferences.d/vllm-fleet-nvidia"
#: Device nodes every GPU server may use beside its own ``/dev/nvidiaN`` (``char-nvidia-caps``
#: is systemd's name for the MIG capability devices).
NVIDIA_DEVICES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
    "char-nvidia-caps",
)


def unit_name(server: str) -> str:
    """The systemd unit of a server: ``tiny`` → ``vllm-tiny.service``."""
    return f"vllm-{server}.service"


def unit_path(server: str) -> str:
    """Where a server's unit is written."""
    return f"{UNIT_DIR}/{unit_name(server)}"


def env_path(server: str) -> str:
    """Where a server's environment file is written."""
    return f"{ENV_DIR}/{server}.env"


#: The TLS files of a server, by the name systemd's ``LoadCredential=`` gives each inside the
#: unit (the certificate chain, its key, the client CA of mutual TLS) and ``ca``, the CA the
#: probes on the host trust (never handed to the unit).
TLS_PARTS = ("certificate", "key", "client-ca", "ca")


def tls_path(server: str, part: str) -> str:
    """Where the deploy writes a server's TLS file (root, 0600, in the 0700 environment folder).

    Example:
        >>> tls_path("chat", "key")
        '/etc/vllm-fleet/chat.tls-key.pem'
    """
    assert part in TLS_PARTS
    return f"{ENV_DIR}/{server}.tls-{part}.pem"


def tls_previous_path(server: str, part: str) -> str:
    """The saved copy of a server's TLS file while a change is tried (restored if it fails).

    Example:
        >>> tls_previous_path("chat", "key")
        '/var/lib/vllm-fleet/previous/chat.tls-key.pem'
    """
    assert part in TLS_PARTS
    return previous_path(f"{server}.tls-{part}.pem")


def credential_path(server: str, part: str) -> str:
    """Where the server's unit reads a TLS file: systemd's credentials folder of the unit
    (``LoadCredential=tls-PART:…``), readable by the unit's user alone, on a private ramfs.

    Example:
        >>> credential_path("chat", "key")
        '/run/credentials/vllm-chat.service/tls-key'
    """
    assert part in TLS_PARTS
    return f"/run/credentials/{unit_name(server)}/tls-{part}"


def previous_paths(server: str) -> tuple[str, str]:
    """The saved copies (unit, environment file) of a server's last working configuration.

    Example:
        >>> previous_paths("tiny")
        ('/var/lib/vllm-fleet/previous/vllm-tiny.service', '/var/lib/vllm-fleet/previous/tiny.env')
    """
    return previous_path(unit_name(server)), previous_path(f"{server}.env")


def previous_path(name: str) -> str:
    """The saved copy of one file vllm-fleet writes (a unit, an environment file), by its name.

    Example:
        >>> previous_path("vllm-big-ray.service")
        '/var/lib/vllm-fleet/previous/vllm-big-ray.service'
    """
    return f"{PREVIOUS_DIR}/{name}"


#: Each server's own directories live below a ``servers/`` folder of their own, so that no
#: server name can reach the tool's folders beside them (a server named ``models`` would
#: otherwise get the verified model store as its StateDirectory, handed to the service user;
#: one named ``previous`` the folder that restart-or-restore copies units back from).
SERVERS = "servers"


def server_dir(server: str) -> str:
    """A server's own folder, relative: the name its unit's ``StateDirectory=``,
    ``CacheDirectory=`` and ``RuntimeDirectory=`` take (below /var/lib, /var/cache, /run).

    Example:
        >>> server_dir("models")
        'vllm-fleet/servers/models'
    """
    return f"vllm-fleet/{SERVERS}/{server}"


def state_dir(server: str) -> str:
    """A server's ``StateDirectory=`` (relative to /var/lib)."""
    return server_dir(server)


def state_home(server: str) -> str:
    """A server's HOME: its state directory, absolute.

    Example:
        >>> state_home("tiny")
        '/var/lib/vllm-fleet/servers/tiny'
    """
    return f"/var/lib/{state_dir(server)}"


def cache_dir(server: str) -> str:
    """A server's cache folder, absolute (TMPDIR, vLLM's and torch's caches live below it)."""
    return f"/var/cache/{server_dir(server)}"


def runtime_dir(server: str) -> str:
    """A server's ``RuntimeDirectory=`` (relative to /run)."""
    return server_dir(server)


def runtime_path(server: str) -> str:
    """A server's runtime directory, absolute: ``/run/vllm-fleet/servers/tiny``."""
    return f"/run/{runtime_dir(server)}"


def gpu_device(index: int) -> str:
    """The device node of one GPU: ``/dev/nvidia0``."""
    return f"/dev/nvidia{index}"


def model_path(model: str) -> str:
    """Where a model is served from (a link to its verified version)."""
    return f"{MODELS_DIR}/{model}"


def remote_program(name: str) -> str:
    """Where a host-side program of the ``hostside`` package is on the host.

    Example:
        >>> remote_program("wait_healthy")
        '/usr/local/lib/vllm-fleet/hostside/wait_healthy.py'
    """
    return f"{HOSTSIDE_DIR}/{name}.py"


def program_command(program: str, *args: str, python: str = "python3") -> list[str]:
    """The command line that runs a host-side program on the host (the one way: by its file;
    see :mod:`hostside`). No secret ever goes into it: programs read them from files or stdin.

    Example:
        >>> program_command("check_ready", "--port", "18000")
        ['python3', '/usr/local/lib/vllm-fleet/hostside/check_ready.py', '--port', '18000']
    """
    return [python, remote_program(program), *args]


def cuda_home(version: str) -> str:
    """Where NVIDIA's toolkit package installs CUDA ``version``."""
    return f"/usr/local/cuda-{version}"


# -- endpoints (routers in front of replicas) --------------------------------------------------
#: The router's own venv (vllm-router, pinned), apart from vLLM's.
ROUTER_VENV_DIR = "/opt/vllm-fleet/router-venv"


def router_unit_name(endpoint: str) -> str:
    """The systemd unit of an endpoint's router: ``tiny`` → ``vllm-fleet-router-tiny.service``
    (``vllm-fleet-`` units are the tool's own: no server can be named so).

    Example:
        >>> router_unit_name("tiny")
        'vllm-fleet-router-tiny.service'
    """
    return f"vllm-fleet-router-{endpoint}.service"


def router_unit_path(endpoint: str) -> str:
    """Where an endpoint's router unit is written."""
    return f"{UNIT_DIR}/{router_unit_name(endpoint)}"


def router_env_path(endpoint: str) -> str:
    """The 0600 file with an endpoint's key on its router's host (read by the checks through
    the router, never by the router): ``/etc/vllm-fleet/router-tiny.env``.

    Example:
        >>> router_env_path("tiny")
        '/etc/vllm-fleet/router-tiny.env'
    """
    return f"{ENV_DIR}/router-{endpoint}.env"
# Monitoring (fleet/hostplan/monitoring.py): Debian's prometheus packages, their units changed
# through drop-ins only, the fleet's configuration beside Debian's (its own files stay untouched).
#: The fleet's Prometheus configuration and rules (read by the prometheus user).
PROMETHEUS_DIR = "/etc/prometheus/vllm-fleet"
PROMETHEUS_CONFIG = f"{PROMETHEUS_DIR}/prometheus.yml"
#: The rules file's name, beside the configuration (referred to relatively, so that a staged
#: configuration is checked with its own staged rules).
PROMETHEUS_RULES_NAME = "fleet-rules.yml"
PROMETHEUS_RULES = f"{PROMETHEUS_DIR}/{PROMETHEUS_RULES_NAME}"
#: The CA certificates Prometheus trusts for the https scrape of each TLS server (root-owned,
#: group prometheus, 0640; :func:`scrape_ca_path`).
PROMETHEUS_TLS_DIR = f"{PROMETHEUS_DIR}/tls"
#: Where a new configuration waits for ``promtool check config`` before it replaces the live one.
PROMETHEUS_STAGING = "/var/lib/vllm-fleet/prometheus-staged"
#: Debian's TSDB folder (kept across restarts and package upgrades).
PROMETHEUS_DATA = "/var/lib/prometheus/metrics2"
PROMETHEUS_DROPIN = "/etc/systemd/system/prometheus.service.d/50-vllm-fleet.conf"
NODE_EXPORTER_DROPIN = "/etc/systemd/system/prometheus-node-exporter.service.d/50-vllm-fleet.conf"
#: Debian's textfile collector folder (owned by the prometheus user).
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
GPU_TEXTFILE = f"{TEXTFILE_DIR}/vllm_fleet_gpu.prom"
GPU_METRICS_UNIT = "vllm-fleet-gpu-metrics.service"
ALERTMANAGER_CONFIG = f"{PROMETHEUS_DIR}/alertmanager.yml"
ALERTMANAGER_DATA = "/var/lib/prometheus/alertmanager"
ALERTMANAGER_DROPIN = "/etc/systemd/system/prometheus-alertmanager.service.d/50-vllm-fleet.conf"


def scrape_ca_path(host: str, server: str) -> str:
    """The CA file Prometheus trusts for server ``server`` of host ``host`` (``@`` is in no
    host or server name, so two pairs never share a file).

    Example:
        >>> scrape_ca_path("box", "secure")
        '/etc/prometheus/vllm-fleet/tls/secure@box.ca.pem'
    """
    return f"{PROMETHEUS_TLS_DIR}/{server}@{host}.ca.pem"


#: What `fleet drift --textfile` writes for the node exporter (vllm_fleet_drift_findings).
DRIFT_TEXTFILE = f"{TEXTFILE_DIR}/vllm_fleet_drift.prom"
#: The model installer's log of installs (one JSON line each: model, seconds, when it ended).
MODEL_INSTALLS = f"{MODELS_DIR}/.installs.jsonl"
#: The deploy's record of each server's starts, in phases (hostside/startup_phases.py).
STARTUPS_DIR = "/var/lib/vllm-fleet/startups"


def startup_record(server: str) -> str:
    """Where the deploy records server ``server``'s starts (one JSON line a start).

    Example:
        >>> startup_record("chat")
        '/var/lib/vllm-fleet/startups/chat.jsonl'
    """
    return f"{STARTUPS_DIR}/{server}.jsonl"


def ray_unit_name(server: str) -> str:
    """The Ray head unit of a server across hosts over Ray: ``big`` → ``vllm-big-ray.service``."""
    return f"vllm-{server}-ray.service"


def ray_unit_path(server: str) -> str:
    """Where a server's Ray head unit is written."""
    return f"{UNIT_DIR}/{ray_unit_name(server)}"


def ray_runtime_dir(server: str) -> str:
    """The Ray head unit's ``RuntimeDirectory=`` (relative to /run): Ray's ``--temp-dir`` (its
    session, sockets and logs), shared with the head's vLLM unit, whose Ray driver connects to
    the local node through the sockets there.

    Example:
        >>> ray_runtime_dir("big")
        'vllm-fleet/ray/big'
    """
    return f"vllm-fleet/ray/{server}"
