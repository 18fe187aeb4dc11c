"""GGUF → Hugging Face directory: config.json, tokenizer, and the small float tensors.

    GGUF file ──inspect_gguf──▶ header checked (parses, tensor extents, architecture)
              ──convert_gguf──▶ out_dir/ config.json  generation_config.json
                                         model*.safetensors (float32: norms and biases;
                                                             every tensor with `full`)
                                         tokenizer.json  tokenizer_config.json (+ chat_template)
                                         decode_tokenizer.json (common.tokenizer_files)

The engine reads the matrices (linears, embedding) from the GGUF file itself
(scheduler_worker.loader): the cache keeps only the 1-D tensors, so it costs a few MB, not
a float32 copy of the model. `full` writes every tensor dequantized (an HF checkpoint that
transformers loads: the tests' and benchmarks' reference); `gguf_matrices` yields the
dequantized matrices for the engine's float path.

GGUF lists a tensor's dims reversed (ne0 first); the dequantized array already has the
row-major HF shape, so `reversed(t.shape)` is the HF shape. llama.cpp's converter permutes
the Q and K rows of llama-architecture models (its rope pairs adjacent dims, HF's pairs the
two halves of a head); `unpermute` undoes it. qwen2 files are not permuted.

Torch-free (numpy + gguf + safetensors.numpy). The tokenizer goes through transformers'
own GGUF tokenizer conversion, which imports torch: `common.model_source` therefore runs
this module in a child process (`python -m common.gguf_convert SRC OUT`), which also hands
the dequantized arrays' memory back when it exits.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from common.gguf_header import check_metadata
from common.gguf_names import (  # noqa: F401 (re-exported: the names' one table)
    _NORM_PLUS_ONE_ARCHS,
    _TOP_NAMES,
    GGUF_ARCHS,
    SUPPORTED_GGUF_ARCHS,
    hf_name,
)
from common.model_source import ModelSourceError
from common.tokenizer_files import finish_tokenizer_files

SHARD_BYTES = 2 << 30
LLAMA3_ORIGINAL_CONTEXT = 8192  # llama.cpp stores llama3 rope as factors, not its parameters


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `w.reshape(n_head, 2, d // n_head // 2, *rest).swapaxes(1, 2)`:
    whole rows move, so it applies to a quantized tensor's rows of blocks as well."""
    rest = w.shape[1:]
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception:  # noqa: BLE001 (gguf raises several kinds on odd fields)
        return default


