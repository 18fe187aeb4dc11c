"""What a GGUF file holds, per tensor type (gguf-py's reader): how many tensors of each
GGML type, their bytes, and which roles they play (linear weights, the token embedding,
the output head, norms), for the docs' per-file table and the weight-memory ratio.

    .venv/bin/python benchmarks/comparison/gguf_types.py /tmp/gguf/*.gguf
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def role(name: str, n_dims: int) -> str:
    if name.startswith("token_embd"):
        return "embedding"
    if name.startswith("output.") and "norm" not in name:
        return "output"
    if n_dims == 1 or "norm" in name:
        return "norm/bias"
    return "linear"


@dataclass
class TypeStats:
    count: int = 0
    bytes: int = 0
    roles: dict[str, int] = field(default_factory=lambda: defaultdict(int))


@dataclass
class FileTypes:
    path: Path
    arch: str
    file_type: str
    file_bytes: int
    tensor_bytes: int
    per_type: dict[str, TypeStats]

    @property
    def quantized_bytes(self) -> int:
        """Bytes of the tensors in a block format (everything but F32/F16/BF16)."""
        return sum(s.bytes for t, s in self.per_type.items() if t not in ("F32", "F16", "BF16"))


def read_types(path: str | Path) -> FileTypes:
    from gguf import GGUFReader
    from gguf.constants import LlamaFileType

    r = GGUFReader(str(path))
    per: dict[str, TypeStats] = defaultdict(TypeStats)
    for t in r.tensors:
        s = per[t.tensor_type.name]
        s.count += 1
        s.bytes += int(t.n_bytes)
        s.roles[role(t.name, len(t.shape))] += 1

    def field_value(key: str):
        f = r.get_field(key)
        return None if f is None else f.contents()

    arch = field_value("general.architecture") or "?"
    ft = field_value("general.file_type")
    try:
        file_type = LlamaFileType(ft).name.removeprefix("MOSTLY_") if ft is not None else "?"
    except ValueError:
        file_type = str(ft)
    return FileTypes(
        path=Path(path),
        arch=str(arch),
        file_type=file_type,
        file_bytes=Path(path).stat().st_size,
        tensor_bytes=sum(s.bytes for s in per.values()),
        per_type=dict(per),
    )


def format_markdown(files: list[FileTypes]) -> str:
    lines = [
        "| file | arch | file type | size | tensor types: count (roles), MB |",
        "|---|---|---|---:|---|",
    ]
    for f in files:
        parts = []
        for name, s in sorted(f.per_type.items(), key=lambda kv: -kv[1].bytes):
            roles = ", ".join(f"{n} {r}" for r, n in sorted(s.roles.items()))
            parts.append(f"{name}: {s.count} ({roles}), {s.bytes / 1e6:.1f}")
        lines.append(
            f"| {f.path.name} | {f.arch} | {f.file_type} | {f.file_bytes / 1e6:.1f} MB | "
            + "; ".join(parts)
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print(__doc__)
        return 2
    print(format_markdown([read_types(p) for p in paths]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
