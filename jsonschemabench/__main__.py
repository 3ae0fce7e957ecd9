"""``python -m jsonschemabench <benchmark> [options]``: the benchmarks' command line.

Each benchmark module contributes one subcommand through ``add_arguments(parser)``, which sets
``run`` (a function of the parsed arguments returning the exit status).
"""

from __future__ import annotations

import argparse
import sys

from . import grammar_bench


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one subcommand per benchmark."""
    parser = argparse.ArgumentParser(prog="python -m jsonschemabench", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="BENCHMARK")
    grammar_bench.add_arguments(
        commands.add_parser(
            "grammars",
            help="compile + mask times and correctness on GBNF grammars and regexes",
            description=grammar_bench.__doc__.splitlines()[0],
        )
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen benchmark."""
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
