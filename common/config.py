"""One frozen configuration, built and validated once, shared by every process. The
environment is read in common/env.py (ZEROSERVE_API_KEY, _CACHE_DIR, _RUN_DIR fill in what
a config leaves unset); socket paths: common/endpoints.py; the `ipc` section: ipc_config.py.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from common import spec_config
from common.config_error import ConfigError as ConfigError  # re-exported
from common.config_error import parse_gpu_ids
from common.env import default_cache_dir, env
from common.ipc_config import ENDPOINT_NAMES as ENDPOINT_NAMES  # re-exported, as IPCConfig
from common.ipc_config import IPCConfig
from common.reasoning_formats import REASONING_FORMAT_NAMES
from common.tool_formats import TOOL_FORMAT_NAMES

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
KV_DTYPES = (*DTYPES, "fp8")  # of the KV cache: CacheConfig.kv_cache_dtype (fp8: a GPU's)
# weight formats of the linears (scheduler_worker/quant): auto: gguf for a GGUF model on a
# CPU, else none; gguf: the file's own blocks; int8/int4: Q8_0/Q4_1-style blocks (CPU);
# fp8: E4M3 per channel, FP8 matmuls from sm_89, emulated in float32 on a CPU (docs/fp8.md)
QUANTIZATIONS = ("auto", "none", "gguf", "int8", "int4", "fp8")
# the C++ kernel path for quantized linears: auto (the best the CPU has), one ISA, or
# "torch" (no C++: dequantized weights in pure torch, the oracle)
KERNELS = ("auto", "amx", "avx512", "avx2", "scalar", "torch")
# where the weights come from: auto, the model's files; dummy, random weights made on the
# device from config.json alone (benchmarks, sizing a deployment; as vLLM's)
LOAD_FORMATS = ("auto", "dummy")
GEMV_MODES = ("auto", "off")  # CUDA: the few-row GEMV measured against cuBLAS, or never
ROUTINGS = ("least_loaded", "round_robin")
MAX_API_SERVERS = 64  # frontend processes; every worker holds a socket to each
TOOL_CALL_PARSERS = TOOL_FORMAT_NAMES  # common/tool_formats/; None: the model family's
REASONING_PARSERS = REASONING_FORMAT_NAMES  # common/reasoning_formats.py


def _at_least(obj: object, low: int, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")


_FILE_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


def _section(cls: type, data: object, where: str):
    """cls(**data) for one section of a config file, after checking that `data` is a
    table whose keys are cls's fields and whose values have their types (a file says
    `"port": 8000`, not "8000"; `true`, not "yes"), naming the key that is wrong."""
    if not isinstance(data, dict):
        raise ConfigError(f"config section {where} must be a table, got {data!r}")
    known = {f.name: str(f.type) for f in fields(cls)}
    for key, value in data.items():
        key_name = f"{where}.{key}" if where else key
        if key not in known:
            raise ConfigError(f"unknown config key {key_name}; known: {sorted(known)}")
        names = [n.strip() for n in known[key].split("|")]
        allowed = tuple(t for n in names for t in _FILE_TYPES.get(n, ()))
        if not allowed or (value is None and "None" in names):
            continue  # None where allowed, or a sub-section (checked on its own)
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise ConfigError(f"config key {key_name} must be {known[key]}, got {value!r}")
    return cls(**data)


def _positive_seconds(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ConfigError(f"{name} must be a finite number of seconds > 0, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    model: str = "smollm2"  # alias, path to a .gguf file, or HF model directory
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None  # None: the model's own context length
    cache_dir: str | None = None  # where GGUF conversions live; None: default_cache_dir()
    quantization: str = "auto"  # see QUANTIZATIONS
    load_format: str = "auto"  # see LOAD_FORMATS
    kernels: str = "auto"  # see KERNELS
    # keep a bfloat16 copy of each quantized weight for prompt tokens on CPUs where a dense
    # bf16 GEMM beats the integer kernels on long steps (AMX; AVX2 with native bf16): faster
    # prefill there for ~3-4x the weight memory. Off: the weights stay the file's bytes.
    prefill_dense_copy: bool = False
    # torch threads of each scheduler replica; None: torch's default with one replica,
    # launch.py gives each of N replicas cores // N (at least 1)
    num_threads: int | None = None
    # CUDA: no graph capture, every step eager (start-up faster, decode slower)
    enforce_eager: bool = False
    gemv: str = "auto"  # see GEMV_MODES (scheduler_worker/backends/gemv_choice.py)
    # ranks a replica's model is split over (scheduler_worker/parallel/); how long a collective
    # waits for the other ranks before the replica stops
    tensor_parallel_size: int = 1
    collective_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        _at_least(self, 1, "tensor_parallel_size")
        if self.num_threads is not None:
            _at_least(self, 1, "num_threads")
        _positive_seconds(self, "collective_timeout_s")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(
                f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}"
            )
        if self.load_format not in LOAD_FORMATS:
            raise ConfigError(
                f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}"
            )
        if self.load_format == "dummy" and self.quantization == "gguf":
            raise ConfigError(
                "load_format dummy makes float weights from config.json; quantization gguf "
                "serves a GGUF file's own blocks: pick one"
            )
        if self.gemv not in GEMV_MODES:
            raise ConfigError(f"gemv must be one of {GEMV_MODES}, got {self.gemv!r}")
        if self.kernels not in KERNELS:
            raise ConfigError(f"kernels must be one of {KERNELS}, got {self.kernels!r}")
        if self.quantization not in ("auto", "none") and (
            self.dtype == "float16" or (self.device == "cuda" and self.quantization != "fp8")
        ):
            where = "CPU or GPU" if self.quantization == "fp8" else "the CPU"
            raise ConfigError(
                f"quantization {self.quantization!r} runs on {where} with dtype "
                f"bfloat16 or float32 (got device {self.device!r}, dtype {self.dtype!r})"
            )
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1, got {self.max_model_len}")

    @property
    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    # KV pool size: an explicit block count wins; else a memory budget in GiB.
    num_blocks: int | None = None
    kv_cache_memory_gb: float = 1.0
    enable_prefix_caching: bool = True
    # K/V element type; auto: float16 under a float32 model on the CPU's paged kernel (as
    # llama.cpp keeps its cache), else the model's dtype (scheduler_worker/model_runner.py)
    kv_cache_dtype: str = "auto"
    # CUDA: the share of the GPU's memory the scheduler may hold (weights, a largest step's
    # activations, graphs, and the KV pool, which takes the rest), as vLLM's flag
    gpu_memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        if not (0.0 < self.gpu_memory_utilization <= 1.0):
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.block_size < 1 or self.block_size > 1024:
            raise ConfigError(f"block_size must be in [1, 1024], got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ConfigError(f"num_blocks must be >= 1, got {self.num_blocks}")
        if not (math.isfinite(self.kv_cache_memory_gb) and self.kv_cache_memory_gb > 0):
            raise ConfigError(f"kv_cache_memory_gb must be > 0, got {self.kv_cache_memory_gb}")
        if self.kv_cache_dtype not in KV_DTYPES:
            raise ConfigError(
                f"kv_cache_dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_cache_dtype!r}"
            )


# (max_num_seqs, max_num_batched_tokens) where the config leaves them unset: a CPU's step
# time grows with its rows; a GPU's barely does up to hundreds (vLLM's 256 sequences)
DEVICE_DEFAULTS = {"cpu": (64, 512), "cuda": (256, 8192)}
ASYNC_SCHEDULING = ("auto", "on", "off")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int | None = None  # requests running (holding KV) at once; None: by device
    # tokens per engine step (prefill chunks + decodes); None: by device (DEVICE_DEFAULTS)
    max_num_batched_tokens: int | None = None
    max_decode_batch: int | None = None  # decode rows per step; None: max_num_seqs
    # overlapped scheduling: prepare step N+1 while the device runs step N; auto: where
    # the device runs apart from the host (a GPU)
    async_scheduling: str = "auto"
    # speculative decoding: who drafts (scheduler_worker/spec/), at most how many tokens a row
    speculative_method: str = "auto"  # auto: by device (spec_config.resolved_method)
    num_speculative_tokens: int = 3
    # adaptive: draft only where the measured verify cost pays (spec/policy.py); always
    speculative_policy: str = "adaptive"
    speculative_model: str | None = None  # a draft model (spec/draft_model.py): method draft

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_decode_batch"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.async_scheduling not in ASYNC_SCHEDULING:
            raise ConfigError(
                f"async_scheduling must be one of {ASYNC_SCHEDULING}, got {self.async_scheduling!r}"
            )
        spec_config.check(self)

    def resolved(self, device_type: str) -> SchedulerConfig:
        """The limits left unset, filled with the device's defaults (DEVICE_DEFAULTS), and
        speculative_method auto resolved for the device."""
        seqs, tokens = DEVICE_DEFAULTS.get(device_type, DEVICE_DEFAULTS["cpu"])
        return replace(
            self,
            max_num_seqs=self.max_num_seqs or seqs,
            max_num_batched_tokens=self.max_num_batched_tokens or tokens,
            speculative_method=spec_config.resolved_method(self.speculative_method, device_type),
        )

    @property
    def num_seqs(self) -> int:
        """max_num_seqs, or the CPU's default where unset (resolved() sets it by device)."""
        return self.max_num_seqs or DEVICE_DEFAULTS["cpu"][0]

    @property
    def num_batched_tokens(self) -> int:
        return self.max_num_batched_tokens or DEVICE_DEFAULTS["cpu"][1]

    @property
    def decode_batch(self) -> int:
        return min(self.max_decode_batch or self.num_seqs, self.num_seqs)


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    served_model_name: str | None = None  # None: the model argument
    max_queued_requests: int = 1024  # requests in flight past which new ones get 503
    request_timeout_s: float = 600.0
    max_body_bytes: int = 4 << 20
    max_n: int = 8
    max_tokens_limit: int | None = None  # cap on max_tokens per request; None: the context
    max_stop_strings: int = 16  # stop strings per request (each at most MAX_STOP_STRING_CHARS)
    startup_timeout_s: float = 600.0
    # False: the HTTP port opens at once and answers 503 until every component is up (any
    # start order, as under supervisor/systemd); True: it opens only then (launch.py)
    listen_when_ready: bool = False
    drain_timeout_s: float = 30.0  # on SIGTERM: in-flight requests get this long to finish
    ui: bool = True  # the web page at / (frontend/static/index.html); False: / is a 404
    # the detokenizer sends a request's text every this many tokens (and its first token
    # at once, and at the finish); 1: every token (vLLM's --stream-interval)
    stream_interval: int = 1
    # how the frontend picks a scheduler replica (frontend/routing.py): "least_loaded"
    # (with prefix affinity) or "round_robin" (for comparison in benchmarks/bench_dp.py)
    routing: str = "least_loaded"
    tool_call_parser: str | None = None  # one of TOOL_CALL_PARSERS; None: per architecture
    # one of REASONING_PARSERS: <think> text goes to reasoning_content; None: all is content
    reasoning_parser: str | None = None
    # /v1/responses kept for previous_response_id and GET (frontend/api/response_store.py):
    # at most this many, in at most this many bytes, the oldest dropped first
    responses_store_max: int = 1000
    responses_store_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        from common.sampling_params import MAX_STOP_STRINGS

        if self.api_key is None and env("API_KEY"):  # kept off the command line (ps)
            object.__setattr__(self, "api_key", env("API_KEY"))
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("api_key must not be empty (leave it unset to serve without one)")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        _at_least(self, 1, "max_queued_requests", "max_body_bytes", "max_n", "stream_interval")
        _at_least(self, 0, "responses_store_max", "responses_store_bytes")
        if self.max_tokens_limit is not None:
            _at_least(self, 1, "max_tokens_limit")
        if not 0 <= self.max_stop_strings <= MAX_STOP_STRINGS:
            raise ConfigError(
                f"max_stop_strings must be in [0, {MAX_STOP_STRINGS}], got {self.max_stop_strings}"
            )
        _positive_seconds(self, "request_timeout_s", "startup_timeout_s")
        if self.routing not in ROUTINGS:
            raise ConfigError(f"routing must be one of {ROUTINGS}, got {self.routing!r}")
        for name, choices in (
            ("tool_call_parser", TOOL_CALL_PARSERS),
            ("reasoning_parser", REASONING_PARSERS),
        ):
            if (value := getattr(self, name)) is not None and value not in choices:
                raise ConfigError(f"{name} must be one of {choices}, got {value!r}")
        if not (math.isfinite(self.drain_timeout_s) and self.drain_timeout_s >= 0):
            raise ConfigError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")


