"""Read a model's sizing input from files: its config.json, and its safetensors' total size.

A model's ``config`` may name a ``config.json`` or a folder holding a local copy of the model,
relative to the fleet file. From the config, the keys of :class:`fleet.spec.models.ModelConfig` are
taken (a multimodal model's ``text_config`` overrides the top level); the rest is ignored.
Beside it, ``model.safetensors.index.json`` gives the weights' size (``metadata.total_size``),
or else the headers of the ``*.safetensors`` files do (only the header is read, never the
tensors).

Example:
    >>> import json, tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 2,
    ...     "num_attention_heads": 4, "hidden_size": 64, "rope_theta": 10000.0}))
    >>> read_config(folder / "config.json").head_size
    16
    >>> safetensors_bytes(folder) is None
    True
"""

from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fleet.read.problems import Finding
from fleet.read.source import LFS_POINTER, TextProblem, lfs_pointer, read_bounded
from fleet.spec.models import Fleet, ModelConfig

#: The largest config.json read (real ones are a few KiB; a vision model's up to a few hundred).
MAX_CONFIG = 4 << 20
#: The largest model.safetensors.index.json read (a 600-GB model's is about 10 MiB).
MAX_INDEX = 32 << 20
#: The largest safetensors header read, and all headers of a folder together.
MAX_HEADER = 16 << 20
MAX_HEADERS = 64 << 20
#: Nesting of a config.json, and digits of its numbers, beyond which it is not a config.
MAX_JSON_DEPTH = 64
MAX_DIGITS = 20
_LFS_HINT = ("the folder was cloned without Git LFS: run git lfs install && git lfs pull in it "
             "(or download the files from the Hub)")


