"""``python -m server`` (and ``corral serve``): serve a model over an OpenAI-compatible HTTP API.

Example::

    python -m server --model models/tiny-json --port 8000 --api-key sk-local

Loads the model before binding the port (a model that does not load is exit code 2 with one
line on stderr), then runs uvicorn until SIGINT/SIGTERM: uvicorn stops accepting connections,
lets in-flight requests (streams included) finish for up to ``--shutdown-timeout`` seconds, then
the scheduler stops and fails whatever is left with a 503.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from server.config import ServerConfig

    d = ServerConfig(model="")
    p = argparse.ArgumentParser(prog="corral serve", description="Serve a model with an OpenAI-compatible API "
                                "and structured outputs (JSON Schema, regex, GBNF, Lark, choices, tool calls).")
    p.add_argument("--model", required=True, metavar="PATH_OR_ID", help="transformers model folder or hub id: a causal LM, or a masked-diffusion model "
                   "(*ForMaskedLM, LLaDA, Dream; told apart by its config)")
    p.add_argument("--served-model-name", dest="model_name", metavar="NAME",
                   help="model id clients send (default: the model folder's name)")
    p.add_argument("--tokenizer", metavar="PATH", help="tokenizer folder or file (default: the model's)")
    p.add_argument("--host", default=d.host, help=f"interface to bind ({d.host})")
    p.add_argument("--port", type=int, default=d.port, help=f"port to bind ({d.port})")
    p.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1 and /infill")
    p.add_argument("--device", help="torch device, e.g. cpu or cuda")
    p.add_argument("--dtype", help="model dtype, e.g. float32 or bfloat16")
    p.add_argument("--threads", type=int, metavar="N", help="torch intra-op threads")
    p.add_argument("--max-batch", type=int, default=d.max_batch, metavar="N",
                   help=f"most sequences decoded together ({d.max_batch}); 1 = one request at a time")
    p.add_argument("--max-queued", type=int, default=d.max_queued, metavar="N",
                   help=f"most sequences waiting for a slot before 429 ({d.max_queued})")
    p.add_argument("--join-wait-ms", type=float, default=d.join_wait_ms, metavar="MS",
                   help=f"gather joining sequences this long while a batch runs ({d.join_wait_ms:g})")
    p.add_argument("--max-tokens-limit", type=int, default=d.max_tokens_limit, metavar="N",
                   help=f"largest max_tokens accepted ({d.max_tokens_limit})")
    p.add_argument("--max-n", type=int, default=d.max_n, metavar="N", help=f"largest n accepted ({d.max_n})")
    p.add_argument("--max-request-bytes", type=int, default=d.max_request_bytes, metavar="N",
                   help=f"largest request body ({d.max_request_bytes})")
    p.add_argument("--compile-timeout", dest="compile_timeout_s", type=float, default=d.compile_timeout_s,
                   metavar="S", help=f"compile budget per constraint in seconds ({d.compile_timeout_s:g}); over it: 422")
    p.add_argument("--default-sampler", default=d.default_sampler, choices=("masked", "asap", "awrs", "smc"),
                   help=f"sampler when a request names none ({d.default_sampler})")
    p.add_argument("--shutdown-timeout", dest="shutdown_timeout_s", type=float, default=d.shutdown_timeout_s,
                   metavar="S", help=f"seconds in-flight requests get on shutdown ({d.shutdown_timeout_s:g})")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, load the model, serve until interrupted; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        import uvicorn

        from server.app import create_app
        from server.config import ServerConfig
        from server.runtime import Runtime
    except ImportError as exc:
        print(f"corral serve: error: {exc}; install the server extra: pip install -e '.[serve]'", file=sys.stderr)
        return 2
    fields = {f.name for f in dataclasses.fields(ServerConfig)}
    settings = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    try:
        config = ServerConfig(**settings)
    except ValueError as exc:
        print(f"corral serve: error: {exc}", file=sys.stderr)
        return 2
    from pathlib import Path

    looks_local = config.model.startswith((".", "/", "~")) or Path(config.model).suffix
    if looks_local and not Path(config.model).expanduser().exists():
        print(f"corral serve: error: model folder not found: {config.model}", file=sys.stderr)
        return 2
    try:
        runtime = Runtime.load(config)
    except Exception as exc:  # noqa: BLE001 - a model that does not load is the user's input error
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"corral serve: error: cannot load model {config.model}: {type(exc).__name__}: {first}", file=sys.stderr)
        return 2
    app = create_app(config, runtime)
    uvicorn.run(app, host=config.host, port=config.port, log_level=args.log_level,
                timeout_graceful_shutdown=config.shutdown_timeout_s, access_log=args.log_level == "debug")
    return 0


if __name__ == "__main__":
    sys.exit(main())
