"""corral.server — HOW TO SERVE: an OpenAI-compatible structured-output server.

``corral serve --model PATH`` (or ``python -m server``) runs FastAPI + uvicorn over one model:
``/v1/chat/completions`` and ``/v1/completions`` with ``response_format`` (``json_object``,
``json_schema``), vLLM's ``structured_outputs`` (``json``, ``regex``, ``grammar`` in GBNF or Lark,
``choice``), forced tool calls, streaming, and a ``sampler`` extra field (masked, asap, awrs, smc).

* ``server.app`` — routes, validation, streaming, OpenAI error objects;
* ``server.runtime`` — the loaded model, sampler instances, SMC through the batch;
* ``server.scheduler`` — continuous batching on one worker thread that owns the model;
* ``server.stepper`` — one decoding step over rows that join and leave (``engine.decoding``'s
  loop cut at the step);
* ``server.constraints`` — constraint specs, bounds, the compile cache and its time budget;
* ``server.chat`` — chat templates, the plain fallback format, tool-call schemas;
* ``server.protocol`` — request models and ``ApiError``; ``server.config`` — ``ServerConfig``.

Imports ``engine``, ``samplers`` and ``grammars``; nothing in those imports it.
FastAPI and uvicorn come with the ``serve`` extra: ``pip install -e '.[serve]'``.
"""

from server.config import ServerConfig

__all__ = ["ServerConfig", "create_app", "Runtime", "main"]


def __getattr__(name: str):
    # the web stack and the model code load only when asked for: ``from server import ServerConfig``
    # stays light, and a missing fastapi shows up where it is needed
    if name == "create_app":
        from server.app import create_app

        return create_app
    if name == "Runtime":
        from server.runtime import Runtime

        return Runtime
    if name == "main":
        from server.__main__ import main

        return main
    raise AttributeError(f"module 'server' has no attribute {name!r}")
