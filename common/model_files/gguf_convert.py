"""GGUF → Hugging Face directory: config.json, tokenizer, and the small float tensors.

    GGUF file ──inspect_gguf──▶ header checked (parses, tensor extents, architecture)
              ──convert_gguf──▶ out_dir/ config.json  generation_config.json (gguf_config)
                                         model*.safetensors (float32: norms and biases;
                                                             every tensor with `full`)
                                         tokenizer.json  tokenizer_config.json (+ chat_template)
                                         decode_tokenizer.json (tokenizer_files)

The engine reads the matrices (linears, embedding) from the GGUF file itself
(scheduler_worker.loader): the cache keeps only the 1-D tensors, so it costs a few MB, not
a float32 copy of the model. `full` writes every tensor dequantized (an HF checkpoint that
transformers loads: the tests' and benchmarks' reference); `gguf_matrices` yields the
dequantized matrices for the engine's float path.

GGUF lists a tensor's dims reversed (ne0 first); the dequantized array already has the
row-major HF shape, so `reversed(t.shape)` is the HF shape. llama.cpp's converter permutes
the Q and K rows of llama-architecture models (its rope pairs adjacent dims, HF's pairs the
two halves of a head); `unpermute` undoes it where the family's GGUFSpec says so
(qk_permuted). The metadata's mapping onto config.json is common.model_files.gguf_config's,
with each family's own keys from its GGUFSpec.config (common/families).

Torch-free (numpy + gguf + safetensors.numpy). The tokenizer goes through transformers'
own GGUF tokenizer conversion, which imports torch: `common.model_files.model_source`
therefore runs this module in a child process (`python -m common.model_files.gguf_convert
SRC OUT`), which also hands the dequantized arrays' memory back when it exits.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from common.families import gguf_spec
from common.model_files.gguf_config import generation_config, hf_config, read_field
from common.model_files.gguf_header import GGUFHeader, gguf_blocks_header
from common.model_files.gguf_names import TOP_NAMES, hf_name, layer_tensor_names
from common.model_files.model_source import ModelSourceError
from common.model_files.tokenizer_files import finish_tokenizer_files

SHARD_BYTES = 2 << 30


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `w.reshape(n_head, 2, d // n_head // 2, *rest).swapaxes(1, 2)`:
    whole rows move, so it applies to a quantized tensor's rows of blocks as well."""
    rest = w.shape[1:]
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def inspect_gguf(path: Path) -> GGUFHeader:
    """The header of a well-formed, supported file (tensor extents and metadata checked),
    its metadata arrays decoded (the vocabulary: what the conversion needs). The engine,
    which needs only the tensors, skips them (gguf_header.gguf_blocks_header)."""
    return gguf_blocks_header(path, arrays=True)


def is_matrix(t) -> bool:
    """A GGUF tensor the engine reads from the file (a linear or the embedding), not the
    conversion cache: every tensor of two or more dims."""
    return len(t.shape) > 1


def dequantized(get, t) -> tuple[str | None, np.ndarray]:
    """(HF name or None when unknown, float32 array in HF's shape and row order); `get`
    reads a metadata scalar (key, default)."""
    import gguf

    arch = get("general.architecture")
    w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    w = w.reshape(tuple(reversed([int(d) for d in t.shape])))
    name = hf_name(t.name, arch)
    permuted = gguf_spec(arch).qk_permuted
    if name is not None and permuted and (".q_proj." in name or ".k_proj." in name):
        n_head = int(get(f"{arch}.attention.head_count"))
        if ".k_proj." in name:
            n_head = int(get(f"{arch}.attention.head_count_kv", n_head))
        w = unpermute(w, n_head)
    return name, w


def gguf_matrices(path: Path):
    """(HF name, float32 array) of every matrix of a GGUF file, dequantized: what the lean
    conversion leaves out, for the engine's float path (--quantization none). The header
    is read without building the vocabulary (gguf_blocks_header: GGUFReader takes seconds)."""
    header = gguf_blocks_header(Path(path))
    for t in header.tensors:
        if is_matrix(t):
            name, w = dequantized(header.get, t)
            if name is None:
                raise ModelSourceError(f"GGUF file {path}: unexpected tensor {t.name}")
            yield name, w


