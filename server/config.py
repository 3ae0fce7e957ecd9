"""``ServerConfig``: every bound and setting of ``corral serve`` in one frozen dataclass.

The defaults suit a small model on one machine. Every limit exists so that a hostile or
mistaken request fails fast with a 4xx naming the limit, never with a 500 or a stalled worker:

* the body (``max_request_bytes``, 413), ``max_tokens`` (``max_tokens_limit``), ``n``
  (``max_n``), messages, stop strings and prompts (400);
* constraints: text size (``max_constraint_bytes``), schema nesting (``max_schema_depth``) and
  choices (``max_choices``) before compiling (422), ``compile_limits`` (``grammars.Limits``)
  while compiling and matching, and ``compile_timeout_s``: a compilation that does not finish in
  that wall time answers 422 (it goes on in the background and its result is cached);
* the queue: at most ``max_queued`` sequences wait for a slot in the batch (429 beyond).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grammars import Limits

__all__ = ["ServerConfig", "DEFAULT_LIMITS"]

#: Tighter than ``grammars.Limits()``: a server compiles text from strangers. A 2 s bound per
#: matcher call keeps one pathological grammar from stalling the batch for long.
DEFAULT_LIMITS = Limits(
    max_dfa_states=50_000,
    max_nfa_states=500_000,
    max_productions=100_000,
    max_parser_stacks=20_000,
    max_configurations=50_000,
    max_step_seconds=2.0,
)


@dataclass(frozen=True)
class ServerConfig:
    """Settings of one server process (``python -m server --help`` lists them as options)."""

    model: str
    #: the model id clients send and ``/v1/models`` lists (default: the model path's last part)
    model_name: str | None = None
    tokenizer: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    device: str | None = None
    dtype: str | None = None
    #: torch intra-op threads (None: torch's default)
    threads: int | None = None
    #: most sequences decoded together in one batch; 1 disables batching (one at a time)
    max_batch: int = 32
    #: most sequences waiting for a batch slot before requests are refused with 429
    max_queued: int = 1024
    #: new sequences wait at most this long for the next batch boundary once some are running
    #: (joining re-feeds the batch's KV cache; see ``server.scheduler``)
    join_wait_ms: float = 20.0
    max_request_bytes: int = 1 << 20
    max_tokens_limit: int = 4096
    default_max_tokens: int = 256
    #: OpenAI's default for the legacy completions endpoint
    default_completion_tokens: int = 16
    max_n: int = 16
    max_messages: int = 256
    max_prompts: int = 64
    max_stop: int = 4
    max_stop_chars: int = 256
    max_constraint_bytes: int = 64 << 10
    max_schema_depth: int = 64
    max_choices: int = 256
    max_tools: int = 64
    compile_timeout_s: float = 10.0
    compile_workers: int = 2
    compile_cache_size: int = 256
    compile_limits: Limits = field(default_factory=lambda: DEFAULT_LIMITS)
    default_sampler: str = "masked"
    #: seconds uvicorn waits for in-flight requests on shutdown before cancelling them
    shutdown_timeout_s: float = 30.0
    #: pass ``logits_to_keep=1`` to transformers models that take it (prefill computes the
    #: output layer for the last position only: the same logits, far less memory)
    last_logits_only: bool = True

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_queued", "max_request_bytes", "max_tokens_limit", "default_max_tokens",
                     "default_completion_tokens", "max_n", "max_messages", "max_prompts", "max_stop",
                     "max_stop_chars", "max_constraint_bytes", "max_schema_depth", "max_choices", "max_tools",
                     "compile_workers", "compile_cache_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not 0 < self.compile_timeout_s:
            raise ValueError(f"compile_timeout_s must be positive, got {self.compile_timeout_s}")
        if self.join_wait_ms < 0 or self.shutdown_timeout_s < 0:
            raise ValueError("join_wait_ms and shutdown_timeout_s must be >= 0")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must be a non-empty string when given")
