"""The GPU check's environment report: Python, torch/CUDA, the GPU, the versions of what the
server needs (and where each came from: the image or the carried wheels), and whether
zeroserve's own modules import.

    python env_info.py OUT.json SITE_DIR

Exit 1 when something does not import (the report is written either way).
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

DISTS = [
    ("transformers", "transformers"),
    ("tokenizers", "tokenizers"),
    ("safetensors", "safetensors"),
    ("numpy", "numpy"),
    ("zmq", "pyzmq"),
    ("msgpack", "msgpack"),
    ("fastapi", "fastapi"),
    ("starlette", "starlette"),
    ("pydantic", "pydantic"),
    ("pydantic_core", "pydantic-core"),
    ("uvicorn", "uvicorn"),
    ("gguf", "gguf"),
    ("llguidance", "llguidance"),
    ("jsonschema", "jsonschema"),
    ("prometheus_client", "prometheus-client"),
    ("jinja2", "jinja2"),
    ("httpx", "httpx"),
    ("aiohttp", "aiohttp"),  # bench_serving's client (a wheel in .gpu/whl with its deps)
    ("uvloop", "uvloop"),  # the frontend's loop and parser (dependencies; wheels in .gpu/whl)
    ("httptools", "httptools"),
    ("anyio", "anyio"),
    ("typing_extensions", "typing-extensions"),
    ("yaml", "pyyaml"),
    ("tqdm", "tqdm"),
    ("triton", "triton"),
    ("pytest", "pytest"),
]
OPTIONAL = [("pytest_timeout", "pytest-timeout")]  # absent is fine
ZEROSERVE = [
    "common.config",
    "frontend.app",
    "scheduler_worker.engine",
    "tokenizer_worker.worker",
    "detok_worker.worker",
    "scheduler_worker.structured",
    "frontend.tools.request",
]


def main() -> int:
    out, site = sys.argv[1], sys.argv[2]
    t = time.time()
    import torch

    info: dict = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "libc": " ".join(platform.libc_ver()),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cpu_count": os.cpu_count(),
        "pythonpath": os.environ.get("PYTHONPATH"),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(
            gpu=p.name,
            gpu_mem_gib=round(p.total_memory / 2**30, 1),
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
            bf16=torch.cuda.is_bf16_supported(),
        )
    smi = shutil.which("nvidia-smi")
    if smi:
        query = "--query-gpu=driver_version,clocks.max.sm,power.limit,memory.total"
        for key, cmd in (
            ("nvidia_smi_L", [smi, "-L"]),
            ("nvidia_smi_q", [smi, "--format=csv,noheader", query]),
        ):
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
                info[key] = r.stdout.strip()
            except (OSError, subprocess.TimeoutExpired) as e:
                info[key] = f"failed: {e!r}"
    vers, errs, absent = {}, {}, []
    for mods, required in ((DISTS, True), (OPTIONAL, False)):
        for mod, dist in mods:
            try:
                m = importlib.import_module(mod)
                where = m.__file__ or ""
                vers[dist] = md.version(dist) + (
                    f"  ({os.path.dirname(where)})" if site and site in where else ""
                )
            except Exception as e:  # noqa: BLE001 - reported
                if required:
                    errs[dist] = f"{type(e).__name__}: {e}"[:200]
                else:
                    absent.append(dist)
    for mod in ZEROSERVE:
        try:
            m = importlib.import_module(mod)
            vers["zeroserve:" + mod] = os.path.relpath(m.__file__ or "")
        except Exception as e:  # noqa: BLE001 - reported
            errs["zeroserve:" + mod] = f"{type(e).__name__}: {e}"[:300]
    info["versions"], info["import_errors"], info["absent_optional"] = vers, errs, absent
    info["seconds"] = round(time.time() - t, 1)
    Path(out).write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