def convert_gguf(gguf_path: Path, out_dir: Path, progress: bool = True, full: bool = False) -> None:
    """Write an HF-format directory for `gguf_path` into the existing directory `out_dir`:
    the 1-D tensors only, or with `full` every tensor."""
    from tqdm import tqdm

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = inspect_gguf(gguf_path)
    arch = read_field(reader, "general.architecture")
    p = f"{arch}."
    writer = _ShardWriter(out_dir)
    names, embed_shape, rope_factors = set(), None, None
    try:
        for t in tqdm(
            reader.tensors,
            desc=f"converting {gguf_path.name}",
            unit="tensor",
            disable=not progress,
            file=sys.stderr,
        ):
            name = hf_name(t.name, arch)
            if name == "model.embed_tokens.weight":
                embed_shape = tuple(reversed([int(d) for d in t.shape]))
            if name is not None and not full and is_matrix(t):
                names.add(name)  # read from the GGUF file by the engine
                continue
            name, w = dequantized(reader.get, t)
            if t.name == "rope_freqs.weight":
                rope_factors = w
                continue
            if name is None:
                raise ModelSourceError(
                    f"GGUF file {gguf_path}: unexpected tensor {t.name} for architecture {arch!r}"
                )
            if gguf_spec(arch).norm_plus_one and name.endswith("norm.weight"):
                w = w - 1.0
            names.add(name)
            writer.add(name, np.ascontiguousarray(w))
    except (ValueError, IndexError, NotImplementedError, TypeError) as e:
        raise ModelSourceError(f"GGUF file {gguf_path}: cannot dequantize: {e}") from e
    n_layers = int(read_field(reader, p + "block_count"))
    missing = [
        f"blk.{i}.{k}.weight"
        for i in range(n_layers)
        for k in layer_tensor_names(arch)
        if hf_name(f"blk.{i}.{k}.weight", arch) not in names
    ]
    missing += [k for k in ("token_embd.weight", "output_norm.weight") if TOP_NAMES[k] not in names]
    if missing:
        raise ModelSourceError(f"GGUF file {gguf_path} lacks tensors: {', '.join(missing[:8])}")
    assert embed_shape is not None  # token_embd.weight is there
    writer.close()
    config = hf_config(
        reader,
        arch,
        tie="lm_head.weight" not in names,
        vocab=embed_shape[0],
        hidden=embed_shape[1],
        rope_factors=rope_factors,
    )
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    gen = generation_config(reader, arch, config)
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2))
    _write_tokenizer(reader, gguf_path, out_dir, config["max_position_embeddings"])


