"""`python -m frontend [--config FILE] [--host H] [--port P] [--api-key K] ...`"""

from __future__ import annotations

from common.cli import parse_config
from frontend.server import run


def main(argv: list[str] | None = None) -> None:
    run(parse_config("zeroserve frontend: OpenAI-compatible HTTP server", argv))


if __name__ == "__main__":
    main()
