"""The mask engine: from a match state to the set of allowed tokens.

Layer: below ``grammars.matcher`` and ``grammars.compile``, above ``grammars.automata`` and
``grammars.vocab``; it never sees a front end or a schema. See docs/ARCHITECTURE.md.

* ``runtime``     — match states (sets of parser configurations), ``consume``, whole-mask memos;
* ``token_walk``  — walks of the vocabulary trie from a terminal DFA state, and lexical paths;
* ``token_slices``— the vocabulary split once into plain-text tokens and a residual trie;
* ``completion``  — shortest completions from the grammar's structure;
* ``token_dfa``   — the explicit token-level DFA of a regular constraint.
"""
