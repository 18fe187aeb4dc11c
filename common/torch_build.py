"""What the installed torch was built for, read from its `torch/version.py` without
importing torch (launch.py stays torch-free: a refusal must come before anything starts).

`--device cuda` with a CPU build of torch is the one mistake this can see for certain; a
CUDA build on a machine with no usable GPU is refused by the scheduler itself when it
starts (scheduler_worker/backends/device.py: resolve_device), as torch alone can tell.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from common.config import ConfigError


@dataclass(frozen=True)
class TorchBuild:
    version: str  # "2.13.0+cpu"
    cuda: str | None  # "12.8" on a CUDA build
    hip: str | None  # set on a ROCm build (torch.cuda then drives the AMD GPU)

    @property
    def has_gpu_support(self) -> bool:
        return bool(self.cuda or self.hip)


def parse_version_file(text: str) -> TorchBuild:
    """The fields of a `torch/version.py` (plain assignments of string or None literals)."""
    fields: dict[str, object] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            fields[target.id] = value.value

    def text_or_none(name: str) -> str | None:
        value = fields.get(name)
        return value if isinstance(value, str) and value else None

    return TorchBuild(
        version=text_or_none("__version__") or "unknown",
        cuda=text_or_none("cuda"),
        hip=text_or_none("hip"),
    )


def installed_torch_build() -> TorchBuild | None:
    """The installed torch's build, or None when torch is not installed or its version file
    cannot be read (the scheduler then finds out for itself)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        return parse_version_file(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None


def check_device_choice(device: str, build: TorchBuild | None = None) -> None:
    """Refuse `--device cuda` on a CPU build of torch, in one line (a ConfigError)."""
    if device != "cuda":
        return
    build = build if build is not None else installed_torch_build()
    if build is not None and not build.has_gpu_support:
        raise ConfigError(
            f"--device cuda: this torch ({build.version}) is a CPU build; install a CUDA "
            "build of torch on a GPU machine (README, 'GPU install'), or serve with --device cpu"
        )
