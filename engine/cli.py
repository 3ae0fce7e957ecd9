"""``corral`` — the command line: generate, compile, check, bench.

Examples::

    corral generate --model models/tiny-json --schema person.json --prompt "A person: " --seed 0
    corral compile --tokenizer ../shared/vocab/ggml-vocab-gpt-2.gguf --gbnf ../shared/gbnf/json.gbnf
    corral check --tokenizer models/tiny-json --regex '[0-9]+' --text 12a
    corral bench grammars --tokenizer ../shared/vocab/ggml-vocab-llama-bpe.gguf
    corral serve --model models/tiny-json --port 8000 --api-key sk-local

Exit codes: 0 success; 1 the text was rejected (``check``) or a constrained generation hit
``--max-tokens`` before the constraint was complete; 2 usage or input errors (unreadable file,
bad JSON, unsupported schema keyword, grammar syntax error, unknown sampler, a model or
tokenizer that does not load, a device this machine lacks, options the API refuses together),
with one line on stderr naming the file, option or keyword — never a traceback for a user's
mistake. ``main(argv)`` returns the code (argparse's own errors and ``--help`` included) rather
than exiting, so it can be called in-process. ``--json`` prints one JSON object for scripts.

``generate`` builds the same ``GenerationOptions`` the Python API takes, with the constraint as
given (schema, regex, grammar), before any model loads: every check of the API applies (``--stop``
with ``--schema``, ``--whitespace`` without it, bad sampling numbers, a device this machine lacks).

Also runnable as ``python -m engine.cli``. ``bench`` runs ``python -m jsonschemabench`` in a
subprocess (the engine package never imports the benchmark package), and ``serve`` runs
``python -m server`` the same way (the OpenAI-compatible server sits above the engine).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["main", "build_parser"]

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the command line (exit code 2)."""


@dataclass
class _Constraint:
    kind: str  # "schema" | "regex" | "gbnf" | "lark"
    source: str  # the file name or the regex, for messages
    value: Any  # parsed schema, regex text, grammar text


# --- argument parsing -------------------------------------------------------------------------


def _add_constraint_args(parser: argparse.ArgumentParser, required: bool) -> None:
    group = parser.add_mutually_exclusive_group(required=required)
    group.add_argument("--schema", metavar="FILE", help="JSON Schema file (or inline JSON text starting with '{')")
    group.add_argument("--regex", metavar="REGEX", help="regular expression the whole output must match")
    group.add_argument("--gbnf", metavar="FILE", help="llama.cpp GBNF grammar file (start rule 'root')")
    group.add_argument("--lark", metavar="FILE", help="Lark EBNF grammar file (start rule 'start')")
    parser.add_argument(
        "--whitespace", choices=("compact", "flexible"), help="JSON whitespace policy (with --schema only)"
    )


