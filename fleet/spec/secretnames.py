"""Which flags and environment variables carry secrets: by what they are, not by how they are
spelt.

The list is data, ``fleet/catalog/vllm_flags/secrets.json``, generated beside the flag lists by
``scripts/gen_vllm_releases.py`` from vLLM's code (the parser ``dest`` of each flag, the
variables each release reads), vllm-router's parser and the libraries vLLM downloads through.
A flag that merely holds the word ``token`` (``long-prefill-token-threshold``, a count) is not
a secret; ``hf-token`` is. A variable no code of the list reads (the user's own) is a secret
when its last word says so (``DB_PASSWORD``, ``MY_API_KEY``). Whatever the name, a value shaped
like a known credential (a Hugging Face token, an OpenAI or AWS key, a PEM private key) is one.

Example:
    >>> secret_flag("hf-token"), secret_flag("long-prefill-token-threshold")
    (True, False)
    >>> secret_env("HF_TOKEN"), secret_env("VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD")
    (True, False)
    >>> credential_shape("hf_" + "a1B2" * 9)
    'a Hugging Face token'
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

SECRETS_FILE = Path(__file__).resolve().parents[1] / "catalog" / "vllm_flags" / "secrets.json"
#: The last word of a variable's name that makes it a credential when no code of the list says
#: what the variable is.
_CREDENTIAL_END = re.compile(
    r"(?:^|_)(?:PASSWORD|PASSWD|SECRET|TOKEN|API_?KEY|SECRET_?KEY|ACCESS_?KEY|PRIVATE_?KEY)\Z",
    re.IGNORECASE,
)
#: Values that are credentials whatever they are called (never printed: only their kind is).
_SHAPES = (
    (re.compile(r"hf_[A-Za-z0-9]{30,}"), "a Hugging Face token"),
    (re.compile(r"sk-(?:proj-|svcacct-|admin-|ant-)?(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{32,}"),
     "an API key (sk-…)"),
    (re.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}"), "an AWS access key id"),
    (re.compile(r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})"), "a GitHub token"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
)


@cache
def catalogue() -> dict[str, Any]:
    """The generated data (``secrets.json``)."""
    return json.loads(SECRETS_FILE.read_text(encoding="utf-8"))


def secret_flag(name: str) -> bool:
    """Whether vLLM flag ``name`` (long, without dashes) carries a credential in any release.

    Example:
        >>> secret_flag("api-key"), secret_flag("allow-credentials")
        (True, False)
    """
    return name in catalogue()["flags"]


def flag_instead(name: str) -> str:
    """What the fleet file writes instead of secret flag ``name`` given inline.

    Example:
        >>> flag_instead("hf-token")
        'env: {HF_TOKEN: {env: NAME}} (huggingface_hub reads HF_TOKEN)'
    """
    return catalogue()["flags"][name]["instead"]


def release_secret_flags(version: str) -> list[str]:
    """The secret flags of exactly ``version``'s flag list ([] for a release without a list).

    Example:
        >>> release_secret_flags("0.32.0")
        ['api-key', 'hf-token']
    """
    entry = catalogue()["vllm"].get(version)
    return list(entry["flags"]) if entry else []


def router_secret_flags() -> set[str]:
    """vllm-router's flags that carry a credential, in any release read.

    Example:
        >>> sorted(router_secret_flags())
        ['api-key']
    """
    return {flag for entry in catalogue()["router"].values() for flag in entry["flags"]}


def secret_env(name: str) -> bool:
    """Whether environment variable ``name`` holds a credential: one that vLLM or a library it
    loads reads as one, or one that no code of the list defines whose last word says so.

    Example:
        >>> secret_env("S3_SECRET_ACCESS_KEY"), secret_env("DB_PASSWORD")
        (True, True)
        >>> secret_env("VLLM_MAX_BAD_WORDS_TOTAL_TOKENS"), secret_env("OMP_NUM_THREADS")
        (False, False)
    """
    data = catalogue()
    if name in data["env"]:
        return True
    if name in data["not_secret"]:
        return False
    return bool(_CREDENTIAL_END.search(name))


def credential_shape(value: str) -> str | None:
    """The kind of credential ``value`` looks like (never the value), or None.

    Example:
        >>> credential_shape("AKIA" + "A" * 16), credential_shape("bfloat16")
        ('an AWS access key id', None)
    """
    for shape, kind in _SHAPES:
        if shape.search(value):
            return kind
    return None
