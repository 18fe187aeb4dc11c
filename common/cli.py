"""One command line for every component: a config file plus flags that override it.

`python launch.py ...` and `python -m <component> ...` take the same flags, so a
supervisor/systemd deployment can share one config file among all programs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from common.config import Config, ConfigError
from common.endpoints import ensure_run_dir

# flag -> (section path, field, type)
_FLAGS: dict[str, tuple[tuple[str, ...], str, type]] = {
    "--model": (("engine", "model"), "model", str),
    "--dtype": (("engine", "model"), "dtype", str),
    "--device": (("engine", "model"), "device", str),
    "--quantization": (("engine", "model"), "quantization", str),
    "--kernels": (("engine", "model"), "kernels", str),
    "--threads": (("engine", "model"), "num_threads", int),
    "--max-model-len": (("engine", "model"), "max_model_len", int),
    "--block-size": (("engine", "cache"), "block_size", int),
    "--num-kv-blocks": (("engine", "cache"), "num_blocks", int),
    "--kv-cache-memory-gb": (("engine", "cache"), "kv_cache_memory_gb", float),
    "--max-num-seqs": (("engine", "scheduler"), "max_num_seqs", int),
    "--max-num-batched-tokens": (("engine", "scheduler"), "max_num_batched_tokens", int),
    "--max-decode-batch": (("engine", "scheduler"), "max_decode_batch", int),
    "--host": (("server",), "host", str),
    "--port": (("server",), "port", int),
    "--api-key": (("server",), "api_key", str),
    "--served-model-name": (("server",), "served_model_name", str),
    "--max-queued-requests": (("server",), "max_queued_requests", int),
    "--request-timeout": (("server",), "request_timeout_s", float),
    "--drain-timeout": (("server",), "drain_timeout_s", float),
    "--max-body-bytes": (("server",), "max_body_bytes", int),
    "--max-n": (("server",), "max_n", int),
    "--max-tokens-limit": (("server",), "max_tokens_limit", int),
    "--max-stop-strings": (("server",), "max_stop_strings", int),
    "--stream-interval": (("server",), "stream_interval", int),
    "--routing": (("server",), "routing", str),
    "--tool-call-parser": (("server",), "tool_call_parser", str),
    "--run-dir": (("ipc",), "run_dir", str),
    "--tokenize-workers": ((), "tokenize_workers", int),
    "--data-parallel-size": ((), "data_parallel_size", int),
    "--replica-id": ((), "replica_id", int),
    "--replica-inbox": (("ipc",), "replica_inbox", str),
    "--replica-advertise": (("ipc",), "replica_advertise", str),
}
_SHORT = {"--data-parallel-size": "--dp"}


def add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="JSON or TOML config file shared by all components")
    for flag, (_, name, typ) in _FLAGS.items():
        names = [flag, _SHORT[flag]] if flag in _SHORT else [flag]
        parser.add_argument(*names, dest=name, type=typ, default=None)
    parser.add_argument("--no-prefix-caching", action="store_true", default=None)
    parser.add_argument(
        "--no-ui", action="store_true", default=None, help="serve no web page at / (it answers 404)"
    )


def config_from_args(args: argparse.Namespace) -> Config:
    cfg = Config.load(args.config) if args.config else Config()
    for _flag, (path, name, _) in _FLAGS.items():
        value = getattr(args, name, None)
        if value is not None:
            cfg = _set(cfg, path, name, value)
    if getattr(args, "no_prefix_caching", None):
        cfg = _set(cfg, ("engine", "cache"), "enable_prefix_caching", False)
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
