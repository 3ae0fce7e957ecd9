"""corral.jsonschemabench — HOW GOOD AND HOW FAST: benchmarks of corral against its peers.

Run as a program, not imported: ``python -m jsonschemabench grammars --tokenizer PATH`` times
compilation and token masks on GBNF grammars and regexes for corral, llguidance and xgrammar.
It uses only the public APIs of ``grammars``, ``samplers`` and ``engine``; nothing imports it.
"""

__all__: list[str] = []
