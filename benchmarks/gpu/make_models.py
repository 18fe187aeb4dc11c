"""Random-weight bf16 model directories for the GPU check (no hub access needed).

    python make_models.py TOKDIR OUTROOT m135 [m1b]

m135: SmolLM2-135M-Instruct's own config (TOKDIR/config.json, from the project's GGUF
conversion); m1b: the same tokenizer and vocab with Llama-3.2-1B-like shapes. Weights
from transformers' own initialization after torch.manual_seed(0), saved as bf16
safetensors with the tokenizer files beside them.
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

M1B = {
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "intermediate_size": 8192,
    "tie_word_embeddings": True,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
}


def config_dict(tokdir: Path, name: str) -> dict:
    cfg = json.loads((tokdir / "config.json").read_text())
    if name == "m1b":
        cfg.update(M1B)
        if isinstance(cfg.get("rope_parameters"), dict):
            cfg["rope_parameters"] = {**cfg["rope_parameters"], "rope_theta": 500000.0}
    cfg["torch_dtype"] = cfg["dtype"] = "bfloat16"
    return cfg


def embed_scale(config, name: str) -> float:
    env = os.environ.get("ZS_EMBED_SCALE")
    if env is not None:
        return float(env) if float(env) > 0 else 1.0
    std = getattr(config, "initializer_range", 0.02) or 0.02
    return round(4.0 / (std * config.hidden_size**0.5), 2)  # m135: 8.33, m1b: 4.42


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
    infos = [make(tokdir, root / n, n, device) for n in names]
    saved = json.loads((root / infos[0]["name"] / "config.json").read_text())
    print("saved config of", infos[0]["name"], json.dumps(saved, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