def _add_tokenizer_command(sub, name: str, handler, **texts: str) -> argparse.ArgumentParser:
    """A subcommand over a tokenizer and a required constraint (``compile``, ``check``)."""
    command = sub.add_parser(name, **texts)
    command.add_argument("--tokenizer", required=True, metavar="PATH", help="tokenizer folder, tokenizer.json or .gguf")
    _add_constraint_args(command, required=True)
    command.set_defaults(handler=handler)
    return command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="corral",
        description="Constrained generation with token-mask automata: JSON Schema, regex, GBNF and Lark.",
        epilog="Exit codes: 0 ok, 1 rejected / incomplete output, 2 usage or input error.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    gen = sub.add_parser(
        "generate",
        help="generate text from a model under a constraint",
        description="Generate a completion of --prompt with a transformers causal LM, constrained by a schema, "
        "regex or grammar (or unconstrained when none is given).",
    )
    gen.add_argument("--model", required=True, metavar="DIR", help="model folder (or hub id) for from_pretrained")
    gen.add_argument("--tokenizer", metavar="PATH", help="tokenizer folder/file (default: the model folder)")
    _add_constraint_args(gen, required=False)
    gen.add_argument("--prompt", required=True, help="prompt text (plain text; see --chat-template)")
    gen.add_argument("--max-tokens", type=int, default=256, metavar="N", help="token budget, EOS included (256)")
    gen.add_argument("--seed", type=int, metavar="S", help="random seed (same seed, same output)")
    gen.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 is greedy (1.0)")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0)")
    gen.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 = all (0)")
    gen.add_argument("--sampler", default="masked", help="masked (default), asap, awrs or smc")
    gen.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    gen.add_argument("--chat-template", action="store_true", help="wrap the prompt with the tokenizer's chat template")
    gen.add_argument("--device", help="torch device, e.g. cpu or cuda")
    gen.add_argument("--dtype", help="model dtype, e.g. float32 or bfloat16")
    gen.add_argument("--json", action="store_true", help="print the result as one JSON object")
    gen.set_defaults(handler=_cmd_generate)

    comp = _add_tokenizer_command(
        sub, "compile", _cmd_compile,
        help="compile a constraint and report its size and timing",
        description="Compile a schema, regex or grammar for a tokenizer; print compile time, terminals, "
        "productions and the size of the first mask.",
    )
    comp.add_argument("--json", action="store_true", help="print the report as one JSON object")

    check = _add_tokenizer_command(
        sub, "check", _cmd_check,
        help="check whether a text is accepted by a constraint",
        description="Tokenize a text and feed it through the constraint's matcher. Exit 0 if accepted, 1 if "
        "rejected (with the first rejected position) or incomplete.",
    )
    text = check.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", help="the text to check")
    text.add_argument("--text-file", metavar="FILE", help="read the text to check from a file")
    check.add_argument("--json", action="store_true", help="print the verdict as one JSON object")

    bench = sub.add_parser(
        "bench",
        help="run the benchmarks (python -m jsonschemabench)",
        description="Runs 'python -m jsonschemabench ARGS...' in a subprocess; see its --help.",
        add_help=False,
    )
    bench.add_argument("args", nargs="*", help="arguments passed to python -m jsonschemabench")

    serve = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API (python -m server)",
        description="Runs 'python -m server ARGS...' (--model PATH_OR_ID [--host] [--port] [--api-key]); see its --help.",
        add_help=False,
    )
    serve.add_argument("args", nargs="*", help="arguments passed to python -m server")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (``sys.exit(main())`` in the console script)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # everything after "bench" belongs to jsonschemabench, --help included
        args = argparse.Namespace(handler=_cmd_bench, args=argv[1:])
    elif argv[:1] == ["serve"]:  # likewise for the server
        args = argparse.Namespace(handler=_cmd_serve, args=argv[1:])
    else:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # argparse printed the usage line and its error (or --help)
            return _exit_code(exc)
    try:
        return args.handler(args)
    except UsageError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # typed errors become exit code 2 with their message
        from grammars import ConstraintError

        if isinstance(exc, (ConstraintError, ValueError, TypeError, OSError, ImportError)):
            return _fail(f"{type(exc).__name__}: {exc}")
        raise


def _exit_code(exc: SystemExit) -> int:
    """The code a ``SystemExit`` carries (``None`` is success; a message is an error)."""
    if exc.code is None:
        return EXIT_OK
    return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def _fail(message: str) -> int:
    """One line on stderr (the first of a multi-line message: tracebacks-in-disguise stay out)."""
    lines = [line for line in message.strip().splitlines() if line.strip()]
    print(f"corral: error: {lines[0] if lines else 'failed'}", file=sys.stderr)
    return EXIT_USAGE


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else 'no message'}"


# --- inputs -------------------------------------------------------------------------------------


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{what} file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {what} file {path}: {exc}") from None


def _constraint(args: argparse.Namespace) -> _Constraint | None:
    if getattr(args, "whitespace", None) and not args.schema:
        raise UsageError("--whitespace applies to --schema only")
    if args.schema:
        if args.schema.lstrip().startswith("{") and not Path(args.schema).exists():
            text, source = args.schema, "<inline schema>"
        else:
            text, source = _read_text(args.schema, "schema"), args.schema
        try:
            return _Constraint("schema", source, json.loads(text))
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno} column {exc.colno}"
            raise UsageError(f"schema {source} is not valid JSON: {exc.msg} at {where}") from None
    if args.regex is not None:
        return _Constraint("regex", args.regex, args.regex)
    if args.gbnf:
        return _Constraint("gbnf", args.gbnf, _read_text(args.gbnf, "GBNF grammar"))
    if args.lark:
        return _Constraint("lark", args.lark, _read_text(args.lark, "Lark grammar"))
    return None


