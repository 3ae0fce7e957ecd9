"""The token vocabulary: exact bytes per token id, and the byte trie of every token.

* ``vocabulary`` — ``TokenVocabulary`` (immutable, fingerprinted) and its loaders;
* ``gguf``       — a GGUF file's tokenizer from its own metadata, its ``tokenizer.json`` cached on disk;
* ``gguf_reader`` — the GGUF key-value section, parsed without reading tensors;
* ``llama_vocab`` — llama.cpp's loader rules: token attributes, special ids, exact token bytes;
* ``llama_pre``  — llama.cpp's BPE pre-tokenizer regexes by ``tokenizer.ggml.pre`` name;
* ``gguf_encode`` — tokenizing as llama.cpp does (special-token cuts, BPE, SentencePiece, RWKV);
* ``trie``       — ``TokenTrie``, the breadth-first byte trie the mask engine walks;
* ``spelling``   — ``Spelling``: a byte string in the fewest vocabulary tokens, or in exactly ``n``.
"""
