"""``python -m jsonschemabench <benchmark> [options]``: the benchmarks' command line.

Each benchmark module contributes one subcommand through ``add_arguments(parser)``, which sets
``run`` (a function of the parsed arguments returning the exit status).
"""

from __future__ import annotations

import argparse
import sys

from . import e2e, grammar_bench, maskbench, testsuite
from . import samplers_bench


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
    maskbench.add_arguments(
        commands.add_parser(
            "maskbench",
            help="MaskBench: time to first mask, time between masks and exactness on JSON Schemas",
            description=maskbench.__doc__.splitlines()[0],
        )
    )
    testsuite.add_arguments(
        commands.add_parser(
            "testsuite",
            help="JSON Schema Test Suite: passed/total per keyword file and engine",
            description=testsuite.__doc__.splitlines()[0],
        )
    )
    samplers_bench.add_arguments(
        commands.add_parser(
            "samplers",
            help="KL to the grammar-conditioned model (masked, ASAp, SMC) and AWRS checks/time per token",
            description=samplers_bench.__doc__.splitlines()[0],
        )
    )
    e2e.add_arguments(
        commands.add_parser(
            "e2e",
            help="end to end: generate with a model per MaskBench schema; coverage, compliance, TTFT/TPOT, throughput",
            description=e2e.__doc__.splitlines()[0],
        )
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen benchmark."""
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
