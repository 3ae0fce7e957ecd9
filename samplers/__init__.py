"""corral.samplers — HOW TO DRAW: token samplers driven by a grammar ``Matcher``.

Planned: ``masked`` (the grammar-constrained decoding baseline), ``asap`` (grammar-aligned
sampling), ``awrs`` and ``smc`` (adaptive weighted rejection sampling with particles),
``dingo`` (regex-constrained blocks for diffusion LMs) and ``infill`` (CFG-constrained infilling).
Imports ``grammars`` only; the public names are added to ``__all__`` as they land.
"""

__all__: list[str] = []
