"""corral inside other serving engines, through each engine's own extension point.

- ``integrations.sglang_backend``: a grammar backend for SGLang (``--grammar-backend corral``),
  registered from the ``sglang.srt.plugins`` entry point.
- ``integrations.vllm_logits``: a vLLM v1 logits processor (entry point ``vllm.logits_processors``)
  that constrains requests whose ``SamplingParams.extra_args`` carry a corral constraint.

Neither engine is a dependency of corral: these modules import the engine only when the engine
loads them. Their tests run in one virtual environment per engine (``scripts/integration.sh``).
"""
