"""The engine flags of rows a-c: the servers get them on their command line, the offline
engine parses the same list into its config."""

from __future__ import annotations

import argparse
import shlex


def engine_flags(args: argparse.Namespace) -> list[str]:
    """The engine flags given to every server and, parsed the same way, to the offline engine."""
    from common.config import SchedulerConfig

    seqs = max(args.concurrency, SchedulerConfig().num_seqs)
    return [
        "--model",
        args.model,
        "--dtype",
        args.dtype,
        "--device",
        args.device,
        "--max-num-seqs",
        str(seqs),
        # like for like: llama.cpp and transformers draft nothing by default (--engine-args
        # "--speculative-method auto" measures ours with drafts)
        "--speculative-method",
        "none",
        *shlex.split(args.engine_args),
    ]


def engine_config(args: argparse.Namespace):
    from common.cli import add_config_args, config_from_args

    p = argparse.ArgumentParser()
    add_config_args(p)
    return config_from_args(p.parse_args(engine_flags(args))).engine
