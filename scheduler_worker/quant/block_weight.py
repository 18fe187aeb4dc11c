"""BlockWeight: a block-quantized weight as its form's module splits it from a file (or
quantizes it), every value kept; the arrays per form: the form's module, named by its row
of formats.py's table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class Layout(Protocol):
    """What a BlockWeight reads of its form's row (formats.Format)."""

    @property
    def unit(self) -> int: ...

    @property
    def qs_bytes(self) -> int: ...

    def packed_nbytes(self, n: int, k: int) -> int: ...


# form -> its row: filled by formats.py with its table (that module imports this one)
LAYOUTS: dict[str, Layout] = {}


@dataclass
class BlockWeight:
    form: str  # a row of FORMATS
    qs: torch.Tensor  # q8: int8 [N, K]; q6k: uint8 [N, K/256 * 208]; the others uint8 [N, K/2]
    d: torch.Tensor  # float32 [N, K / unit]
    m: torch.Tensor | None  # like d, or None
    source: str  # what it was made from: "Q4_1", "Q8_0", "int4", ...
    qh: torch.Tensor | None = None  # 5-bit forms (kquants.py)
    sc: torch.Tensor | None = None  # super-block forms: per-block scales (kquants.py)
    mn: torch.Tensor | None = None  # K-quant forms: per-block mins

    @property
    def shape(self) -> tuple[int, int]:
        f = LAYOUTS[self.form]
        return self.qs.shape[0], self.qs.shape[1] // f.qs_bytes * f.unit

    def nbytes(self) -> int:
        """Bytes of the kernels' layout (pack_blocks), the memory a served weight takes."""
        return LAYOUTS[self.form].packed_nbytes(*self.shape)
