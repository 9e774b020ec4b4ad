"""Read a model's sizing input from files: its config.json, and its safetensors' total size.

A model's ``config`` may name a ``config.json`` or a folder holding a local copy of the model,
relative to the fleet file. From the config, the keys of :class:`fleet.spec.ModelConfig` are
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
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fleet.spec import Fleet, ModelConfig

Finding = tuple[tuple[str | int, ...], str, str | None]

#: Bytes per element of the dtypes safetensors headers name.
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
    "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
}
#: A safetensors header larger than this is not one (the format caps it at 100 MB).
MAX_HEADER = 100_000_000


class SizingError(ValueError):
    """A config or safetensors file that cannot be used, with a hint."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


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
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise SizingError(
            f"cannot read {shown}: {err.strerror}",
            "config is a path relative to the fleet file, or the keys inline",
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SizingError(f"{shown} is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise SizingError(f"{shown} is not a JSON object")
    try:
        return ModelConfig.model_validate(config_keys(data))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise SizingError(f"{shown}: {where}: {first['msg']}") from None


def _header_bytes(path: Path) -> int:
    """Bytes of the tensors in one safetensors file, from its header alone."""
    with path.open("rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise SizingError(f"{path} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER:
            raise SizingError(f"{path} is not a safetensors file (header of {length} bytes)")
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise SizingError(f"{path} has no readable safetensors header") from None
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
            total += int(end) - int(begin)
        except (KeyError, TypeError, ValueError):
            raise SizingError(f"{path}: tensor {name!r} has no data_offsets") from None
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
            return int(json.loads(index.read_text(encoding="utf-8"))["metadata"]["total_size"])
        except (OSError, ValueError, KeyError, TypeError):
            raise SizingError(f"{index} has no metadata.total_size") from None
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    return sum(_header_bytes(path) for path in files)


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
        except (OSError, ValueError) as err:
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
