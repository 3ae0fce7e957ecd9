"""``python -m jsonschemabench <benchmark> [options]``: the benchmarks' command line.

Each benchmark module contributes one subcommand through ``add_arguments(parser)``, which sets
``run`` (a function of the parsed arguments returning the exit status).
"""

from __future__ import annotations

import argparse
import sys

from . import (
    compare,
    compile_profile,
    diffusion_bench,
    dingo_bench,
    e2e,
    grammar_bench,
    infill_bench,
    infill_replay,
    maskbench,
    samplers_bench,
    serve_bench,
    speculative_bench,
    testsuite,
    wide_objects,
)

#: (subcommand, module, one-line help); each module's docstring gives the subcommand's description
BENCHMARKS = (
    ("grammars", grammar_bench, "compile + mask times and correctness on GBNF grammars and regexes"),
    ("compile-profile", compile_profile,
     "where compile time goes: per-phase times of each schema's compile and first mask"),
    ("maskbench", maskbench, "MaskBench: time to first mask, time between masks and exactness on JSON Schemas"),
    ("compare", compare, "two maskbench runs of one engine file for file: outcomes, tokens, TTFM ratio, mask tail"),
    ("wide-objects", wide_objects,
     "compile time and masks along one object with many required members (two member orders), engines side by side"),
    ("testsuite", testsuite, "JSON Schema Test Suite: passed/total per keyword file and engine"),
    ("samplers", samplers_bench,
     "KL to the grammar-conditioned model (masked, ASAp, SMC) and AWRS checks/time per token"),
    ("e2e", e2e, "end to end: generate with a model per MaskBench schema; coverage, compliance, TTFT/TPOT, throughput"),
    ("diffusion", diffusion_bench, "masked-diffusion decoding of MaskBench schemas: validity, steps, constraint cost per mode"),
    ("dingo", dingo_bench, "DINGO on regular MaskBench schemas: token-DFA precompute and per-block DP times"),
    ("infill", infill_bench, "multi-region infilling of HumanEval-X C++ and MaskBench JSON: validity, checks, latency"),
    ("infill-checks", infill_replay,
     "completability-check latency on HumanEval-X C++ with the canonical fills written back token by token"),
    ("serve", serve_bench, "corral serve under concurrent load: req/s, tokens/s, TTFT, inter-token latency, batching gain"),
    ("speculative", speculative_bench,
     "constrained speculative decoding on held-out MaskBench schemas: tokens per target call, acceptance, speedup"),
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one subcommand per benchmark."""
    parser = argparse.ArgumentParser(prog="python -m jsonschemabench", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="BENCHMARK")
    for name, module, summary in BENCHMARKS:
        module.add_arguments(commands.add_parser(name, help=summary, description=module.__doc__.splitlines()[0]))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen benchmark."""
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
