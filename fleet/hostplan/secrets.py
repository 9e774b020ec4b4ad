"""Secrets by reference: examined at ``fleet check``, read on the control machine only when a
host plan is built, both within the same bounds.

A fleet file names a secret (``{env: NAME}`` or ``{file: PATH}``), never holds it. A secret file
is a path the deploy reads as root on the control machine and writes to the hosts, so it is held
to: absolute or ``~/…`` (a relative path is refused by the spec: a secret beside the fleet file
would sit in its repository), no ``..``, nothing under ``/proc``, ``/sys`` or ``/dev`` and none of
the machine's own credentials (:func:`fleet.spec.fields.secret_path_problem`, applied again to the
resolved path, so a symlink cannot lead there), a regular file (not a FIFO, socket, device or
folder: opened without blocking, checked by ``fstat``), at most :data:`MAX_SECRET_BYTES`, not
the fleet file itself, UTF-8, not empty and not a private key (ssh or TLS: a login credential).
A symlink is followed (secret mounts are symlinks), and its target is held to these rules. A file that every user may read is a warning; one
that does not exist here, or that this user may not read, is a warning at ``fleet check`` (it is
read where the deploy runs: ``fleet drift`` and ``fleet doctor`` work without it) and an error
when the deploy reads it. No message ever holds a secret's content.

Example:
    >>> import os
    >>> from fleet.spec.models import SecretRef
    >>> os.environ["FLEET_DOCTEST_KEY"] = "sk-test"
    >>> read_secret(SecretRef(env="FLEET_DOCTEST_KEY"))
    'sk-test'
    >>> read_secret(SecretRef.model_construct(env=None, file="/dev/zero"))  # past the spec
    Traceback (most recent call last):
    ...
    fleet.hostplan.secrets.SecretFileProblem: /dev/zero is under /dev: a kernel or device file, not a file holding a secret; keep the secret in a file of its own, e.g. ~/secrets/NAME (chmod 600)
"""  # noqa: E501

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from fleet.read.problems import Finding, Loc
from fleet.read.source import TextProblem, read_bounded
from fleet.spec.fields import secret_path_problem
from fleet.spec.models import Fleet, PemRef, SecretRef

#: The largest secret file read, in bytes (a token is under 1 KiB, a JSON service-account
#: credential a few KiB).
MAX_SECRET_BYTES = 64 << 10
#: The first line of a PEM or OpenSSH private key.
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
#: What to do about a secret file that cannot be one.
_FIX = "keep the secret in a file of its own, e.g. ~/secrets/NAME (chmod 600)"


class SecretFileProblem(ValueError):
    """A secret file that cannot be used; ``warning`` when only this machine lacks it."""

    def __init__(self, message: str, hint: str | None = _FIX, warning: bool = False):
        super().__init__(message + (f"; {hint}" if hint else ""))
        self.message, self.hint, self.warning = message, hint, warning


def _opened(written: str, fleet_file: Path | None = None) -> tuple[bytes, os.stat_result]:
    """The bytes of secret file ``written`` and its status, within every bound above."""
    problem = secret_path_problem(written)  # as written: the spec's rule, held here too
    if problem:
        raise SecretFileProblem(problem)
    path = Path(written).expanduser()
    try:
        real = path.resolve(strict=True)
    except FileNotFoundError:
        raise SecretFileProblem(f"{written} does not exist on this machine",
                                "create it (chmod 600) where the deploy runs",
                                warning=True) from None
    except (OSError, RuntimeError) as err:  # a symlink loop, a part that is not a folder
        raise SecretFileProblem(f"cannot read {written}: {getattr(err, 'strerror', None) or err}"
                                ) from None
    problem = secret_path_problem(str(real))
    if problem:
        shown = problem if str(real) == written else f"{written} leads to {problem}"
        raise SecretFileProblem(shown)
    try:
        info = os.stat(real)
        if fleet_file is not None and fleet_file.exists() and os.path.samefile(real, fleet_file):
            raise SecretFileProblem(f"{written} is the fleet file itself",
                                    "name the file that holds only the secret")
        if stat.S_ISDIR(info.st_mode):
            raise SecretFileProblem(f"{written} is a folder", "name the file in it")
        if not stat.S_ISREG(info.st_mode):  # checked again on the open file below
            raise SecretFileProblem(f"{written} is not a regular file (a FIFO, socket or device)")
        data = read_bounded(real, MAX_SECRET_BYTES)
    except TextProblem as err:
        if "larger than" in err.message:
            raise SecretFileProblem(f"{written} is larger than {MAX_SECRET_BYTES >> 10} KiB: "
                                    "not a secret") from None
        raise SecretFileProblem(f"{written} is not a regular file (a FIFO, socket or device)"
                                ) from None
    except PermissionError:
        raise SecretFileProblem(f"{written} cannot be read by this user", "the deploy reads it "
                                "as root; run fleet check as the deploy's user to check it",
                                warning=True) from None
    except OSError as err:
        raise SecretFileProblem(f"cannot read {written}: {err.strerror or err}") from None
    return data, info