def inspect_gguf(path: Path):
    """Open the header (no tensor reads); a GGUFReader for a well-formed, supported file.
    It builds the whole vocabulary (seconds): what the conversion needs. The engine, which
    needs only the tensors, reads the file with common.gguf_header.gguf_blocks_header."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 (the reader raises many kinds on bad files)
        raise ModelSourceError(f"GGUF file {path} is corrupt, truncated or not GGUF: {e}") from e
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise ModelSourceError(
                f"GGUF file {path} is truncated: tensor {t.name} ends past "
                f"the end of the file ({size} bytes)"
            )
    check_metadata(path, lambda key: _field(reader, key))
    return reader


def is_matrix(t) -> bool:
    """A GGUF tensor the engine reads from the file (a linear or the embedding), not the
    conversion cache: every tensor of two or more dims."""
    return len(t.shape) > 1


def dequantized(reader, t) -> tuple[str | None, np.ndarray]:
    """(HF name or None when unknown, float32 array in HF's shape and row order)."""
    import gguf

    arch = _field(reader, "general.architecture")
    w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    w = w.reshape(tuple(reversed([int(d) for d in t.shape])))
    name = hf_name(t.name, arch)
    if name is not None and arch == "llama" and (".q_proj." in name or ".k_proj." in name):
        n_head = int(_field(reader, f"{arch}.attention.head_count"))
        if ".k_proj." in name:
            n_head = int(_field(reader, f"{arch}.attention.head_count_kv", n_head))
        w = unpermute(w, n_head)
    return name, w


def gguf_matrices(path: Path):
    """(HF name, float32 array) of every matrix of a GGUF file, dequantized: what the lean
    conversion leaves out, for the engine's float path (--quantization none)."""
    reader = inspect_gguf(Path(path))
    for t in reader.tensors:
        if is_matrix(t):
            name, w = dequantized(reader, t)
            if name is None:
                raise ModelSourceError(f"GGUF file {path}: unexpected tensor {t.name}")
            yield name, w


def convert_gguf(gguf_path: Path, out_dir: Path, progress: bool = True, full: bool = False) -> None:
    """Write an HF-format directory for `gguf_path` into the existing directory `out_dir`:
    the 1-D tensors only, or with `full` every tensor."""
    from tqdm import tqdm

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = inspect_gguf(gguf_path)
    arch = _field(reader, "general.architecture")
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
            name, w = dequantized(reader, t)
            if t.name == "rope_freqs.weight":
                rope_factors = w
                continue
            if name is None:
                raise ModelSourceError(
                    f"GGUF file {gguf_path}: unexpected tensor {t.name} for architecture {arch!r}"
                )
            if arch in _NORM_PLUS_ONE_ARCHS and name.endswith("norm.weight"):
                w = w - 1.0
            names.add(name)
            writer.add(name, np.ascontiguousarray(w))
    except (ValueError, IndexError, NotImplementedError, TypeError) as e:
        raise ModelSourceError(f"GGUF file {gguf_path}: cannot dequantize: {e}") from e
    n_layers = int(_field(reader, p + "block_count"))
    missing = [
        f"blk.{i}.{k}.weight"
        for i in range(n_layers)
        for k in GGUF_ARCHS[arch][2]
        if hf_name(f"blk.{i}.{k}.weight", arch) not in names
    ]
    missing += [
        k for k in ("token_embd.weight", "output_norm.weight") if _TOP_NAMES[k] not in names
    ]
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
    gen = {
        k: config[k]
        for k in ("bos_token_id", "eos_token_id", "pad_token_id")
        if config.get(k) is not None
    }
    end_of_turn = _end_of_turn_id(reader, arch)
    if end_of_turn is not None and "eos_token_id" in gen:
        gen["eos_token_id"] = [gen["eos_token_id"], end_of_turn]
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


def llama3_rope_parameters(
    factors: np.ndarray,
    theta: float,
    head_dim: int,
    original_context: int = LLAMA3_ORIGINAL_CONTEXT,
) -> dict:
    """Recover HF's llama3 rope parameters from llama.cpp's per-frequency `rope_freqs`.

    llama.cpp writes r_i = 1 (short wavelengths), `factor` (long ones) and, between,
    1 / ((1 - s) / factor + s) with s = (ctx / wavelen - low) / (high - low): s is linear in
    ctx / wavelen, so a line through the middle points gives low (intercept) and high.
    """
    factors = np.asarray(factors, dtype=np.float64)
    factor = float(factors.max())
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    x = original_context / (2 * math.pi / inv_freq)
    mid = (factors > 1 + 1e-4) & (factors < factor * (1 - 1e-4))
    low, high = 1.0, 4.0  # every published llama3 model
    if mid.sum() >= 2:
        s = (1 / factors[mid] - 1 / factor) / (1 - 1 / factor)
        slope, low = np.polyfit(s, x[mid], 1)
        low, high = round(float(low), 3), round(float(low + slope), 3)
    params = {
        "rope_type": "llama3",
        "rope_theta": theta,
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original_context,
    }
    s = np.clip((x - low) / (high - low), 0.0, 1.0)
    expected = 1 / ((1 - s) / factor + s)
    if factor <= 1 or not np.allclose(expected, factors, rtol=1e-3):
        raise ValueError(f"rope_freqs is not a llama3 rope scaling (factors {factors.tolist()})")
    return params


def _f32(value: float) -> float:
    """GGUF stores float32: 9.999999747378752e-06 is written back as the 1e-05 it was."""
    return float(str(np.float32(value)))


def hf_config(
    reader, arch: str, tie: bool, vocab: int, hidden: int, rope_factors: np.ndarray | None = None
) -> dict:
    p = f"{arch}."
    n_head = int(_field(reader, p + "attention.head_count"))
    head_dim = int(_field(reader, p + "attention.key_length", hidden // n_head))
    theta = _f32(_field(reader, p + "rope.freq_base", 10000.0))
    rope: dict = {"rope_theta": theta, "rope_type": "default"}
    scaling = _field(reader, p + "rope.scaling.type", "none")
    orig_ctx = _field(reader, p + "rope.scaling.original_context_length")
    if scaling in ("linear", "yarn"):
        rope.update(rope_type=scaling, factor=_f32(_field(reader, p + "rope.scaling.factor")))
        if scaling == "yarn" and orig_ctx:
            rope["original_max_position_embeddings"] = int(orig_ctx)
    elif scaling != "none":
        raise ModelSourceError(
            f"GGUF rope scaling {scaling!r} is not supported "
            "(supported: none, linear, yarn, llama3 rope_freqs)"
        )
    if rope_factors is not None:
        try:
            rope = llama3_rope_parameters(
                rope_factors, theta, head_dim, int(orig_ctx or LLAMA3_ORIGINAL_CONTEXT)
            )
        except ValueError as e:
            raise ModelSourceError(f"GGUF file: {e}") from e
    hf_arch, model_type, _ = GGUF_ARCHS[arch]
    window = _field(reader, p + "attention.sliding_window")
    config = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, p + "feed_forward_length")),
        "num_hidden_layers": int(_field(reader, p + "block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(_field(reader, p + "attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "max_position_embeddings": int(_field(reader, p + "context_length", 2048)),
        "rms_norm_eps": _f32(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-6)),
        "hidden_act": "silu",
        "attention_bias": arch == "qwen2",
        "rope_theta": theta,
        "rope_parameters": rope,
        **({"rope_scaling": rope} if rope["rope_type"] != "default" else {}),
        "tie_word_embeddings": tie,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
        "dtype": "float32",
        **({"sliding_window": int(window)} if window else {}),
    }
    if arch == "gemma3":
        config.update(_gemma3_config(reader, config, rope))
    return config


def _gemma3_config(reader, config: dict, rope: dict) -> dict:
    """What llama.cpp's gemma3 graph fixes in code rather than in the file: every 6th
    layer global, the rest sliding; local RoPE base 10k unscaled (the file's rope is the
    global layers'); attention scale 1/sqrt(head_dim), or 1/sqrt(hidden / heads) for the
    27B (62 layers); GELU-tanh."""
    n_layers, n_head = config["num_hidden_layers"], config["num_attention_heads"]
    scalar = config["head_dim"] if n_layers != 62 else config["hidden_size"] // n_head
    softcap = _field(reader, "gemma3.final_logit_softcapping")
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n_layers)]
    return {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "layer_types": types if config.get("sliding_window") else ["full_attention"] * n_layers,
        "query_pre_attn_scalar": scalar,
        "final_logit_softcapping": _f32(softcap) if softcap else None,
        "attn_logit_softcapping": None,
        "rope_parameters": {
            "full_attention": rope,
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "rope_local_base_freq": 10000.0,
    }


# Gemma's turn format (the chat format of every Gemma 3 checkpoint, base ones included),
# for gemma3 files published without a tokenizer.chat_template: a system message opens
# the first user turn, the assistant is "model".
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first = messages[0]['content'] | trim + '\n\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set first = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' "
    "+ (first if loop.first else '') + m['content'] | trim + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
GEMMA_END_OF_TURN = "<end_of_turn>"


def _end_of_turn_id(reader, arch: str) -> int | None:
    """Gemma ends a chat turn with <end_of_turn>, a stop token beside <eos>."""
    if arch != "gemma3":
        return None
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    return tokens.index(GEMMA_END_OF_TURN) if GEMMA_END_OF_TURN in tokens else None


def _write_tokenizer(reader, gguf_path: Path, out_dir: Path, max_len: int) -> None:
    from transformers import AutoTokenizer  # imports torch: one reason this runs in a child

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as e:  # noqa: BLE001 (transformers raises many kinds)
        raise ModelSourceError(f"GGUF file {gguf_path}: cannot convert its tokenizer: {e}") from e
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    for attr, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("pad_token", "padding_token_id"),
        ("unk_token", "unknown_token_id"),
    ):
        token_id = _field(reader, f"tokenizer.ggml.{key}")
        if token_id is not None and token_id < len(tokens):
            setattr(tok, attr, tokens[token_id])
    template = _field(reader, "tokenizer.chat_template") or getattr(tok, "chat_template", None)
    if not template and _field(reader, "general.architecture") == "gemma3":
        template = GEMMA_CHAT_TEMPLATE
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
    finish_tokenizer_files(out_dir)  # quicker to load (common.tokenizer_files)


def main(argv: list[str] | None = None) -> int:
    """`python -m common.gguf_convert SRC.gguf OUT_DIR [--no-progress] [--error-file F]`"""
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
