"""`python -m detok_worker --config zeroserve.json [flags]`: the detokenizer process alone."""

from common.cli import parse_config
from detok_worker.worker import run

if __name__ == "__main__":
    run(parse_config("zeroserve detokenizer worker"))