def _text(data: bytes, written: str, pem: bool = False) -> str:
    """The secret in ``data`` as text; ``pem``: a PEM file (a TLS certificate or key, where a
    private key is what is asked for), else a token that may not be a private key."""
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise SecretFileProblem(f"{written} is not UTF-8 text", "a secret file holds one token "
                                "or key as text") from None
    if not text:
        raise SecretFileProblem(f"{written} is empty", "write the secret into it")
    if pem:
        if not text.startswith("-----BEGIN "):
            raise SecretFileProblem(f"{written} is not PEM (it does not begin with -----BEGIN)",
                                    "give the PEM file (openssl x509 -outform PEM, openssl pkey)")
        return text + "\n"
    if _PRIVATE_KEY.search(text):
        raise SecretFileProblem(f"{written} holds a private key (ssh or TLS), a login "
                                "credential, not a token or key a server is given")
    return text


def read_secret(ref: SecretRef) -> str:
    """Resolve a secret reference on the control machine; raise ValueError if it is missing or
    its file breaks a rule above (the message names the reference, never the content)."""
    pem = isinstance(ref, PemRef)
    if ref.env is not None:
        value = os.environ.get(ref.env)
        if not value:
            raise ValueError(f"environment variable {ref.env} is not set")
        if pem:
            return _text(value.encode(), f"environment variable {ref.env}", pem=True)
        return value.strip()
    assert ref.file is not None
    data, _ = _opened(ref.file)
    return _text(data, ref.file, pem=pem)


def secret_refs(value: object, path: Loc = ()) -> Iterator[tuple[Loc, SecretRef]]:
    """Every secret reference in a fleet (or any part of it), with its field path.

    Example:
        >>> from fleet.load import load_fleet
        >>> fleet = load_fleet("tests/data/valid/endpoint-two-replicas.yaml")
        >>> [".".join(map(str, path)) for path, _ in secret_refs(fleet)][:1]
        ['hosts.gpu-a.servers.chat-a.api_key']
    """
    if isinstance(value, SecretRef):
        yield path, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from secret_refs(getattr(value, name), (*path, name))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from secret_refs(item, (*path, key))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from secret_refs(item, (*path, index))


def secret_file_findings(fleet: Fleet, fleet_file: Path | None) -> tuple[list[Finding],
                                                                         list[Finding]]:
    """(errors, warnings) about every secret file of ``fleet``, read here as the deploy will.

    Example:
        >>> from fleet.load import load_fleet
        >>> secret_file_findings(load_fleet("inventory/sandbox.yaml"), None)
        ([], [])
    """
    errors: list[Finding] = []
    warnings: list[Finding] = []
    for path, ref in secret_refs(fleet):
        if ref.file is None:
            continue
        where = (*path, "file")
        try:
            data, info = _opened(ref.file, fleet_file)
            _text(data, ref.file, pem=isinstance(ref, PemRef))
        except SecretFileProblem as problem:
            (warnings if problem.warning else errors).append((where, problem.message,
                                                              problem.hint))
            continue
        if info.st_mode & stat.S_IROTH:
            warnings.append((where, f"{ref.file} is readable by every user of this machine "
                             f"(mode {stat.S_IMODE(info.st_mode):04o})", f"chmod 600 {ref.file}"))
    return errors, warnings
