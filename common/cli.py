"""One command line for every component: a config file plus flags that override it.

`python launch.py ...` and `python -m <component> ...` take the same flags, so a
supervisor/systemd deployment can share one config file among all programs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace

from common.config import (
    ASYNC_SCHEDULING,
    DEVICES,
    DTYPES,
    GEMV_MODES,
    KERNELS,
    KV_DTYPES,
    LOAD_FORMATS,
    QUANTIZATIONS,
    REASONING_PARSERS,
    ROUTINGS,
    TOOL_CALL_PARSERS,
    Config,
    ConfigError,
)
from common.endpoints import ensure_run_dir
from common.spec_config import SPECULATIVE_METHODS, SPECULATIVE_POLICIES


@dataclass(frozen=True, slots=True)
class Flag:
    flag: str
    path: tuple[str, ...]  # the config section the field lives in
    name: str  # the field
    type: type
    help: str
    choices: tuple[str, ...] | None = None


_M, _C, _S = ("engine", "model"), ("engine", "cache"), ("engine", "scheduler")
# --help shows them in these groups, each with its default (from Config())
GROUPS: dict[str, list[Flag]] = {
    "model": [
        Flag("--model", _M, "model", str, "model alias, path to a .gguf file, or HF model dir"),
        Flag("--dtype", _M, "dtype", str, "weights and activations dtype", DTYPES),
        Flag("--device", _M, "device", str, "where the model runs", DEVICES),
        Flag("--quantization", _M, "quantization", str, "weight format", QUANTIZATIONS),
        Flag("--kernels", _M, "kernels", str, "CPU kernel set", KERNELS),
        Flag(
            "--load-format",
            _M,
            "load_format",
            str,
            "dummy: random weights from config.json, no weight files (benchmarks, sizing)",
            LOAD_FORMATS,
        ),
        Flag("--max-model-len", _M, "max_model_len", int, "context length; none: the model's"),
    ],
    "engine": [
        Flag("--threads", _M, "num_threads", int, "torch threads per replica; none: torch's"),
        Flag("--block-size", _C, "block_size", int, "tokens per KV cache block"),
        Flag("--num-kv-blocks", _C, "num_blocks", int, "KV blocks; none: from the memory"),
        Flag("--kv-cache-memory-gb", _C, "kv_cache_memory_gb", float, "KV cache memory"),
        Flag("--kv-cache-dtype", _C, "kv_cache_dtype", str, "K/V element type", KV_DTYPES),
        Flag(
            "--max-num-seqs",
            _S,
            "max_num_seqs",
            int,
            "requests running at once; none: CPU 64, GPU 256",
        ),
        Flag(
            "--max-num-batched-tokens",
            _S,
            "max_num_batched_tokens",
            int,
            "tokens per step; none: CPU 512, GPU 8192",
        ),
        Flag(
            "--async-scheduling",
            _S,
            "async_scheduling",
            str,
            "prepare step N+1 while the device runs step N; auto: on a GPU",
            ASYNC_SCHEDULING,
        ),
        Flag(
            "--gpu-memory-utilization",
            _C,
            "gpu_memory_utilization",
            float,
            "CUDA: share of the GPU's memory to use; the KV pool takes what the rest leaves",
        ),
        Flag("--max-decode-batch", _S, "max_decode_batch", int, "decode rows per step"),
        Flag(
            "--gemv",
            _M,
            "gemv",
            str,
            "CUDA: a split-K GEMV for decode steps of <= 8 rows where it measured faster "
            "than cuBLAS at start (auto), or never (off)",
            GEMV_MODES,
        ),
        Flag(
            "--speculative-method",
            _S,
            "speculative_method",
            str,
            "who drafts tokens to verify in one forward (ngram: prompt lookup; suffix: the "
            "request's tokens and recent requests' outputs; auto: ngram on a CPU, none on "
            "CUDA, whose verify step is not measured yet)",
            SPECULATIVE_METHODS,
        ),
        Flag(
            "--num-speculative-tokens",
            _S,
            "num_speculative_tokens",
            int,
            "the most tokens a row drafts per step (1..16)",
        ),
        Flag(
            "--speculative-model",
            _S,
            "speculative_model",
            str,
            "a smaller model with the same tokenizer (GGUF file or HF directory) drafting "
            "for rows the method has no draft for (alone: --speculative-method draft)",
        ),
        Flag(
            "--speculative-policy",
            _S,
            "speculative_policy",
            str,
            "adaptive: draft only where the measured verify cost pays; always: every draft",
            SPECULATIVE_POLICIES,
        ),
    ],
    "server": [
        Flag("--host", ("server",), "host", str, "HTTP listen address"),
        Flag("--port", ("server",), "port", int, "HTTP port"),
        Flag("--api-key", ("server",), "api_key", str, "bearer token every API route asks for"),
        Flag("--served-model-name", ("server",), "served_model_name", str, "model name in the API"),
        Flag(
            "--stream-interval", ("server",), "stream_interval", int, "stream text every N tokens"
        ),
        Flag(
            "--tool-call-parser",
            ("server",),
            "tool_call_parser",
            str,
            "tool-call format (common/tool_formats); none: the model family's",
            TOOL_CALL_PARSERS,
        ),
        Flag(
            "--reasoning-parser",
            ("server",),
            "reasoning_parser",
            str,
            "split <think> reasoning into reasoning_content",
            REASONING_PARSERS,
        ),
        Flag("--run-dir", ("ipc",), "run_dir", str, "dir of the ipc sockets; none: a private one"),
    ],
    "limits": [
        Flag(
            "--max-queued-requests", ("server",), "max_queued_requests", int, "in flight, then 503"
        ),
        Flag("--request-timeout", ("server",), "request_timeout_s", float, "seconds per request"),
        Flag(
            "--drain-timeout", ("server",), "drain_timeout_s", float, "seconds to drain on SIGTERM"
        ),
        Flag("--max-body-bytes", ("server",), "max_body_bytes", int, "request body size"),
        Flag("--max-n", ("server",), "max_n", int, "choices per request (n)"),
        Flag(
            "--max-tokens-limit",
            ("server",),
            "max_tokens_limit",
            int,
            "max_tokens cap; none: the context",
        ),
        Flag(
            "--max-stop-strings", ("server",), "max_stop_strings", int, "stop strings per request"
        ),
        Flag(
            "--responses-store-max",
            ("server",),
            "responses_store_max",
            int,
            "/v1/responses kept for previous_response_id",
        ),
        Flag(
            "--responses-store-bytes",
            ("server",),
            "responses_store_bytes",
            int,
            "bytes of /v1/responses kept",
        ),
    ],
    "cluster": [
        Flag("--tokenize-workers", (), "tokenize_workers", int, "tokenizer worker processes"),
        Flag("--data-parallel-size", (), "data_parallel_size", int, "scheduler replicas"),
        Flag(
            "--tensor-parallel-size",
            _M,
            "tensor_parallel_size",
            int,
            "processes (ranks) one replica's model is split over: gloo on a CPU, NCCL on GPUs",
        ),
        Flag(
            "--collective-timeout",
            _M,
            "collective_timeout_s",
            float,
            "seconds a tensor-parallel collective waits for the other ranks; then the replica stops",
        ),
        Flag("--routing", ("server",), "routing", str, "how a replica is picked", ROUTINGS),
        Flag(
            "--gpu-ids",
            (),
            "gpu_ids",
            str,
            "launch.py: the visible GPUs the replicas go on, tp each (2,3); none: all",
        ),
        Flag("--replica-id", (), "replica_id", int, "which replica this scheduler process is"),
        Flag(
            "--api-servers",
            (),
            "api_servers",
            int,
            "frontend processes sharing the HTTP port; launch.py on a GPU: min(4, cpus // 4)",
        ),
        Flag("--frontend-id", (), "frontend_id", int, "which frontend this process is"),
        Flag("--replica-inbox", ("ipc",), "replica_inbox", str, "where this replica binds"),
        Flag("--replica-advertise", ("ipc",), "replica_advertise", str, "the inbox it announces"),
    ],
}
_FLAGS = [f for flags in GROUPS.values() for f in flags]
_SHORT = {
    "--data-parallel-size": "--dp",
    "--tensor-parallel-size": "--tp",
    "--api-servers": "--api-server-count",
}


def _default(path: tuple[str, ...], name: str) -> object:
    obj: object = Config()
    for part in path:
        obj = getattr(obj, part)
    return getattr(obj, name)


def add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="JSON or TOML config file shared by all components")
    groups = {title: parser.add_argument_group(title) for title in GROUPS}
    for title, flags in GROUPS.items():
        for f in flags:
            names = [f.flag, _SHORT[f.flag]] if f.flag in _SHORT else [f.flag]
            default = _default(f.path, f.name)
            shown = "none" if default is None else default
            groups[title].add_argument(
                *names,
                dest=f.name,
                type=f.type,
                default=None,  # None: the config file's value, else the default shown
                choices=f.choices,
                metavar=f.name.upper() if f.choices is None else None,
                help=f"{f.help} (default: {shown})",
            )
    groups["engine"].add_argument(
        "--no-prefix-caching",
        action="store_true",
        default=None,
        help="turn the prefix cache off (default: on)",
    )
    groups["engine"].add_argument(
        "--enforce-eager",
        action="store_true",
        default=None,
        help="CUDA: capture no graphs, run every step eagerly (default: graphs for decode steps)",
    )
    groups["model"].add_argument(
        "--prefill-dense-copy",
        action="store_true",
        default=None,
        help="on AMX / AVX2-with-bf16 CPUs keep a bf16 copy of each quantized weight for "
        "prompt tokens: faster prefill, ~3-4x the weight memory (default: off, the file's bytes)",
    )
    groups["server"].add_argument(
        "--no-ui",
        action="store_true",
        default=None,
        help="serve no web page at / (it answers 404) (default: served)",
    )


def config_from_args(args: argparse.Namespace) -> Config:
    cfg = Config.load(args.config) if args.config else Config()
    for f in _FLAGS:
        value = getattr(args, f.name, None)
        if value is not None:
            cfg = _set(cfg, f.path, f.name, value)
    if getattr(args, "no_prefix_caching", None):
        cfg = _set(cfg, ("engine", "cache"), "enable_prefix_caching", False)
    if getattr(args, "enforce_eager", None):
        cfg = _set(cfg, ("engine", "model"), "enforce_eager", True)
    if getattr(args, "prefill_dense_copy", None):
        cfg = _set(cfg, ("engine", "model"), "prefill_dense_copy", True)
    if getattr(args, "no_ui", None):
        cfg = _set(cfg, ("server",), "ui", False)
    return cfg


def _set(obj, path: tuple[str, ...], name: str, value):
    if not path:
        return replace(obj, **{name: value})
    head, rest = path[0], path[1:]
    return replace(obj, **{head: _set(getattr(obj, head), rest, name, value)})


def parse_config(description: str, argv: list[str] | None = None) -> Config:
    """A component's config from its command line; its ipc run dir exists on return."""
    package = sys.modules["__main__"].__spec__
    prog = f"python -m {package.parent}" if package is not None and package.parent else None
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_config_args(parser)
    try:
        config = config_from_args(parser.parse_args(argv))
    except ConfigError as e:  # a bad file or flag value: a line naming it, exit 2 (no restart
        parser.exit(2, f"{parser.prog}: {e}\n")  # loop will fix it; supervisors see a 2)
    # every component starts here: the run dir its ipc sockets live in is made now, by
    # whichever starts first, so that naming an endpoint later has no side effect
    if config.ipc.resolved_run_dir is not None:
        ensure_run_dir(config.ipc.resolved_run_dir)
    return config
