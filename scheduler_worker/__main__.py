"""`python -m scheduler_worker --config zeroserve.json [flags]`: the engine process alone."""

from common.cli import parse_config
from scheduler_worker.worker import run

if __name__ == "__main__":
    run(parse_config("zeroserve scheduler/engine worker"))