def _load_vocab(path: str):
    """The tokenizer at ``path``; any failure to read it is the user's input error (exit 2)."""
    from grammars import TokenVocabulary

    if not Path(path).expanduser().exists():
        raise UsageError(f"tokenizer not found: {path}")
    try:
        return TokenVocabulary.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - a file we cannot read as a tokenizer, whatever the library raised
        raise UsageError(f"cannot load tokenizer {path}: {_first_line(exc)}") from None


def _load_model(args: argparse.Namespace):
    """The model and its vocabulary for ``generate``; a model or tokenizer that does not load is exit 2."""
    from engine.generate import load_model, load_vocabulary

    model_path = Path(args.model).expanduser()
    if not model_path.exists() and (args.model.startswith((".", "/", "~")) or model_path.suffix):
        raise UsageError(f"model folder not found: {args.model}")
    if args.tokenizer is not None and not Path(args.tokenizer).expanduser().exists():
        raise UsageError(f"tokenizer not found: {args.tokenizer}")
    try:
        lm, tok_source = load_model(args.model, args.tokenizer, device=args.device, dtype=args.dtype)
    except Exception as exc:  # noqa: BLE001 - a folder (or hub id) we cannot load as a model
        raise UsageError(f"cannot load model {args.model}: {_first_line(exc)}") from None
    if isinstance(tok_source, str) and not Path(tok_source).expanduser().exists():
        raise UsageError(f"tokenizer not found: {tok_source}")
    try:
        return lm, load_vocabulary(tok_source, lm)
    except Exception as exc:  # noqa: BLE001 - as above, for the tokenizer
        raise UsageError(f"cannot load tokenizer {tok_source}: {_first_line(exc)}") from None


def _compile(compiler, constraint: _Constraint, whitespace: str | None):
    if constraint.kind == "schema":
        try:
            importlib.import_module("grammars.frontends.json_schema")
        except ImportError as exc:
            raise UsageError(f"JSON Schema support is not available in this installation ({exc})") from None
        options = {} if whitespace is None else {"whitespace": whitespace}
        return compiler.compile_json_schema(constraint.value, **options)
    if constraint.kind == "regex":
        return compiler.compile_regex(constraint.value)
    if constraint.kind == "gbnf":
        return compiler.compile_gbnf(constraint.value)
    return compiler.compile_lark(constraint.value)


def _describe_error(exc: Exception, constraint: _Constraint) -> str:
    return f"{constraint.kind} {constraint.source}: {type(exc).__name__}: {exc}"


# --- commands -----------------------------------------------------------------------------------


def _generation_options(args: argparse.Namespace, constraint: _Constraint | None):
    """``GenerationOptions`` for the command line, checked as the API checks them, before any model loads."""
    from engine.generate import GenerationOptions
    from grammars import GrammarError, parse_gbnf, parse_lark, parse_regex

    given: dict[str, Any] = {}
    try:  # grammar text is parsed here, so that a syntax error is reported before a model loads
        if constraint is None:
            pass
        elif constraint.kind == "lark":
            given["grammar"] = parse_lark(constraint.value, source=constraint.source)
        elif constraint.kind == "gbnf":
            given["grammar"] = parse_gbnf(constraint.value, source=constraint.source)
        elif constraint.kind == "regex":
            parse_regex(constraint.value)
            given["regex"] = constraint.value
        else:
            given["schema"] = constraint.value
    except GrammarError as exc:
        raise UsageError(_describe_error(exc, constraint)) from None
    try:
        return GenerationOptions(
            **given, whitespace=args.whitespace, sampler=args.sampler, max_tokens=args.max_tokens,
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
            stop=args.stop or None, chat_template=args.chat_template, device=args.device, dtype=args.dtype,
            progress=True,  # a tqdm bar on stderr, hidden when stderr is not a terminal
        )
    except (ValueError, TypeError) as exc:
        raise UsageError(_option_names(str(exc))) from None