class _ShardWriter:
    """Buffers tensors and writes ≤ SHARD_BYTES safetensors files, so memory stays bounded."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir, self.buf_bytes = out_dir, 0
        self.buf: dict[str, np.ndarray] = {}
        self.shards: list[tuple[Path, list[str]]] = []

    def add(self, name: str, w: np.ndarray) -> None:
        if self.buf and self.buf_bytes + w.nbytes > SHARD_BYTES:
            self._flush()
        self.buf[name], self.buf_bytes = w, self.buf_bytes + w.nbytes

    def _flush(self) -> None:
        from safetensors.numpy import save_file

        path = self.out_dir / f".shard-{len(self.shards)}"
        save_file(self.buf, str(path), metadata={"format": "pt"})
        self.shards.append((path, list(self.buf)))
        self.buf, self.buf_bytes = {}, 0

    def close(self) -> None:
        self._flush()
        if len(self.shards) == 1:
            self.shards[0][0].rename(self.out_dir / "model.safetensors")
            return
        n, weight_map = len(self.shards), {}
        for i, (path, names) in enumerate(self.shards):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            path.rename(self.out_dir / final)
            weight_map.update(dict.fromkeys(names, final))
        index = {"metadata": {}, "weight_map": weight_map}
        (self.out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _tokenizer_class(arch: str, gguf_path: Path):
    """The tokenizer class for a GGUF file of this architecture: AutoTokenizer's choice.

    AutoTokenizer builds the file's whole config first, through gguf-py's GGUFReader (a
    numpy view per metadata element: 4-6 s for a 49k vocabulary, ~20 s for Gemma 3's
    262k; docs/benchmarks.md, "A GGUF file's first start"), only to look its model type up
    in transformers' registry. Our config names the same model type, so the class comes
    from the registry directly: the same class and the same saved files
    (test_gguf_tokenizer_is_autotokenizers). A directory that declares its own tokenizer
    (a tokenizer_config.json or config.json beside the file), which AutoTokenizer would
    read, still goes through AutoTokenizer; an architecture transformers' GGUF loader
    lacks (Granite) takes the fast tokenizer, which reads the tokenizer.ggml.* keys alone."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    from transformers.models.auto.tokenization_auto import (
        TOKENIZER_MAPPING_NAMES,
        tokenizer_class_from_name,
    )

    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        return PreTrainedTokenizerFast
    if any((gguf_path.parent / f).exists() for f in ("tokenizer_config.json", "config.json")):
        return AutoTokenizer
    name = TOKENIZER_MAPPING_NAMES.get(gguf_spec(arch).model_type) or "TokenizersBackend"
    return tokenizer_class_from_name(name) or AutoTokenizer


def _write_tokenizer(reader, gguf_path: Path, out_dir: Path, max_len: int) -> None:
    # imports torch: one reason this runs in a child
    cls = _tokenizer_class(read_field(reader, "general.architecture"), gguf_path)
    try:
        tok = cls.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as e:  # noqa: BLE001 (transformers raises many kinds)
        raise ModelSourceError(f"GGUF file {gguf_path}: cannot convert its tokenizer: {e}") from e
    tokens = read_field(reader, "tokenizer.ggml.tokens") or []
    for attr, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("pad_token", "padding_token_id"),
        ("unk_token", "unknown_token_id"),
    ):
        token_id = read_field(reader, f"tokenizer.ggml.{key}")
        if token_id is not None and token_id < len(tokens):
            setattr(tok, attr, tokens[token_id])
    template = read_field(reader, "tokenizer.chat_template") or getattr(tok, "chat_template", None)
    if not template:  # a file published without one: its family's, if it has one
        template = gguf_spec(read_field(reader, "general.architecture")).chat_template
    if template:
        tok.chat_template = template
    tok.model_max_length = max_len
    tok.save_pretrained(str(out_dir))
    # transformers 5 keeps the template in chat_template.jinja; readers that only open
    # tokenizer_config.json (our tokenizer worker, older transformers) need it there too.
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in ("is_local", "local_files_only", "name_or_path"):
        cfg.pop(key, None)
    if template:
        cfg["chat_template"] = template
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))
    finish_tokenizer_files(out_dir)  # quicker to load (common.model_files.tokenizer_files)


def main(argv: list[str] | None = None) -> int:
    """`python -m common.model_files.gguf_convert SRC.gguf OUT_DIR [--no-progress]
    [--full] [--error-file F]`"""
    import argparse

    ap = argparse.ArgumentParser(description="Convert a GGUF file to an HF model directory.")
    ap.add_argument("gguf_path", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--full", action="store_true", help="every tensor, dequantized")
    ap.add_argument("--error-file", type=Path, help="write a failure's message here, not stderr")
    args = ap.parse_args(argv)
    try:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        convert_gguf(args.gguf_path, args.out_dir, progress=not args.no_progress, full=args.full)
    except (ModelSourceError, OSError) as e:
        if args.error_file is None:
            print(f"error: {e}", file=sys.stderr)
        else:
            args.error_file.write_text(str(e))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
