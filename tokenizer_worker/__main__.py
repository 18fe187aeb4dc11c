"""`python -m tokenizer_worker --config zeroserve.json [flags]`: one tokenizer worker."""

from common.cli import parse_config
from tokenizer_worker.worker import run

if __name__ == "__main__":
    run(parse_config("zeroserve tokenizer worker"))