def _option_names(message: str) -> str:
    """An API message in command-line terms: ``stop=`` is ``--stop`` here."""
    message = message.replace("chat_template=True", "--chat-template")
    return re.sub(r"\b(schema|regex|grammar|stop|whitespace|max_tokens|top_p|top_k|temperature|seed|device|dtype|"
                  r"sampler)=(?=[\s:,.;)]|$)", lambda m: "--" + m.group(1).replace("_", "-"), message)


def _cmd_generate(args: argparse.Namespace) -> int:
    from engine.generate import generate_batch
    from grammars import Compiler, GrammarError

    constraint = _constraint(args)
    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    options = _generation_options(args, constraint)
    lm, vocab = _load_model(args)
    options = dataclasses.replace(options, tokenizer=vocab, compiler=Compiler(vocab), device=None, dtype=None)
    try:
        [result] = generate_batch([args.prompt], model=lm, options=options)
    except GrammarError as exc:
        if constraint is None:
            raise
        raise UsageError(_describe_error(exc, constraint)) from None
    except (ValueError, TypeError) as exc:
        raise UsageError(_option_names(f"{type(exc).__name__}: {exc}")) from None
    incomplete = constraint is not None and result.finish_reason == "length"
    if args.json:
        print(json.dumps({
            "text": result.text,
            "finish_reason": result.finish_reason,
            "tokens": len(result.token_ids),
            "forced_tokens": result.forced_tokens,
            "first_token_s": result.first_token_s,
            "mean_token_s": result.mean_token_s,
        }, ensure_ascii=False))
    else:
        print(result.text)
        print(
            f"[{result.finish_reason}; {len(result.token_ids)} tokens, {result.forced_tokens} forced; "
            f"first token {result.first_token_s or 0:.3f}s]",
            file=sys.stderr,
        )
    if incomplete:
        print("corral: the constraint was not complete when --max-tokens ran out", file=sys.stderr)
    return EXIT_REJECTED if incomplete else EXIT_OK


def _cmd_compile(args: argparse.Namespace) -> int:
    from grammars import Compiler, GrammarError, allocate_token_bitmask
    from grammars.bitmask import unpack_bits

    constraint = _constraint(args)
    assert constraint is not None
    t0 = time.perf_counter()
    vocab = _load_vocab(args.tokenizer)
    vocab_s = time.perf_counter() - t0
    compiler = Compiler(vocab)
    t1 = time.perf_counter()
    try:
        compiled = _compile(compiler, constraint, args.whitespace)
        matcher = compiled.matcher()
        mask = allocate_token_bitmask(1, vocab.logits_width)
        matcher.fill_mask(mask, 0)
    except GrammarError as exc:
        raise UsageError(_describe_error(exc, constraint)) from None
    compile_s = time.perf_counter() - t1
    allowed = int(unpack_bits(mask[0], vocab.logits_width).sum())
    forced = matcher.forced_tokens()
    report = {
        "constraint": constraint.kind,
        "source": constraint.source,
        "tokenizer": vocab.name,
        "vocab_size": vocab.size,
        "vocab_load_s": round(vocab_s, 4),
        "compile_s": round(compile_s, 4),
        "terminals": compiled.n_terminals,
        "productions": compiled.n_productions,
        "regular": compiled.is_regular,
        "first_mask_allowed": allowed,
        "forced_at_start": vocab.decode(forced).decode("utf-8", errors="replace"),
    }
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        width = max(map(len, report))
        for key, value in report.items():
            print(f"{key:<{width}}  {value}")
    return EXIT_OK


