"""Child processes that do not outlive their parent.

`die_with_parent(parent_pid)` runs in a child between fork and exec (subprocess's
preexec_fn): on Linux it asks for SIGKILL when the parent dies (PR_SET_PDEATHSIG), so a
`kill -9` of launch.py takes the components, and a model conversion, along. Elsewhere
there is no such signal and the call only checks that the parent is still there.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: no parent-death signal to ask for
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
