"""The typed strings of the fleet file: every value that reaches a host file, a command line or
an ssh_config is one of these.

The fleet file is a trust boundary (the deploy runs as root on every host, and the file is
written by many hands). Each type matches the *whole* string (``re.fullmatch``: Python's ``$``
also matches before a trailing newline), refuses control characters, and says what to write
instead. ASCII classes only (``[0-9]``, not ``\\d``, which also takes full-width digits).

Example:
    >>> from pydantic import TypeAdapter, ValidationError
    >>> TypeAdapter(HostAddress).validate_python("gpu-01.example.com")
    'gpu-01.example.com'
    >>> try:
    ...     TypeAdapter(HostAddress).validate_python("ubuntu@10.0.0.11")
    ... except ValidationError as error:
    ...     print(error.errors()[0]["msg"])
    Value error, 'ubuntu@10.0.0.11' is not an IP address or host name: put the user in ssh.user
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated

from pydantic import AfterValidator

from fleet.spec.addresses import check_address, parse_ip

#: Characters no value of the fleet file may hold outside free text (C0, DEL, C1, line and
#: paragraph separators, and the invisible formatting characters such as zero-width spaces).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u2060\ufeff]")

_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_PATH = re.compile(r"(?:/|~/)[A-Za-z0-9._/+@-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: sysctl.d keys and the values written here (also :func:`fleet.hostplan.quoting.sysctl_line`'s
#: wall).
SYSCTL_KEY = re.compile(r"[a-z0-9_]+(?:\.[A-Za-z0-9_*-]+)+")
SYSCTL_VALUE = re.compile(r"[A-Za-z0-9 ._:,+-]{1,256}")
_URL = re.compile(r"(https?)://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/[!-~]*)?")
_HF_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_NEGATIVE_NUMBER = re.compile(r"-[0-9]+(\.[0-9]+)?")


def describe(char: str) -> str:
    """A character as a person can find it: ``'\\xa0'`` → ``U+00A0 NO-BREAK SPACE``.

    Example:
        >>> describe("\\n"), describe("\\u200b")
        ('U+000A (a line break)', 'U+200B ZERO WIDTH SPACE')
    """
    if char in "\n\r\u2028\u2029":
        return f"U+{ord(char):04X} (a line break)"
    return f"U+{ord(char):04X} {unicodedata.name(char, 'control character')}"


def refuse_control(value: str, what: str = "the value") -> str:
    """``value``, or ValueError naming the first control or invisible character in it.

    Example:
        >>> refuse_control("ok")
        'ok'
        >>> refuse_control("x\\nUser=root", "a flag value")
        Traceback (most recent call last):
        ...
        ValueError: a flag value cannot hold U+000A (a line break) (at position 2): it would end the line it is written on; write it on one line
    """  # noqa: E501
    found = _CONTROL.search(value)
    if found:
        raise ValueError(
            f"{what} cannot hold {describe(found.group())} (at position {found.start() + 1}): "
            "it would end the line it is written on; write it on one line"
            if found.group() in "\n\r\u2028\u2029"
            else f"{what} cannot hold {describe(found.group())} (at position "
            f"{found.start() + 1}); retype it without that character"
        )
    return value


def _host_address(value: str) -> str:
    """A host's address: ``sandbox``, or one address of
    :func:`fleet.spec.addresses.check_address`."""
    refuse_control(value, "an address")
    if value == "sandbox":
        return value
    return check_address(value, what="an address")


def _head_address(value: str) -> str:
    """An address other machines reach a host at: an IP address (not 0.0.0.0) or host name.

    Example:
        >>> _head_address("10.10.0.1")
        '10.10.0.1'
    """
    refuse_control(value, "an address")
    return check_address(value, what="an address")


def _server_bind(value: str) -> str:
    """What vLLM's ``--host`` binds: an IP address (0.0.0.0 or :: for every interface) or a
    host name (vLLM binds an AF_INET socket to it, which resolves the name).

    Example:
        >>> _server_bind("0.0.0.0"), _server_bind("gpu-01.lan")
        ('0.0.0.0', 'gpu-01.lan')
    """
    refuse_control(value, "the bind address")
    return check_address(value, what="the bind address", bind=True)


def _user(value: str) -> str:
    refuse_control(value, "a user name")
    if not _USER.fullmatch(value):
        raise ValueError(f"{value!r} is not a user name (lowercase letters, digits, _ and -)")
    return value


def _local_path(value: str) -> str:
    refuse_control(value, "a path")
    if not _PATH.fullmatch(value):
        raise ValueError(
            f"{value!r}: give its absolute path on the control machine (or ~/…), of letters, "
            "digits and . _ / + @ -"
        )
    return value


#: Kernel and device file systems: what is read there is not a file's content (``/dev/zero``
#: never ends, ``/proc/self/environ`` is the reader's own environment).
_NOT_FILES = ("/proc", "/sys", "/dev")


def kernel_tree(path: str) -> str | None:
    """The kernel or device tree ``path`` lies in (``/proc``, ``/sys``, ``/dev``), or None.

    Example:
        >>> kernel_tree("/proc/self/environ"), kernel_tree("/devices/x")
        ('/proc', None)
    """
    return next((top for top in _NOT_FILES if path == top or path.startswith(top + "/")), None)
#: The control machine's own login and system credentials: never a fleet's secret (the deploy
#: reads a secret file as root and writes it to the hosts).
_SYSTEM_CREDENTIALS = re.compile(
    r"/etc/(?:g?shadow-?|security/opasswd|sudoers(?:\.d/.*)?|ssh/ssh_host_[^/]*"
    r"|ssl/private/.*|krb5\.keytab)"
)
#: Folders that hold login keys (any user's): ``.ssh``, ``.gnupg``.
_KEY_FOLDERS = (".ssh", ".gnupg")


def secret_path_problem(path: str) -> str | None:
    """Why ``path`` (as written, or resolved) cannot be a secret file; None if it can be.

    The rules: no ``..`` segment (``~/secrets/../../../root/.ssh/id_ed25519`` is not in
    ~/secrets), nothing under ``/proc``, ``/sys`` or ``/dev``, not a folder (a trailing ``/``),
    and none of the control machine's own credentials (``/etc/shadow``, ``/etc/gshadow``, ssh
    host keys, ``/etc/ssl/private``, any ``.ssh`` or ``.gnupg`` folder).

    Example:
        >>> print(secret_path_problem("~/secrets/hf-token"))
        None
        >>> secret_path_problem("/etc/shadow")
        "/etc/shadow is one of the control machine's own credentials, not a fleet's secret"
    """
    parts = path.split("/")
    if ".." in parts:
        return f"{path} holds a '..' segment: the file it names is outside the folder written"
    if path.endswith("/"):
        return f"{path} names a folder (it ends with /)"
    top = kernel_tree(path)
    if top:
        return f"{path} is under {top}: a kernel or device file, not a file holding a secret"
    if _SYSTEM_CREDENTIALS.fullmatch(path) or any(part in _KEY_FOLDERS for part in parts):
        return f"{path} is one of the control machine's own credentials, not a fleet's secret"
    return None


def _secret_path(value: str) -> str:
    _local_path(value)
    problem = secret_path_problem(value)
    if problem:
        raise ValueError(f"{problem}; keep the secret in a file of its own, e.g. "
                         "~/secrets/NAME (chmod 600)")
    return value


def _env_name(value: str) -> str:
    refuse_control(value, "a variable name")
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not an environment variable name (letters, digits and _, not "
            "starting with a digit)"
        )
    return value


def _secret_variable(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        # Never echo it: a secret pasted where its variable's *name* belongs is still a secret.
        raise ValueError(
            "not an environment variable name (letters, digits and _, not starting with a "
            "digit); name the variable that holds the secret, never the secret itself"
        )
    return value


def _sysctl_key(value: str) -> str:
    if not SYSCTL_KEY.fullmatch(value):
        raise ValueError(f"{value!r} is not a sysctl key (like vm.swappiness)")
    return value


def _sysctl_value(value: str) -> str:
    refuse_control(value, "a sysctl value")
    if not SYSCTL_VALUE.fullmatch(value):
        raise ValueError(
            f"{value!r}: a sysctl value here is a number, or words of letters, digits and "
            "space . _ : , + - (e.g. \"4096 87380 6291456\")"
        )
    return value


def http_url(value: str, what: str = "a URL") -> str:
    """An http(s) URL of printable ASCII with no user or password in it.

    Example:
        >>> http_url("https://models.example/q.tar.gz")
        'https://models.example/q.tar.gz'
        >>> http_url("https://me:pw@models.example/q.tar.gz")
        Traceback (most recent call last):
        ...
        ValueError: a URL cannot carry a user or password (they would be on command lines and in logs); give the credentials as a secret reference (token: {env: NAME})
    """  # noqa: E501
    refuse_control(value, what)
    head = value.split("/", 3)[2] if value.count("/") >= 2 else ""
    if "@" in head:
        raise ValueError(
            f"{what} cannot carry a user or password (they would be on command lines and in "
            "logs); give the credentials as a secret reference (token: {env: NAME})"
        )
    if not _URL.fullmatch(value):
        raise ValueError(f"{value!r} is not an http:// or https:// URL")
    return value


def _wheel(value: str) -> str:
    refuse_control(value, "a wheel")
    if value.startswith("https://"):
        http_url(value, "a wheel URL")
    elif not _PATH.fullmatch(value) or not value.startswith("/"):
        raise ValueError(
            f"{value!r}: give an https:// URL or an absolute path on the host of a .whl file"
        )
    if not value.split("?", 1)[0].endswith(".whl"):
        raise ValueError(f"{value!r} does not name a .whl file")
    return value


def _hf_repo(value: str) -> str:
    refuse_control(value, "a repo id")
    if value.startswith(("http://", "https://")):
        tail = "/".join(value.split("/")[3:5])
        raise ValueError(f"give the repo id, not its URL: hf: {tail!r}")
    if not _HF_REPO.fullmatch(value):
        raise ValueError(f"{value!r} is not a Hugging Face repo id (like Qwen/Qwen3-8B)")
    return value


def option_word(value: str, what: str = "the value") -> str:
    """A word that goes on a command line as a value: it may not look like an option.

    A value or list item that began with ``-`` would be read as a flag of its own
    (``["*", "--host", "0.0.0.0"]`` would bind every interface past every check). Negative
    numbers are fine.

    Example:
        >>> option_word("auto"), option_word("-1")
        ('auto', '-1')
        >>> option_word("--host")
        Traceback (most recent call last):
        ...
        ValueError: the value cannot begin with '-' ('--host' would be read as an option of its own); set that option through its own key, or quote it differently
    """  # noqa: E501
    refuse_control(value, what)
    if value.startswith("-") and not _NEGATIVE_NUMBER.fullmatch(value):
        raise ValueError(
            f"{what} cannot begin with '-' ({value!r} would be read as an option of its own); "
            "set that option through its own key, or quote it differently"
        )
    return value


def _one_line(value: str) -> str:
    return refuse_control(value)


#: A Linux network interface name (at most 15 characters, IFNAMSIZ − 1).
_INTERFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")


def _interface(value: str) -> str:
    """A network interface name as NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME take one.

    Example:
        >>> _interface("ens8f0np0")
        'ens8f0np0'
    """
    refuse_control(value, "an interface name")
    if not _INTERFACE.fullmatch(value):
        raise ValueError(f"{value!r} is not a network interface name (letters, digits, . _ -; "
                         "at most 15 characters, like ens8f0 or bond0)")
    return value


#: A host's address (``sandbox``, an IP address or host name; fleet/spec/addresses.py's rules).
HostAddress = Annotated[str, AfterValidator(_host_address)]
#: An address other machines reach a host at (``multinode.head_address``).
HeadAddress = Annotated[str, AfterValidator(_head_address)]
#: What a vLLM server binds (``--host``): an IP address, every interface, or a host name.
ServerBind = Annotated[str, AfterValidator(_server_bind)]
UnixUser = Annotated[str, AfterValidator(_user)]
LocalPath = Annotated[str, AfterValidator(_local_path)]
#: A secret file on the control machine: a :data:`LocalPath` that
#: :func:`secret_path_problem` accepts (:mod:`fleet.hostplan.secrets` checks the file itself).
SecretPath = Annotated[str, AfterValidator(_secret_path)]
EnvName = Annotated[str, AfterValidator(_env_name)]
SecretVariable = Annotated[str, AfterValidator(_secret_variable)]
SysctlKey = Annotated[str, AfterValidator(_sysctl_key)]
SysctlValue = Annotated[str, AfterValidator(_sysctl_value)]
HttpUrl = Annotated[str, AfterValidator(http_url)]
WheelRef = Annotated[str, AfterValidator(_wheel)]
HfRepo = Annotated[str, AfterValidator(_hf_repo)]
OptionWord = Annotated[str, AfterValidator(option_word)]
OneLine = Annotated[str, AfterValidator(_one_line)]
InterfaceName = Annotated[str, AfterValidator(_interface)]


def _bind_address(value: str) -> str:
    """An IP address to listen on (``127.0.0.1``, ``0.0.0.0``, ``::1``): nothing else.

    Example:
        >>> _bind_address("::")
        '::'
    """
    refuse_control(value, "the bind address")
    try:
        named = parse_ip(value) is None
    except ValueError:
        named = False
    if named and not value.startswith("-"):
        raise ValueError(
            f"{value!r} is not an IP address to listen on: write 127.0.0.1 (this host only) "
            "or 0.0.0.0 (every interface)"
        )
    return check_address(value, what="the bind address", bind=True, names=False)


#: An IP address a service listens on (Prometheus, its exporters).
BindAddress = Annotated[str, AfterValidator(_bind_address)]


_NAME = r"[a-z0-9][a-z0-9._-]{0,62}"


def _replica_ref(value: str) -> str:
    """``host/server``: a server of the fleet by its host's and its own name.

    Example:
        >>> _replica_ref("gpu-01/chat")
        'gpu-01/chat'
    """
    refuse_control(value, "a replica")
    if not re.fullmatch(rf"{_NAME}/{_NAME}", value):
        raise ValueError(
            f"{value!r} is not a replica: write HOST/SERVER, the names of a host and of one of "
            "its servers (e.g. gpu-01/chat)"
        )
    return value


ReplicaRef = Annotated[str, AfterValidator(_replica_ref)]
_RELEASE = re.compile(r"[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}")


def _release(value: str) -> str:
    """A package's exact release, as pip pins it (``2.48.0``).

    Example:
        >>> _release("2.48.0")
        '2.48.0'
    """
    refuse_control(value, "a release")
    if not _RELEASE.fullmatch(value):
        raise ValueError(f"{value!r} is not an exact release: write three numbers, like 2.48.0")
    return value


#: An exact package release (``multinode.ray_version``).
Release = Annotated[str, AfterValidator(_release)]
