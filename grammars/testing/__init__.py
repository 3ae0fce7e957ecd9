"""The test kit: laws every matcher obeys (``laws``) and slow reference oracles (``oracles``).

Shipped with the library so users can check their own matchers and grammars with it; nothing in
the library imports it.
"""

from grammars.testing.laws import MatcherLaws, allowed_tokens

__all__ = ["MatcherLaws", "allowed_tokens"]
