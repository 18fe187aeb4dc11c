"""One logging helper for every process: each line carries the process name."""

from __future__ import annotations

import logging
import sys

from common.env import log_level

_CONFIGURED = False


def install_stack_dump() -> None:
    """`kill -USR1 <pid>` prints every thread's stack to stderr: for a process that hangs."""
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)


def get_logger(name: str) -> logging.Logger:
    global _CONFIGURED
    if not _CONFIGURED:
        level = log_level()
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter(
                "%(asctime)s %(levelname).1s [%(processName)s %(process)d] %(name)s: %(message)s",
                datefmt="%H:%M:%S",
            )
        )
        root = logging.getLogger("zeroserve")
        root.addHandler(handler)
        root.setLevel(level)
        root.propagate = False
        _CONFIGURED = True
    return logging.getLogger(f"zeroserve.{name}")
