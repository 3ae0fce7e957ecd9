"""Server throughput and latency: ``corral serve`` under concurrent streaming load, batched and not.

For each server setting — continuous batching (``--max-batch N``, default 32) and one sequence at
a time (``--max-batch 1``) — a server process is started on a free loopback port, warmed up
(constraints compiled, first forward passes run), and loaded by closed-loop clients: at
concurrency ``c``, ``c`` clients each send streaming chat requests back to back, ``max(8, c)``
requests in all (``--requests`` overrides). Two workloads:

* ``text``: unconstrained, ``ignore_eos`` — every request generates exactly ``--max-tokens`` (64);
* ``json``: ``response_format`` JSON Schema, one of four small schemas per request (enums,
  booleans, bounded strings and arrays) — the output ends where the grammar and the model end
  it; ``--json-max-tokens`` (128) leaves room, so budget-aware closing rarely has to narrow (its
  exact fallback checks every allowed token, seconds on a 50k vocabulary, and stalls the batch:
  with an untrained model it would dominate the timing).

Reported per (workload, max-batch, concurrency): requests/s, completion tokens/s (from the
usage chunk), TTFT (request sent to first content chunk) p50/p99, inter-token latency (gaps
between content chunks after the first; a chunk is one step's new text) p50/p99, and the
batching gain (tokens/s batched ÷ tokens/s at ``--max-batch 1``). Every JSON output is checked
against its schema; invalid outputs are counted in the table.

``--model`` is a transformers folder, or ``random`` (default): the ``engine.tiny`` architecture
(GPT-2, 2 layers, hidden 128) randomly initialised over ``../shared/vocab``'s GPT-2 vocabulary —
speed does not depend on training. Needs the ``serve`` extra (fastapi, uvicorn, httpx).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import outputs

__all__ = ["add_arguments", "main", "SCHEMAS"]

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_NAME = "bench"

SCHEMAS = [
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
                                      "note": {"type": "string", "maxLength": 24}},
     "required": ["colour", "ok", "note"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 16},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4}},
     "required": ["name", "tags"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"k": {"enum": ["x", "y"]}, "v": {"type": "boolean"}},
                                "required": ["k", "v"], "additionalProperties": False}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"title": {"type": "string", "maxLength": 32},
                                      "done": {"type": "boolean"}, "level": {"enum": ["low", "mid", "high"]}},
     "required": ["title", "done", "level"], "additionalProperties": False},
]


@dataclass
class Sample:
    """One request as the client saw it."""

    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    valid: bool | None = None
    error: str | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _random_model(folder: Path, vocab_path: Path) -> Path:
    from engine.tiny import TinyConfig, build_model, load_tokenizer

    tokenizer, vocab = load_tokenizer(vocab_path)
    eos = min(vocab.eos_token_ids)
    model = build_model(TinyConfig(vocab_size=vocab.logits_width, bos_token_id=vocab.bos_token_id, eos_token_id=eos))
    model.generation_config.eos_token_id = eos
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class _Server:
    def __init__(self, model: Path, max_batch: int, threads: int, log: Path):
        import httpx

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "server", "--model", str(model), "--served-model-name", MODEL_NAME,
                   "--port", str(self.port), "--max-batch", str(max_batch), "--threads", str(threads),
                   "--log-level", "warning", "--max-tokens-limit", "4096"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
        self.log = log
        with open(log, "w", encoding="utf-8") as sink:
            self.process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while True:
            if self.process.poll() is not None:
                tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
                raise RuntimeError(f"the server exited during startup:\n{tail}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start within 300 s; see {log}")
            time.sleep(0.3)

    def health(self) -> dict:
        import httpx

        return httpx.get(self.url + "/health", timeout=30).json()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


async def _request(client, url: str, body: dict, schema: dict | None) -> Sample:
    sample = Sample()
    text = []
    start = time.perf_counter()
    last = None
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                sample.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return sample
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    sample.error = chunk["error"]["message"]
                    continue
                if chunk.get("usage"):
                    sample.tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", ()):
                    piece = choice["delta"].get("content")
                    if piece:
                        now = time.perf_counter()
                        if last is None:
                            sample.ttft = now - start
                        else:
                            sample.gaps.append(now - last)
                        last = now
                        text.append(piece)
    except Exception as exc:  # noqa: BLE001 - counted as a failed request
        sample.error = f"{type(exc).__name__}: {exc}"
        return sample
    if schema is not None and sample.error is None:
        import jsonschema

        try:
            jsonschema.validate(json.loads("".join(text)), schema)
            sample.valid = True
        except (ValueError, jsonschema.ValidationError):
            sample.valid = False
    return sample


def _body(i: int, workload: str, max_tokens: dict[str, int]) -> tuple[dict, dict | None]:
    body: dict[str, Any] = {"model": MODEL_NAME, "messages": [{"role": "user", "content": f"Request {i}: answer."}],
                            "max_tokens": max_tokens[workload], "seed": i, "stream": True,
                            "stream_options": {"include_usage": True}}
    if workload == "text":
        body["ignore_eos"] = True
        return body, None
    schema = SCHEMAS[i % len(SCHEMAS)]
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": f"s{i % len(SCHEMAS)}",
                                                                      "schema": schema}}
    return body, schema


async def _load(url: str, workload: str, concurrency: int, requests: int, max_tokens: dict[str, int],
                offset: int) -> tuple[list[Sample], float]:
    import httpx

    queue: asyncio.Queue = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(offset + i)
    samples: list[Sample] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def worker():
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                body, schema = _body(i, workload, max_tokens)
                samples.append(await _request(client, url, body, schema))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return samples, time.perf_counter() - start


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def _summarise(samples: list[Sample], wall: float) -> dict[str, Any]:
    ok = [s for s in samples if s.error is None]
    tokens = sum(s.tokens for s in ok)
    ttft = [s.ttft for s in ok if s.ttft is not None]
    gaps = [g for s in ok for g in s.gaps]
    return {
        "requests": len(samples), "errors": len(samples) - len(ok),
        "invalid": sum(1 for s in ok if s.valid is False),
        "wall_s": wall, "req_per_s": len(ok) / wall if wall else 0.0, "tokens": tokens,
        "tok_per_s": tokens / wall if wall else 0.0,
        "ttft_p50_ms": _ms(_pct(ttft, 50)), "ttft_p99_ms": _ms(_pct(ttft, 99)),
        "itl_p50_ms": _ms(_pct(gaps, 50)), "itl_p99_ms": _ms(_pct(gaps, 99)),
        "mean_tokens": statistics.mean(s.tokens for s in ok) if ok else 0.0,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def run(model: Path, *, batch: int, concurrency: list[int], max_tokens: dict[str, int], requests: int | None,
        threads: int,
        workloads: list[str], log_dir: Path) -> list[dict[str, Any]]:
    """Every (server setting, workload, concurrency) cell; one server process per setting."""
    rows = []
    for max_batch in (batch, 1):
        outputs.log(f"starting the server with --max-batch {max_batch}")
        server = _Server(model, max_batch, threads, log_dir / f"server-batch{max_batch}.log")
        try:
            for workload in workloads:  # warm-up: compile every schema, run the first forward passes
                asyncio.run(_load(server.url, workload, 4, 4 if workload == "json" else 2, {workload: 8}, 10_000))
            offset = 0
            for workload in workloads:
                for c in concurrency:
                    n = requests or max(8, c)
                    samples, wall = asyncio.run(_load(server.url, workload, c, n, max_tokens, offset))
                    offset += n
                    row = {"workload": workload, "max_batch": max_batch, "concurrency": c, **_summarise(samples, wall)}
                    health = server.health()
                    row["largest_batch"] = health["max_batch_seen"]
                    rows.append(row)
                    outputs.log(f"  {workload:4} batch={max_batch:<3} c={c:<3} {row['req_per_s']:.2f} req/s "
                                f"{row['tok_per_s']:.1f} tok/s ttft p50 {row['ttft_p50_ms'] or 0:.0f} ms")
        finally:
            server.stop()
    gains = {(r["workload"], r["concurrency"]): r["tok_per_s"] for r in rows if r["max_batch"] == 1}
    for r in rows:
        base = gains.get((r["workload"], r["concurrency"]))
        r["batching_gain"] = r["tok_per_s"] / base if base and r["max_batch"] != 1 else None
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The results as a Markdown table."""
    def f(value, digits=1):
        return "—" if value is None else f"{value:.{digits}f}"

    def gain(value):
        return "—" if value is None else f"{value:.2f}x"

    lines = ["| workload | max-batch | concurrency | requests | req/s | tokens/s | mean tokens | TTFT p50 ms | "
             "TTFT p99 ms | ITL p50 ms | ITL p99 ms | batching gain | errors | invalid |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['max_batch']} | {r['concurrency']} | {r['requests']} | "
                     f"{f(r['req_per_s'], 2)} | {f(r['tok_per_s'])} | {f(r['mean_tokens'])} | {f(r['ttft_p50_ms'], 0)} | "
                     f"{f(r['ttft_p99_ms'], 0)} | {f(r['itl_p50_ms'])} | {f(r['itl_p99_ms'])} | "
                     f"{gain(r['batching_gain'])} | "
                     f"{r['errors']} | {r['invalid']} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``serve`` subcommand's options on ``parser``."""
    parser.add_argument("--model", default="random",
                        help="transformers model folder, or 'random': the engine.tiny architecture, untrained (default)")
    parser.add_argument("--vocab", type=Path, default=None,
                        help="vocabulary for --model random (default: ../shared/vocab/ggml-vocab-gpt-2.gguf)")
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts (1,8,32)")
    parser.add_argument("--max-batch", type=int, default=32, help="the batched server's --max-batch (32)")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens per text request (64)")
    parser.add_argument("--json-max-tokens", type=int, default=128, help="max_tokens per JSON request (128)")
    parser.add_argument("--requests", type=int, default=None, help="requests per cell (default max(8, concurrency))")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the server (1)")
    parser.add_argument("--workloads", default="text,json", help="text, json or both (text,json)")
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON (.json) or Markdown (.md)")
    parser.set_defaults(run=main)


def main(args: argparse.Namespace) -> int:
    """Run the server benchmark with parsed ``args``; prints the table, returns the exit status."""
    missing = [m for m in ("httpx", "uvicorn", "fastapi") if importlib.util.find_spec(m) is None]
    if missing:
        outputs.log(f"the serve benchmark needs the serve extra (missing {', '.join(missing)}); "
                    "pip install -e '.[serve]'")
        return 2
    concurrency = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    workloads = [w.strip() for w in str(args.workloads).split(",") if w.strip()]
    if not concurrency or any(c < 1 for c in concurrency) or not set(workloads) <= {"text", "json"} or not workloads:
        outputs.log("--concurrency takes positive ints and --workloads text and/or json")
        return 2
    with tempfile.TemporaryDirectory(prefix="corral-serve-bench-") as tmp:
        tmp_dir = Path(tmp)
        if args.model == "random":
            vocab = args.vocab or REPO_ROOT.parent / "shared" / "vocab" / "ggml-vocab-gpt-2.gguf"
            if not Path(vocab).exists():
                outputs.log(f"vocabulary not found: {vocab} (pass --vocab)")
                return 2
            model = _random_model(tmp_dir / "model", Path(vocab))
        else:
            model = Path(args.model)
            if not (model / "config.json").is_file():
                outputs.log(f"no model at {model}")
                return 2
        rows = run(model, batch=args.max_batch, concurrency=concurrency,
                   max_tokens={"text": args.max_tokens, "json": args.json_max_tokens},
                   requests=args.requests, threads=args.threads, workloads=workloads, log_dir=tmp_dir)
    text = table(rows)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2) + "\n" if args.out.suffix == ".json" else text + "\n",
                            encoding="utf-8")
    return 0 if all(r["errors"] == 0 and r["invalid"] == 0 for r in rows) else 1
