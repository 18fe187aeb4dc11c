"""A step's inputs on their way to the device, written once for every step kind: decode
graphs (graphs.py), mixed-step graphs (mixed_graphs.py) and eager steps (base.py).

    host: the step's int64 columns ──▶ one of two pinned buffers, in turn (Staging)
          ──one copy──▶ a device buffer ──▶ the graphs' static tensors (StaticTokens)
    placeholders: a token still being sampled by the step in flight (-1 on the host, its
          row there in `prev`) is read from that step's tokens on the device
          (take_placeholders): no host round trip

The buffers alternate because the host writes step N+1's inputs while the device may still
be copying step N's (overlapped scheduling): a buffer is written again only two steps
later, after its copy ran.
"""

from __future__ import annotations

import torch

from scheduler_worker.backends.device import pinned


class Staging:
    """Two host buffers of `size` int64 (pinned for a GPU) used in turn, and one device
    buffer they are copied to."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.device_buf = torch.zeros(size, dtype=torch.long, device=device)
        self.host = [pinned(torch.zeros(size, dtype=torch.long), device) for _ in "ab"]
        self.turn = 0

    def next_host(self) -> torch.Tensor:
        """This step's host buffer (the other one's copy may still be running)."""
        host = self.host[self.turn]
        self.turn ^= 1
        return host

    def send(self, host: torch.Tensor) -> torch.Tensor:
        """The written part of a host buffer (a view of its head, any shape) copied to the
        device in one non-blocking copy; returns the device buffer's view of it."""
        staged = self.device_buf[: host.numel()].view_as(host)  # view(Size): slower
        staged.copy_(host, non_blocking=True)
        return staged


def take_placeholders(
    ids: torch.Tensor, prev: torch.Tensor, prev_tokens: torch.Tensor | None
) -> torch.Tensor:
    """`ids` with each placeholder (a row i with prev[i] >= 0) replaced by the token the step
    in flight sampled in its row prev[i]; `prev` on the same device as `prev_tokens`."""
    assert prev_tokens is not None, "a placeholder token with no step in flight"
    from_prev = prev_tokens.index_select(0, prev.clamp(min=0))
    return torch.where(prev >= 0, from_prev, ids)


class StaticTokens:
    """The token columns every captured step reads at fixed addresses: ids, positions and
    cache slots of up to `max_tokens` tokens (padding: token 0 at position 0, its K/V to
    the scratch block's first slot), with their Staging of `staged_size` int64."""

    def __init__(
        self,
        max_tokens: int,
        staged_size: int,
        device: torch.device,
        scratch_block: int,
        block_size: int,
    ) -> None:
        self.device, self.scratch_block, self.block_size = device, scratch_block, block_size
        self.staging = Staging(staged_size, device)
        self.ids = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.pos = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.slots = torch.full((max_tokens,), scratch_block * block_size, device=device)

    def put_tokens(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        slots: torch.Tensor,
        prev: torch.Tensor | None,
        prev_tokens: torch.Tensor | None,
        leading_prev: int = 0,
    ) -> None:
        """The staged columns (device views, n tokens) into the static ones; `prev`: the
        placeholder rows' column where the step has any, else None; `leading_prev`: the
        first k tokens are placeholders and no other is (the usual overlapped step): a
        gather and a copy, take_placeholders' answer."""
        n, k = ids.shape[0], leading_prev
        if k:
            assert prev is not None and prev_tokens is not None
            torch.index_select(prev_tokens, 0, prev[:k], out=self.ids[:k])
            if k < n:  # padding rows
                self.ids[k:n].copy_(ids[k:])
        else:
            self.ids[:n].copy_(ids if prev is None else take_placeholders(ids, prev, prev_tokens))
        self.pos[:n].copy_(pos)
        self.slots[:n].copy_(slots)
