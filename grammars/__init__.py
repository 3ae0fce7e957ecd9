"""corral.grammars — WHAT IS ALLOWED: grammar IR, front ends, token vocabulary, automata, matchers."""
