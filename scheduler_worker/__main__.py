"""`python -m scheduler_worker --config zeroserve.json [flags]`: the engine process alone."""

from __future__ import annotations

from common.cli import parse_config
from common.env import shorter_openmp_spins, use_compile_caches
from common.log import get_logger


def main(argv: list[str] | None = None) -> None:
    config = parse_config("zeroserve scheduler/engine worker", argv)
    # before torch and Triton are imported: every kernel they compile is cached there
    caches = use_compile_caches(config.engine.model.resolved_cache_dir)
    # before torch loads libgomp: launch.py sets it for its children, and a deployment that
    # starts this process alone (supervisor, systemd, Kubernetes) gets the same
    shorter_openmp_spins()
    get_logger("scheduler").info("compiled kernels cached in %s", ", ".join(caches.values()))
    from scheduler_worker.worker import run

    run(config)


if __name__ == "__main__":
    main()
