#!/usr/bin/env python3
"""Generate the tiny Llama test model and its reproducible archive.

The archive ``tiny-llama.tar.gz`` is what the tests and the quick start deploy: a real
``LlamaForCausalLM`` that vLLM (CPU build) loads and serves, small enough to commit (< 1 MB).
Every run produces a byte-identical archive, independent of the time, the user and the
process (weights from a fixed numpy seed, a tokenizer trained on fixed license texts, a
normalised tar stream, gzip with mtime 0), so its SHA256 can stand in a fleet file.

Model: hidden 64, 2 layers, 4 attention heads, 2 KV heads, head_dim 32 (vLLM's CPU attention
needs head_dim >= 32), intermediate 128, vocabulary 2048 (byte-level BPE), bfloat16 weights.
bfloat16 is vLLM CPU's native dtype (AVX512-BF16/AMX kernels; float32 runs through slower
paths) and halves the archive size.

Generation needs numpy, safetensors and tokenizers (the ``dev`` extra), not torch. The
committed archive was made with numpy 2.4.6, safetensors 0.8.0, tokenizers 0.23.3, Python
3.11.7 (zlib 1.2.13); other versions may serialise differently, which is why the archive itself
is committed beside this generator.

Example::

    $ python testmodel/make_tiny_model.py     # writes testmodel/tiny-llama.tar.gz(.sha256)
    $ python testmodel/make_tiny_model.py --out-dir /tmp/m --keep-dir /tmp/m/unpacked
    ...
    sha256 <64 hex>  tiny-llama.tar.gz
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

NAME = "tiny-llama"
ARCHIVE = f"{NAME}.tar.gz"
SEED = 20240611
MTIME = 1704067200  # 2024-01-01T00:00:00Z, the fixed mtime of every archive entry

HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
INTERMEDIATE = 128
VOCAB = 2048
MAX_POS = 2048
DTYPE = "bfloat16"

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
BOS, EOS, PAD, END = "<s>", "</s>", "<pad>", "<|end|>"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# Tokenizer training text: canonical license texts shipped by Debian/Ubuntu's base-files.
# Their digests are pinned so that a different text fails loudly instead of silently
# producing another tokenizer (and another archive digest).
CORPUS_DIR = Path("/usr/share/common-licenses")
CORPUS = {
    "Apache-2.0": "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30",
    "Artistic": "b7fd9b73ea99602016a326e0b62e6646060d18febdd065ceca8bb482208c3d88",
    "BSD": "5d588eb3b157d52112afea935c88a7ff9efddc1e2d95a42c25d3b96ad9055008",
    "CC0-1.0": "a2010f343487d3f7618affe54f789f5487602331c0a8d03f49e9a7c547cf0499",
    "GFDL-1.2": "d8e94ae5fdb5433fcae2961aeb1a8cf17174d6f4a0465d24bf37dd8a038bd439",
    "GFDL-1.3": "110535522396708cea37c72a802c5e7e81391139f5f7985631c93ef242b206a4",
    "GPL-1": "d77d235e41d54594865151f4751e835c5a82322b0e87ace266567c3391a4b912",
    "GPL-2": "8177f97513213526df2cf6184d8ff986c675afb514d4e68a404010521b880643",
    "GPL-3": "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986",
    "LGPL-2": "681e386e44a19d7d0674b4320272c90e66b6610b741e7e6305f8219c42e85366",
    "LGPL-2.1": "dc626520dcd53a22f727af3ee42c770e56c97a64fe3adb063799d8ab032fe551",
    "LGPL-3": "e3a994d82e644b03a792a930f574002658412f62407f5fee083f2555c5f23118",
    "MPL-1.1": "f849fc26a7a99981611a3a370e83078deb617d12a45776d6c4cada4d338be469",
    "MPL-2.0": "fab3dd6bdab226f1c08630b1dd917e11fcb4ec5e1e020e2c16f83a0a13863e85",
}


class CorpusError(RuntimeError):
    """The tokenizer training text is missing or is not the pinned text."""


def load_corpus(directory: Path = CORPUS_DIR) -> list[str]:
    """Return the pinned license texts, in sorted name order.

    texts = load_corpus()
    len(texts)
    # → 14
    """
    texts = []
    for name in sorted(CORPUS):
        path = directory / name
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CorpusError(f"tokenizer corpus file missing: {path} ({exc})") from exc
        digest = hashlib.sha256(data).hexdigest()
        if digest != CORPUS[name]:
            raise CorpusError(f"{path}: sha256 {digest}, expected {CORPUS[name]}")
        texts.append(data.decode("utf-8"))
    return texts


def train_tokenizer(texts: list[str]):
    """Train a byte-level BPE tokenizer of exactly ``VOCAB`` tokens (single-threaded)."""
    import os

    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=1,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    size = tok.get_vocab_size()
    if size != VOCAB:
        raise RuntimeError(f"tokenizer has {size} tokens, expected {VOCAB}")
    return tok


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32/64 array → its bfloat16 bit patterns as little-endian uint16 (round to even)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.ascontiguousarray(rounded.astype("<u2"))


def make_weights() -> dict[str, np.ndarray]:
    """Llama weights (HF names) from a fixed seed, as float32 arrays."""
    rng = np.random.Generator(np.random.PCG64(SEED))

    def normal(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    ones = np.ones(HIDDEN, dtype=np.float32)
    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = normal(HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.k_proj.weight"] = normal(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.v_proj.weight"] = normal(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = normal(HIDDEN, HEADS * HEAD_DIM)
        w[p + "mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        w[p + "mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        w[p + "mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
        w[p + "input_layernorm.weight"] = ones.copy()
        w[p + "post_attention_layernorm.weight"] = ones.copy()
    w["model.norm.weight"] = ones.copy()
    w["lm_head.weight"] = normal(VOCAB, HIDDEN)
    return w


def write_safetensors(weights: dict[str, np.ndarray], path: Path) -> None:
    """Write bfloat16 tensors with safetensors' own serializer (numpy buffers, no torch).

    numpy has no bfloat16, so the bit patterns travel as uint16 buffers declared "bfloat16".
    safetensors >= 0.8 takes ``TensorSpec`` objects, older releases plain dicts.
    """
    import safetensors

    bufs = {name: to_bf16_bits(a) for name, a in sorted(weights.items())}
    spec = getattr(safetensors, "TensorSpec", None)
    if spec is not None:
        tensors = {
            name: spec(
                dtype="bfloat16", shape=list(b.shape), data_ptr=b.ctypes.data, data_len=b.nbytes
            )
            for name, b in bufs.items()
        }
    else:
        tensors = {
            name: {"dtype": "bfloat16", "shape": list(b.shape), "data": b.tobytes()}
            for name, b in bufs.items()
        }
    safetensors.serialize_file(tensors, str(path), metadata={"format": "pt"})
    del bufs  # kept alive until here: TensorSpec holds raw pointers into them


def dump_json(obj: dict, path: Path) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_model_dir(model_dir: Path) -> None:
    """Write the complete Hugging Face model directory into ``model_dir``."""
    model_dir.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(load_corpus())
    tok.save(str(model_dir / "tokenizer.json"), pretty=True)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": MAX_POS,
        "vocab_size": VOCAB,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_cache": True,
        "torch_dtype": DTYPE,
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[PAD],
    }
    dump_json(config, model_dir / "config.json")
    dump_json(
        {
            "bos_token_id": ids[BOS],
            "eos_token_id": [ids[EOS], ids[END]],
            "pad_token_id": ids[PAD],
            "do_sample": False,
            "max_length": MAX_POS,
        },
        model_dir / "generation_config.json",
    )
    added = {
        str(ids[t]): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    dump_json(
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "add_bos_token": True,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": MAX_POS,
            "added_tokens_decoder": added,
            "chat_template": CHAT_TEMPLATE,
        },
        model_dir / "tokenizer_config.json",
    )
    dump_json(
        {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD},
        model_dir / "special_tokens_map.json",
    )
    write_safetensors(make_weights(), model_dir / "model.safetensors")
    for path in model_dir.iterdir():  # safetensors writes 0600; vLLM's user must read them
        path.chmod(0o644)


def pack(model_dir: Path, archive: Path, top: str = NAME) -> str:
    """Pack ``model_dir`` as ``top/…`` into a normalised .tar.gz; return its sha256.

    Sorted entries, fixed mtime, uid/gid 0, owner root, modes 0755 (dirs) / 0644 (files),
    ustar format, gzip without file name and with mtime 0.
    """
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:

        def add(arcname: str, path: Path | None) -> None:
            info = tarfile.TarInfo(arcname)
            info.mtime = MTIME
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if path is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                return
            data = path.read_bytes()
            info.mode, info.size = 0o644, len(data)
            tar.addfile(info, io.BytesIO(data))

        add(top, None)
        for path in sorted(model_dir.rglob("*"), key=lambda p: p.relative_to(model_dir).as_posix()):
            rel = path.relative_to(model_dir).as_posix()
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                raise ValueError(f"unsupported entry in model dir: {path}")
            add(f"{top}/{rel}", None if path.is_dir() else path)

    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=9, mtime=0) as gz:
        gz.write(buf.getvalue())
    data = out.getvalue()
    archive.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def build(out_dir: Path, keep_dir: Path | None = None) -> str:
    """Generate the model, write ``out_dir/tiny-llama.tar.gz`` and its ``.sha256``.

    ``keep_dir``: also leave the unpacked model directory there. Returns the sha256.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tiny-llama-") as tmp:
        model_dir = keep_dir if keep_dir is not None else Path(tmp) / NAME
        if model_dir.exists() and any(model_dir.iterdir()):
            raise FileExistsError(f"model directory not empty: {model_dir}")
        write_model_dir(model_dir)
        digest = pack(model_dir, out_dir / ARCHIVE)
    (out_dir / f"{ARCHIVE}.sha256").write_text(f"{digest}  {ARCHIVE}\n", encoding="ascii")
    return digest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=Path(__file__).resolve().parent,
        help="where tiny-llama.tar.gz and its .sha256 go (default: beside this script)",
    )
    parser.add_argument("--keep-dir", type=Path, help="also keep the unpacked model directory")
    args = parser.parse_args(argv)
    try:
        digest = build(args.out_dir, args.keep_dir)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    size = (args.out_dir / ARCHIVE).stat().st_size
    print(f"wrote {args.out_dir / ARCHIVE} ({size} bytes)")
    print(f"sha256 {digest}  {ARCHIVE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