@dataclass(frozen=True)
class Config:
    engine: EngineConfig = field(default_factory=EngineConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    ipc: IPCConfig = field(default_factory=IPCConfig)
    tokenize_workers: int = 1
    heartbeat_s: float = 1.0
    # scheduler replicas launch.py starts (ids 0..N-1); more may join by hand
    data_parallel_size: int = 1
    replica_id: int = 0  # which replica a scheduler_worker process is (--replica-id)
    # frontend processes sharing the HTTP port (SO_REUSEPORT), ids 0..N-1 (vLLM's
    # --api-server-count); every worker sends to each (docs/architecture.md, "Frontends")
    api_servers: int = 1
    frontend_id: int = 0  # which of them a frontend process is (--frontend-id)
    # GPU replicas: indexes of the visible GPUs to place them on ("2,3"); None: all (gpus.py)
    gpu_ids: str | None = None

    def __post_init__(self) -> None:
        if self.gpu_ids is not None:
            parse_gpu_ids(self.gpu_ids)
        _at_least(self, 1, "tokenize_workers", "data_parallel_size", "api_servers")
        _at_least(self, 0, "replica_id", "frontend_id")
        if self.api_servers > MAX_API_SERVERS:
            raise ConfigError(
                f"api_servers must be at most {MAX_API_SERVERS}, got {self.api_servers}"
            )
        if self.frontend_id >= self.api_servers:
            raise ConfigError(
                f"frontend_id {self.frontend_id} is out of range: api_servers is "
                f"{self.api_servers} (ids 0..{self.api_servers - 1})"
            )
        _positive_seconds(self, "heartbeat_s")

    @property
    def gpus_per_replica(self) -> int:
        """GPUs one scheduler replica spans: one per tensor-parallel rank."""
        return self.engine.model.tensor_parallel_size

    @property
    def model_name(self) -> str:
        return self.server.served_model_name or self.engine.model.model

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Config:
        if not isinstance(data, dict):
            raise ConfigError(f"a config must be a table of sections, got {data!r}")
        data = dict(data)
        eng = data.pop("engine", {})
        if not isinstance(eng, dict):
            raise ConfigError(f"config section engine must be a table, got {eng!r}")
        eng = dict(eng)
        engine = EngineConfig(
            model=_section(ModelConfig, eng.pop("model", {}), "engine.model"),
            cache=_section(CacheConfig, eng.pop("cache", {}), "engine.cache"),
            scheduler=_section(SchedulerConfig, eng.pop("scheduler", {}), "engine.scheduler"),
        )
        if eng:
            raise ConfigError(f"unknown engine config keys: {sorted(eng)}")
        server = _section(ServerConfig, data.pop("server", {}), "server")
        ipc = _section(IPCConfig, data.pop("ipc", {}), "ipc")
        return _section(cls, {**data, "engine": engine, "server": server, "ipc": ipc}, "")

    @classmethod
    def load(cls, path: str | Path) -> Config:
        """A JSON or TOML file with the sections of `to_dict()`."""
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config file {path}: {e}") from e
        try:
            data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except ValueError as e:
            raise ConfigError(f"config file {path} does not parse: {e}") from e
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        """Write the config readable by this user only: it may hold ipc.secret."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(self.to_dict(), indent=2))
