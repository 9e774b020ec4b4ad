"""The committed tiny test model: safe, well-formed, servable by vLLM CPU, and reproducible."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

TESTMODEL = Path(__file__).resolve().parents[2] / "testmodel"
ARCHIVE = TESTMODEL / "tiny-llama.tar.gz"
SHA_FILE = TESTMODEL / "tiny-llama.tar.gz.sha256"
GENERATOR = TESTMODEL / "make_tiny_model.py"
TOP = "tiny-llama"
REQUIRED = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


def committed_sha() -> str:
    digest, name = SHA_FILE.read_text().split()
    assert name == ARCHIVE.name
    return digest


def member_bytes(name: str) -> bytes:
    with tarfile.open(ARCHIVE) as tar:
        f = tar.extractfile(f"{TOP}/{name}")
        assert f is not None
        return f.read()


def test_committed_digest_matches_archive():
    assert hashlib.sha256(ARCHIVE.read_bytes()).hexdigest() == committed_sha()
    assert ARCHIVE.stat().st_size < 1_000_000


def test_archive_members_are_safe_and_normalised():
    with tarfile.open(ARCHIVE) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert names[0] == TOP
    for m in members:
        assert not m.name.startswith("/"), m.name
        assert ".." not in Path(m.name).parts, m.name
        assert m.name == TOP or m.name.startswith(f"{TOP}/"), m.name
        assert (m.uid, m.gid, m.uname, m.gname) == (0, 0, "root", "root")
        if m.isdir():
            assert m.mode == 0o755, m.name
        else:
            assert m.isfile(), f"{m.name}: not a regular file"
            assert m.mode == 0o644, f"{m.name}: mode {m.mode:o}"
    assert {n.split("/", 1)[1] for n in names if "/" in n} >= REQUIRED


def test_config_fits_vllm_cpu():
    cfg = json.loads(member_bytes("config.json"))
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["head_dim"] >= 32  # vLLM CPU: smaller head_dim passes /health, dies on requests
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
    assert (cfg["hidden_size"], cfg["num_hidden_layers"]) == (64, 2)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (4, 2)
    assert cfg["max_position_embeddings"] >= 512
    assert cfg["torch_dtype"] == "bfloat16"

    tok_cfg = json.loads(member_bytes("tokenizer_config.json"))
    assert "messages" in tok_cfg["chat_template"]
    tok = json.loads(member_bytes("tokenizer.json"))
    assert tok["model"]["type"] == "BPE"
    vocab = len(tok["model"]["vocab"])
    assert 1500 <= vocab <= cfg["vocab_size"]


def test_weights_match_config():
    """Parse the safetensors header (plain JSON) and check shapes against config.json."""
    cfg = json.loads(member_bytes("config.json"))
    blob = member_bytes("model.safetensors")
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    assert header["model.embed_tokens.weight"]["shape"] == [cfg["vocab_size"], h]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        assert header[p + "q_proj.weight"]["shape"] == [q, h]
        assert header[p + "k_proj.weight"]["shape"] == [kv, h]
        assert header[p + "o_proj.weight"]["shape"] == [h, q]
    assert {t["dtype"] for k, t in header.items() if k != "__metadata__"} == {"BF16"}
    assert max(t["data_offsets"][1] for k, t in header.items() if k != "__metadata__") == (
        len(blob) - 8 - n
    )


def test_generator_reproduces_committed_archive(tmp_path: Path):
    for mod in ("numpy", "safetensors", "tokenizers"):
        pytest.importorskip(mod, reason=f"{mod} not installed: pip install -e '.[dev]'")
    out = tmp_path / "out"
    for run in (1, 2):  # two independent processes (hash seeds, thread pools) must agree
        proc = subprocess.run(
            [sys.executable, str(GENERATOR), "--out-dir", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode == 2 and "corpus" in proc.stderr:
            pytest.skip(f"tokenizer training text unavailable: {proc.stderr.strip()}")
        assert proc.returncode == 0, proc.stderr
        digest = hashlib.sha256((out / ARCHIVE.name).read_bytes()).hexdigest()
        assert digest == committed_sha(), (
            f"run {run}: regenerated archive {digest} differs from the committed one; "
            "if numpy/safetensors/tokenizers versions moved, that is expected: "
            "the committed archive is the reference (see make_tiny_model.py)"
        )
        assert (out / SHA_FILE.name).read_text() == SHA_FILE.read_text()