class SizingError(ValueError):
    """A config or safetensors file that cannot be used, with a hint."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


def _bounded_int(text: str) -> int:
    """A JSON integer, refused before conversion when it has too many digits."""
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise SizingError(f"a number of {len(text.lstrip('-'))} digits")
    return int(text)


def _depth(data: Any) -> int:
    """How deeply JSON data nests (iteratively, so that depth itself cannot crash it)."""
    deepest, todo = 0, [(data, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            if deepest > MAX_JSON_DEPTH:
                return deepest
            todo.extend((child, level + 1) for child in
                        (item.values() if isinstance(item, dict) else item))
    return deepest


def read_json(path: Path, shown: str, limit: int) -> Any:
    """JSON data of a regular file of at most ``limit`` bytes; raise SizingError naming what
    is wrong (not a file, too large, a Git LFS pointer, not JSON, too deep, huge numbers).

    Example:
        >>> read_json(Path("/dev/zero"), "/dev/zero", 10)
        Traceback (most recent call last):
        ...
        fleet.planner.sizing.SizingError: /dev/zero is not a regular file
    """
    try:
        raw = read_bounded(path, limit)
    except TextProblem as err:
        raise SizingError(str(err).replace(str(path), shown, 1)) from None
    if lfs_pointer(raw):
        raise SizingError(f"{shown} is a Git LFS pointer, not the file; {_LFS_HINT}")
    try:
        data = json.loads(raw.decode("utf-8"), parse_int=_bounded_int)
    except SizingError as err:
        raise SizingError(f"{shown}: {err}", "this is not a model's config.json") from None
    except RecursionError:
        raise SizingError(f"{shown} is nested more than {MAX_JSON_DEPTH} levels deep",
                          "this is not a model's config.json") from None
    except UnicodeDecodeError:
        raise SizingError(f"{shown} is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise SizingError(f"{shown} is not JSON ({err.msg} at line {err.lineno})") from None
    if _depth(data) > MAX_JSON_DEPTH:
        raise SizingError(f"{shown} is nested more than {MAX_JSON_DEPTH} levels deep",
                          "this is not a model's config.json")
    return data


def config_keys(data: dict[str, Any]) -> dict[str, Any]:
    """The sizing keys of a config.json's data (``text_config`` wins over the top level).

    Example:
        >>> config_keys({"vision_config": {}, "text_config": {"num_hidden_layers": 28},
        ...              "num_hidden_layers": 1, "use_cache": True})
        {'num_hidden_layers': 28}
    """
    wanted = set(ModelConfig.model_fields)
    merged = {key: value for key, value in data.items() if key in wanted}
    text = data.get("text_config")
    if isinstance(text, dict):
        merged.update({key: value for key, value in text.items() if key in wanted})
    return merged


def read_config(path: Path, shown: str | None = None) -> ModelConfig:
    """The sizing keys of a config.json file; raise SizingError naming what is wrong.

    ``shown`` is how the path is named in messages (as the fleet file writes it).
    """
    shown = shown or str(path)
    try:
        data = read_json(path, shown, MAX_CONFIG)
    except OSError as err:
        raise SizingError(
            f"cannot read {shown}: {err.strerror}",
            "config is a path relative to the fleet file, or the keys inline",
        ) from None
    if not isinstance(data, dict):
        raise SizingError(f"{shown} is not a JSON object")
    try:
        return ModelConfig.model_validate(config_keys(data))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise SizingError(f"{shown}: {where}: {first['msg']}") from None


def _header_bytes(path: Path, budget: list[int]) -> int:
    """Bytes of the tensors in one safetensors file, from its header alone.

    ``budget``: header bytes still allowed for this folder (decreased here).
    """
    name = path.name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise SizingError(f"cannot read {name}: {err.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SizingError(f"{name} is not a regular file")
        raw = handle.read(8)
        if lfs_pointer(raw + handle.read(len(LFS_POINTER) - 8)):
            raise SizingError(f"{name} is a Git LFS pointer, not the file; {_LFS_HINT}")
        handle.seek(8)
        if len(raw) != 8:
            raise SizingError(f"{name} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        if length > min(MAX_HEADER, budget[0]):
            raise SizingError(f"{name} is not a safetensors file (header of {length} bytes)",
                              "give the model's weights_gib instead")
        budget[0] -= length
        try:
            header = json.loads(handle.read(length), parse_int=_bounded_int)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, SizingError):
            raise SizingError(f"{name} has no readable safetensors header") from None
    if not isinstance(header, dict):
        kind = "list" if isinstance(header, list) else type(header).__name__
        raise SizingError(f"{name}: the header is a JSON {kind}, not the object of tensors a "
                          "safetensors file starts with", "give the model's weights_gib instead")
    total = 0
    for tensor, info in header.items():
        if tensor == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        ints = isinstance(offsets, list) and len(offsets) == 2 and all(
            isinstance(n, int) and not isinstance(n, bool) for n in offsets)
        if not ints:
            raise SizingError(f"{name}: tensor {tensor!r} has no data_offsets [begin, end]")
        begin, end = offsets
        if not 0 <= begin <= end:
            raise SizingError(f"{name}: tensor {tensor!r} has data_offsets {offsets} "
                              "(not 0 <= begin <= end)")
        total += end - begin
    return total


def safetensors_bytes(folder: Path) -> int | None:
    """The weights' size in a local model folder, or None if it has no safetensors.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "model.safetensors.index.json").write_text(
        ...     '{"metadata": {"total_size": 16381470720}, "weight_map": {}}')
        >>> safetensors_bytes(folder)
        16381470720
    """
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            data = read_json(index, index.name, MAX_INDEX)
        except OSError as err:
            raise SizingError(f"cannot read {index.name}: {err.strerror}") from None
        meta = data.get("metadata") if isinstance(data, dict) else None
        total = meta.get("total_size") if isinstance(meta, dict) else None
        if isinstance(total, int) and not isinstance(total, bool) and total > 0:
            return total
        raise SizingError(f"{index.name} has no metadata.total_size (a whole number of bytes)")
    files = sorted(path for path in folder.glob("*.safetensors"))
    if not files:
        return None
    budget = [MAX_HEADERS]
    return sum(_header_bytes(path, budget) for path in files)


def resolve_model_files(fleet: Fleet, base: Path) -> Iterator[Finding]:
    """Read every model's config file (and safetensors beside it) into the model.

    ``base`` is the fleet file's folder. Yields a located problem for each unreadable file.
    """
    for name, model in fleet.models.items():
        if not isinstance(model.config, str):
            continue
        try:
            model._file_config, model._file_weights_bytes = _read_local(
                base, model.config, model.weights_gib is None
            )
        except SizingError as err:
            yield (("models", name, "config"), str(err), err.hint)
        except (OSError, ValueError, RuntimeError) as err:  # a bad path (a NUL, ~nobody/)
            yield (("models", name, "config"), f"cannot read {model.config!r}: {err}", None)


def _read_local(base: Path, written: str, weights: bool) -> tuple[ModelConfig, int | None]:
    """A model's config (and, if ``weights``, the safetensors' size) from a path as written."""
    path = (base / Path(written).expanduser()).resolve()
    folder = path if path.is_dir() else path.parent
    shown = written
    if path.is_dir():
        path = path / "config.json"
        shown = str(Path(written) / "config.json")
    return read_config(path, shown), safetensors_bytes(folder) if weights else None
