"""Model directories for the GPU check (no hub access needed).

    python make_models.py TOKDIR OUTROOT m135 [l1b] [l8b]

m135: SmolLM2-135M-Instruct's own config (TOKDIR/config.json, from the project's GGUF
conversion), weights from transformers' own initialization after torch.manual_seed(0),
saved as bf16 safetensors with the tokenizer files beside them (transformers loads the
same weights: the correctness checks). l1b / l8b: Llama-3.2-1B's and Llama-3.1-8B's
published config.json, no weights (served with --load-format dummy), and a tokenizer of
their 128,256 ids (llama3_tokenizer).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

TOK_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

# the published config.json of meta-llama/Llama-3.2-1B and meta-llama/Llama-3.1-8B
LLAMA3_COMMON = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}
DUMMY = {
    "l1b": {
        **LLAMA3_COMMON,
        "head_dim": 64,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "rope_scaling": {
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "tie_word_embeddings": True,
    },
    "l8b": {
        **LLAMA3_COMMON,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "rope_scaling": {
            "factor": 8.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        "tie_word_embeddings": False,
    },
}
# Llama 3's special tokens at their ids (the rest of 128000-128255 are reserved ones)
LLAMA3_SPECIAL = {
    128000: "<|begin_of_text|>",
    128001: "<|end_of_text|>",
    128006: "<|start_header_id|>",
    128007: "<|end_header_id|>",
    128008: "<|eom_id|>",
    128009: "<|eot_id|>",
}


def llama3_tokenizer(tokdir: Path) -> dict:
    """A tokenizer.json of Llama 3's 128,256 ids: SmolLM2's byte-level BPE (ids 0-49151:
    it encodes the prompts), filler tokens of 5-7 letters up to 127999 (never made by a
    merge: they exist to be decoded, so every id the model samples is text of a real
    token's size for the detokenizer), and Llama 3's 256 special tokens at 128000-128255."""
    tok = json.loads((tokdir / "tokenizer.json").read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    i, n = 0, len(vocab)
    while n < 128000:
        word, k = "", i
        for _ in range(4):  # base 26, 4 letters, behind a fixed "zq"
            word, k = chr(ord("a") + k % 26) + word, k // 26
        piece = ("Ġ" if i % 2 else "") + "zq" + word
        i += 1
        if piece not in vocab:
            vocab[piece] = n
            n += 1
    reserved = (LLAMA3_SPECIAL.get(t, f"<|reserved_special_token_{t - 128000}|>") for t in
                range(128000, 128256))  # fmt: skip
    tok["added_tokens"] += [
        {"id": t, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for t, c in zip(range(128000, 128256), reserved)
    ]  # fmt: skip
    return tok


def make_dummy(tokdir: Path, out: Path, name: str) -> dict:
    """config.json and the tokenizer: what --load-format dummy serves from."""
    t0 = time.perf_counter()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cfg = DUMMY[name]
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "tokenizer.json").write_text(json.dumps(llama3_tokenizer(tokdir), ensure_ascii=False))
    for f in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tokdir / f, out / f)
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    assert ids == cfg["vocab_size"], (ids, cfg["vocab_size"])
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * inter + 2 * h
    heads = 1 if cfg["tie_word_embeddings"] else 2
    params = layers * per_layer + heads * cfg["vocab_size"] * h + h
    info = {
        "name": name,
        "dir": str(out),
        "params": params,
        "weights": "none: --load-format dummy",
        "tokenizer_ids": ids,
        "files": sorted(p.name for p in out.iterdir()),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(info), flush=True)
    return info


def config_dict(tokdir: Path, name: str) -> dict:
    cfg = json.loads((tokdir / "config.json").read_text())
    cfg["torch_dtype"] = cfg["dtype"] = "bfloat16"
    return cfg


def embed_scale(config, name: str) -> float:
    env = os.environ.get("ZS_EMBED_SCALE")
    if env is not None:
        return float(env) if float(env) > 0 else 1.0
    std = getattr(config, "initializer_range", 0.02) or 0.02
    return round(4.0 / (std * config.hidden_size**0.5), 2)  # m135: 8.33


def make(tokdir: Path, out: Path, name: str, device: str) -> dict:
    t0 = time.perf_counter()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config_dict(tokdir, name), indent=2))
    config = AutoConfig.from_pretrained(out)
    torch.manual_seed(0)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    except Exception as e:  # noqa: BLE001 - fall back to a CPU init
        print(f"{name}: init on {device} failed ({e!r}); on the CPU", flush=True)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.eval()
    # transformers' init (std 0.02) leaves the logits nearly uniform (SmolLM2 shapes: std
    # ~0.5 over 49k tokens, top1-top2 gaps ~0.04, under bf16's rounding), so greedy
    # agreement would be decided by ties. The (tied) embedding table is scaled so the
    # logits' std is ~4 (entropy ~5 nats, like a real LM's): env ZS_EMBED_SCALE overrides, 0 = unscaled.
    scale = embed_scale(config, name)
    if scale != 1.0:
        with torch.no_grad():
            emb = model.get_input_embeddings().weight
            emb.copy_((emb.float() * scale).to(emb.dtype))
    model.save_pretrained(out, safe_serialization=True)
    for f in TOK_FILES:
        if (tokdir / f).is_file():
            shutil.copy(tokdir / f, out / f)
    if (
        not (out / "generation_config.json").exists()
        and (tokdir / "generation_config.json").is_file()
    ):
        shutil.copy(tokdir / "generation_config.json", out / "generation_config.json")
    n = sum(p.numel() for p in model.parameters())
    info = {
        "name": name,
        "dir": str(out),
        "params": n,
        "files": sorted(p.name for p in out.iterdir()),
        "seconds": round(time.perf_counter() - t0, 1),
        "init_device": device,
        "embed_scale": scale,
    }
    print(json.dumps(info), flush=True)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return info


def main() -> int:
    tokdir, root, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, init on {device}")
    infos = [
        make_dummy(tokdir, root / n, n) if n in DUMMY else make(tokdir, root / n, n, device)
        for n in names
    ]
    for info in infos:
        saved = json.loads((root / info["name"] / "config.json").read_text())
        print("saved config of", info["name"], json.dumps(saved, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
