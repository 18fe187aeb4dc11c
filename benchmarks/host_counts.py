"""bench_host_step.py's load-free counts of a step: the Python bytecodes and calls a row
(sys.settrace), and the torch ops a step (of them views), whatever the machine's load."""

from __future__ import annotations

import sys

from torch.utils._python_dispatch import TorchDispatchMode

from scheduler_worker.engine import LLMEngine


def bytecodes(engine: LLMEngine, publish, steps: int) -> tuple[float, float]:
    """The Python bytecodes and calls a decoded row a step (sys.settrace): what the host's
    Python does, whatever the machine's load."""
    counts = [0, 0]

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        counts[event != "opcode"] += event in ("opcode", "call")
        return trace

    num_rows = 0
    sys.settrace(trace)
    for _ in range(steps):
        publish(engine.step_rows())
        num_rows += engine.last_step.num_decode
    sys.settrace(None)
    return counts[0] / num_rows, counts[1] / num_rows


class OpCounter(TorchDispatchMode):
    """The aten ops dispatched while active, and how many of them are views."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        self.views += func.is_view
        return func(*args, **(kwargs or {}))


def count_ops(engine: LLMEngine, publish, steps: int) -> tuple[float, float]:
    """torch ops a step, and of them views, over `steps` steps."""
    counter = OpCounter()
    with counter:
        for _ in range(steps):
            publish(engine.step_rows())
    return counter.ops / steps, counter.views / steps
