"""Where the components meet: the `ipc` section of the config (common.config.Config.ipc).

Its endpoints are ipc:// sockets in a private run dir by default (common/endpoints.py
names them), or tcp://host:port each where the components live on different hosts. A set
of processes of one kind (scheduler replicas, frontends) binds one endpoint each:
`indexed_endpoint`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common.endpoints import default_run_dir, endpoint
from common.env import env

ENDPOINT_NAMES = ("tokenizer", "scheduler", "detok", "frontend")


@dataclass(frozen=True)
class IPCConfig:
    """Where the components meet. Default: ipc:// sockets in a private (0700) run dir.
    Any endpoint may be set to tcp://host:port when components live on different hosts."""

    run_dir: str | None = None
    tokenizer: str | None = None  # frontend PUSH (bind) -> tokenizer workers PULL
    scheduler: str | None = None  # scheduler PULL (bind) <- tokenizers, frontend, detok
    detok: str | None = None  # detok PULL (bind) <- scheduler
    frontend: str | None = None  # frontend PULL (bind) <- detok, tokenizers, scheduler
    # one scheduler replica's own inbox (a per-process flag, --replica-inbox): where it
    # binds, and the address it announces (--replica-advertise; default: the bind
    # address, a wildcard host replaced by this host's address). Unset: replica_endpoint.
    replica_inbox: str | None = None
    replica_advertise: str | None = None
    # HMAC key for request ids (common.auth): the scheduler generates only for ids the
    # frontend signed. launch.py sets a random one; deployments share one in the config.
    secret: str | None = None

    def __post_init__(self) -> None:
        if self.secret is None and env("SECRET"):  # e.g. from a Kubernetes Secret
            object.__setattr__(self, "secret", env("SECRET"))

    def endpoint(self, name: str) -> str:
        """The address of one of the four endpoints; no side effect (see resolved_run_dir)."""
        return endpoint(name, self.run_dir, getattr(self, name))

    def indexed_endpoint(self, name: str, index: int) -> str:
        """Member `index` of a set of processes that each bind one `name` endpoint: 0's is
        the `name` endpoint itself; K's is ipc://<run_dir>/<name>.K.sock, or, with a tcp
        `name` endpoint, the same host at port + K."""
        base = self.endpoint(name)
        if index == 0:
            return base
        if base.startswith("tcp://"):
            host, _, port = base.rpartition(":")
            return f"{host}:{int(port) + index}"
        return endpoint(f"{name}.{index}", self.run_dir)

    def replica_endpoint(self, replica: int) -> str:
        """Replica K's inbox when it announces none of its own (indexed_endpoint)."""
        return self.indexed_endpoint("scheduler", replica)

    def frontend_endpoint(self, frontend: int) -> str:
        """Frontend I's inbox (--api-servers: each frontend binds its own)."""
        return self.indexed_endpoint("frontend", frontend)

    def tokenizer_endpoint(self, frontend: int) -> str:
        """Frontend I's ROUTER to the tokenizer pool (every worker connects to each)."""
        return self.indexed_endpoint("tokenizer", frontend)

    @property
    def resolved_run_dir(self) -> Path | None:
        """The dir the ipc sockets live in, which a process creates when it starts
        (common.endpoints.ensure_run_dir); None when every endpoint is tcp."""
        if all(getattr(self, name) for name in ENDPOINT_NAMES):
            return None
        return Path(self.run_dir) if self.run_dir is not None else default_run_dir()
