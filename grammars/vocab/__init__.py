"""The token vocabulary: exact bytes per token id, and the byte trie of every token.

* ``vocabulary`` — ``TokenVocabulary`` (immutable, fingerprinted) and its loaders;
* ``gguf``       — a GGUF file's tokenizer made to tokenize as llama.cpp does, cached on disk;
* ``trie``       — ``TokenTrie``, the breadth-first byte trie the mask engine walks.
"""
