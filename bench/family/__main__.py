"""`python -m bench.family`: seeded traffic variants against their measured capacity."""

from __future__ import annotations

import argparse
import sys

from bench.family import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.family", description=run.__doc__)
    run.add_arguments(parser)
    return run.run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
