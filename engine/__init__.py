"""corral.engine — HOW TO RUN A MODEL: language-model adapters, decoders and ``generate()``.

Planned: the ``LanguageModel`` protocol with Hugging Face causal and diffusion adapters and a
scripted mock, autoregressive / speculative / parallel / diffusion decoders, ``generate()``,
a ``LogitsProcessor`` shim, the CLI and the HTTP service. Imports ``samplers`` and ``grammars``;
the public names are added to ``__all__`` as they land.
"""

__all__: list[str] = []
