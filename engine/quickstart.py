"""The README quickstart: ``generate`` with a JSON Schema and the tiny model, offline.

``python -m engine.quickstart`` trains the tiny JSON model first when ``--model`` (default
``models/tiny-json``) holds none — ``python -m engine.tiny`` on ``../shared`` (or
``$CORRAL_SHARED_DIR``), about ``--minutes`` of CPU time plus a short evaluation — then generates
one value for a small schema, prints it and checks it with ``jsonschema``. Exit status 0 when
the value validates. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["SCHEMA", "main"]

#: A schema with the usual parts: required properties, a bounded integer, an enum, an array.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}


def shared_dir() -> Path:
    """``$CORRAL_SHARED_DIR``, else ``../shared`` from the working directory."""
    return Path(os.environ.get("CORRAL_SHARED_DIR") or Path("..") / "shared")


def ensure_model(model: Path, minutes: float, log=print) -> None:
    """Train the tiny model into ``model`` unless a saved one is there already."""
    if (model / "config.json").is_file():
        return
    shared = shared_dir()
    vocab = shared / "vocab" / "ggml-vocab-gpt-2.gguf"
    data = shared / "jsonschemabench" / "maskbench"
    for needed in (vocab, data):
        if not needed.exists():
            raise SystemExit(f"{needed} not found: put the shared data at ../shared or set CORRAL_SHARED_DIR")
    log(f"no model at {model}: training the tiny JSON model for {minutes:g} minutes (python -m engine.tiny)")
    from engine import tiny

    status = tiny.main(["--vocab", str(vocab), "--data", str(data), "--out", str(model), "--minutes", str(minutes)])
    if status:
        raise SystemExit(status)


def main(argv: Sequence[str] | None = None) -> int:
    """Train if needed, generate, print the value, validate it; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m engine.quickstart", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models") / "tiny-json", help="model folder")
    parser.add_argument("--minutes", type=float, default=8.0, help="training budget when the model is missing (8)")
    parser.add_argument("--schema", type=Path, help="a JSON Schema file (default: a small person schema)")
    parser.add_argument("--max-tokens", type=int, default=96, help="token budget (96)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    ensure_model(args.model, args.minutes)

    import jsonschema

    from engine import generate

    schema = json.loads(args.schema.read_text(encoding="utf-8")) if args.schema else SCHEMA
    prompt = "Schema: " + json.dumps(schema, separators=(",", ":")) + "\nJSON: "  # as engine.tiny trains
    result = generate(prompt, schema=schema, model=str(args.model), max_tokens=args.max_tokens, seed=args.seed,
                      temperature=0.7)
    print(result.text)
    try:
        jsonschema.validate(result.value, schema)
        valid = True
    except jsonschema.ValidationError as exc:
        valid = False
        print(f"not valid: {exc.message}", file=sys.stderr)
    per_token = f"{1e3 * result.mean_token_s:.1f} ms/token" if result.mean_token_s else "-"
    print(f"finish_reason={result.finish_reason} tokens={len(result.token_ids)} valid={valid} "
          f"compile={1e3 * result.compile_s:.0f} ms {per_token}", file=sys.stderr)
    return 0 if valid else 1


if __name__ == "__main__":
    sys.exit(main())