def _cmd_check(args: argparse.Namespace) -> int:
    from grammars import Compiler, GrammarError

    constraint = _constraint(args)
    assert constraint is not None
    text = args.text if args.text is not None else _read_text(args.text_file, "text")
    vocab = _load_vocab(args.tokenizer)
    try:
        compiled = _compile(Compiler(vocab), constraint, args.whitespace)
    except GrammarError as exc:
        raise UsageError(_describe_error(exc, constraint)) from None
    verdict = check_text(compiled, vocab, text)
    if args.json:
        print(json.dumps(verdict, ensure_ascii=False))
    elif verdict["accepted"]:
        print(f"accepted ({verdict['tokens']} tokens)")
    elif verdict["reason"] == "incomplete":
        print(f"rejected: incomplete — every token is allowed but the text is not a complete match "
              f"({verdict['tokens']} tokens)")
    else:
        offset = verdict["byte_offset"]
        data = text.encode("utf-8")
        before = data[max(0, offset - 30) : offset].decode("utf-8", errors="replace")
        after = data[offset : offset + 30].decode("utf-8", errors="replace")
        print(f"rejected at token {verdict['token_index']} (byte offset {offset}, token {verdict['token']!r}):")
        print(f"  {before}{after}")
        print(f"  {' ' * len(before)}^")
    return EXIT_OK if verdict["accepted"] else EXIT_REJECTED


def check_text(compiled, vocab, text: str) -> dict:
    """Feed ``text`` through a fresh matcher; a verdict dict (see ``corral check --json``).

    Tokenizes with the vocabulary's tokenizer when that reproduces the text's bytes exactly;
    otherwise (e.g. SentencePiece's dummy-prefix space) greedily with the longest token the
    matcher allows, so the answer is about the text, not about one segmentation of it.
    """
    data = text.encode("utf-8")
    ids = vocab.encode(text) if text else []
    matcher = compiled.matcher()
    if vocab.decode(ids) == data:
        offset = 0
        for i, token in enumerate(ids):
            if not matcher.allows(token):
                piece = vocab.token_bytes[token].decode("utf-8", errors="replace")
                return _rejected(i, offset, piece, len(ids))
            matcher.advance(token)
            offset += len(vocab.token_bytes[token])
        return _final(matcher, len(ids))
    pieces: dict[bytes, int] = {}
    for tid, piece in enumerate(vocab.token_bytes):
        if piece:
            pieces.setdefault(piece, tid)
    longest = max(map(len, pieces))
    pos = count = 0
    while pos < len(data):
        for length in range(min(longest, len(data) - pos), 0, -1):
            token = pieces.get(data[pos : pos + length])
            if token is not None and matcher.allows(token):
                matcher.advance(token)
                pos += length
                count += 1
                break
        else:
            return _rejected(count, pos, data[pos : pos + 1].decode("utf-8", errors="replace"), count)
    return _final(matcher, count)


def _rejected(index: int, offset: int, token: str, total: int) -> dict:
    return {"accepted": False, "reason": "rejected", "token_index": index, "byte_offset": offset,
            "token": token, "tokens": total}


def _final(matcher, total: int) -> dict:
    if matcher.is_accepting():
        return {"accepted": True, "reason": "accepted", "tokens": total}
    return {"accepted": False, "reason": "incomplete", "tokens": total}


def _cmd_bench(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("jsonschemabench") is None:
        raise UsageError("the benchmark package 'jsonschemabench' is not installed; run pip install -e '.[bench]'")
    command = [sys.executable, "-m", "jsonschemabench", *args.args]
    return subprocess.run(command, check=False).returncode


def _cmd_serve(args: argparse.Namespace) -> int:
    """``python -m server ARGS`` in a child process; SIGTERM is passed on to it, and SIGINT (which a
    terminal sends to the child as well) is left to it, so Ctrl-C shuts the server down once,
    gracefully. A shutdown by either signal is exit code 0."""
    import signal

    if importlib.util.find_spec("server") is None or importlib.util.find_spec("fastapi") is None:
        raise UsageError("corral serve needs the server extra; run pip install -e '.[serve]'")
    process = subprocess.Popen([sys.executable, "-m", "server", *args.args])
    previous = {}
    try:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, lambda signum, frame: process.send_signal(signum))
    except ValueError:  # not the main thread: signals stay as they are
        pass
    try:
        code = process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code in (-signal.SIGINT, -signal.SIGTERM):
        return EXIT_OK
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
