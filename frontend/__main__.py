"""`python -m frontend [--config FILE] [--host H] [--port P] [--api-key K] ...`"""

from __future__ import annotations

from common.cli import parse_config
from frontend.frontends import prepare_metrics


def main(argv: list[str] | None = None) -> None:
    config = parse_config("zeroserve frontend: OpenAI-compatible HTTP server", argv)
    prepare_metrics(config)  # before prometheus_client is imported (several frontends)
    from frontend.server import run

    run(config)


if __name__ == "__main__":
    main()
