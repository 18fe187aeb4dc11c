"""`python -m scheduler_worker --config zeroserve.json [flags]`: the engine process alone."""

from __future__ import annotations

from common.cli import parse_config
from common.env import use_compile_caches
from common.log import get_logger


def main(argv: list[str] | None = None) -> None:
    config = parse_config("zeroserve scheduler/engine worker", argv)
    # before torch and Triton are imported: every kernel they compile is cached there
    caches = use_compile_caches(config.engine.model.resolved_cache_dir)
    get_logger("scheduler").info("compiled kernels cached in %s", ", ".join(caches.values()))
    from scheduler_worker.worker import run

    run(config)


if __name__ == "__main__":
    main()
