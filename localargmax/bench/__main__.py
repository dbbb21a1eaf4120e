"""``python -m localargmax.bench``: the benchmark CLI (see ``--help``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m localargmax.bench"))
