"""The compile cache: memory bounds, single-flight, the disk layer and ``shared_compiler``.

A grammar read back from disk must be the same constraint: its matcher fills the same masks as a
fresh compile at every step of a valid text. Files that are damaged, partial, another
constraint's or carry globals outside the allow-list are ignored and recompiled, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import pickle
import threading
import zlib

import pytest

from grammars import (
    Compiler,
    GrammarError,
    Limits,
    allocate_token_bitmask,
    shared_compiler,
)

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b", 3, None]}},
        "when": {"type": "string", "format": "date"},
    },
    "required": ["name", "age"],
}
INSTANCE = '{"name":"Ann é","age":42,"tags":["a",3,null],"when":"2024-02-29"}'
REGEX = r"(ab|a[0-9]{2,4})+x?"
REGEX_TEXT = "ab a12ab a9999x".replace(" ", "")
GBNF = 'root ::= item ("," item)*\nitem ::= [a-z]+ | "(" root ")"'
GBNF_TEXT = "ab,(cd,(e)),f"

CASES = [
    ("json_schema", SCHEMA, INSTANCE),
    ("regex", REGEX, REGEX_TEXT),
    ("gbnf", GBNF, GBNF_TEXT),
    ("lark", 'start: "[" [NUM ("," NUM)*] "]"\nNUM: /-?[0-9]+/', "[1,-23,456]"),
]


def compile_case(compiler: Compiler, kind: str, source):
    if kind == "json_schema":
        return compiler.compile_json_schema(source)
    return getattr(compiler, f"compile_{kind}")(source)


def byte_ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))  # byte_vocab: ids 0..255 are the single bytes


def masks_along(grammar, vocab, token_ids: list[int]) -> list[bytes]:
    """Every mask from the start to the end of ``token_ids`` (which must be allowed)."""
    matcher = grammar.matcher()
    row = allocate_token_bitmask(1, vocab.logits_width)
    out = []
    for token in [*token_ids, None]:
        matcher.fill_mask(row, 0)
        out.append(row.tobytes())
        if token is not None:
            matcher.advance(token)
    assert matcher.is_accepting()
    return out


def entry_files(directory) -> list:
    return sorted(p for p in directory.iterdir() if p.suffix == ".cg")


# --- memory ---------------------------------------------------------------------------------------


def test_memory_hit_is_the_same_object(byte_vocab):
    compiler = Compiler(byte_vocab)
    first = compiler.compile_json_schema(SCHEMA)
    assert compiler.compile_json_schema(json.dumps(SCHEMA)) is first  # same canonical schema
    info = compiler.cache_info()
    assert info["builds"] == 1 and info["hits"] == 1


def test_entries_bound_evicts_least_recently_used(byte_vocab):
    compiler = Compiler(byte_vocab, cache_size=2)
    a = compiler.compile_regex("a+")
    b = compiler.compile_regex("b+")
    assert compiler.compile_regex("a+") is a  # a is now the most recent
    compiler.compile_regex("c+")  # evicts b, the least recently used grammar
    info = compiler.cache_info()
    assert info["entries"] == 2 and info["evictions"] == 1
    assert compiler.compile_regex("b+") is not b
    assert compiler.cache_info()["builds"] == 4


def test_bytes_bound(byte_vocab):
    probe = Compiler(byte_vocab)
    probe.compile_regex("[a-z]{3,9}")
    one = probe.cache_info()["bytes"]
    assert one > 0
    compiler = Compiler(byte_vocab, cache_bytes=one + one // 2)  # one grammar fits, two do not
    x = compiler.compile_regex("[a-z]{3,9}")
    assert compiler.cache_info()["bytes"] == one  # held under two keys, counted once
    compiler.compile_regex("[0-9]{3,9}")
    info = compiler.cache_info()
    assert info["bytes"] <= one + one // 2 and info["evictions"] >= 1
    assert compiler.compile_regex("[a-z]{3,9}") is not x
    tiny = Compiler(byte_vocab, cache_bytes=1)  # nothing fits: compiled, returned, not kept
    assert tiny.compile_regex("a") is not tiny.compile_regex("a")
    assert tiny.cache_info()["entries"] == 0 and tiny.cache_info()["bytes"] == 0


def test_bad_cache_arguments(byte_vocab, tmp_path):
    with pytest.raises(ValueError, match="cache_bytes"):
        Compiler(byte_vocab, cache_bytes=0)
    with pytest.raises(TypeError, match="cache_dir"):
        Compiler(byte_vocab, cache_dir=3)
    with pytest.raises(TypeError, match="cache_bytes"):
        Compiler(byte_vocab, cache_bytes=1.5)
    with pytest.raises(ValueError, match="cache_dir_bytes"):
        Compiler(byte_vocab, cache_dir=tmp_path, cache_dir_bytes=-1)


def test_threads_compiling_one_schema_share_one_build(byte_vocab):
    compiler = Compiler(byte_vocab)
    barrier = threading.Barrier(4)
    results, errors = [], []

    def work():
        try:
            barrier.wait()
            results.append(compiler.compile_json_schema(SCHEMA))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 4 and all(r is results[0] for r in results)
    assert compiler.cache_info()["builds"] == 1


def test_a_failed_build_is_not_shared(byte_vocab):
    compiler = Compiler(byte_vocab)
    for _ in range(2):  # raised each time, never cached
        with pytest.raises(GrammarError):
            compiler.compile_regex("a(")
    assert compiler.cache_info()["entries"] == 0


# --- disk -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,source,text", CASES, ids=[c[0] for c in CASES])
def test_disk_round_trip_gives_identical_masks(byte_vocab, tmp_path, kind, source, text):
    fresh = compile_case(Compiler(byte_vocab), kind, source)
    writer = Compiler(byte_vocab, cache_dir=tmp_path)
    compile_case(writer, kind, source)
    assert writer.cache_info()["disk_writes"] == 1 and len(entry_files(tmp_path)) == 1
    reader = Compiler(byte_vocab, cache_dir=tmp_path)
    loaded = compile_case(reader, kind, source)
    info = reader.cache_info()
    assert info["disk_hits"] == 1 and info["builds"] == 0 and info["disk_rejected"] == 0
    assert (loaded.n_terminals, loaded.n_productions) == (fresh.n_terminals, fresh.n_productions)
    assert masks_along(loaded, byte_vocab, byte_ids(text)) == masks_along(fresh, byte_vocab, byte_ids(text))
    assert loaded.completable([text[:3], text[-2:]]) == fresh.completable([text[:3], text[-2:]])
    # a second reader (a restarted process) loads an equal grammar: equal IR, equal key
    again = compile_case(Compiler(byte_vocab, cache_dir=tmp_path), kind, source)
    assert again.grammar == loaded.grammar and again.key == loaded.key


def test_disk_round_trip_of_a_grammar_ir(byte_vocab, tmp_path):
    from grammars import parse_gbnf

    writer = Compiler(byte_vocab, cache_dir=tmp_path)
    writer.compile_grammar(parse_gbnf(GBNF))
    reader = Compiler(byte_vocab, cache_dir=tmp_path)
    ir = parse_gbnf(GBNF)  # an equal IR built anew
    loaded = reader.compile_grammar(ir)
    assert reader.cache_info()["disk_hits"] == 1 and loaded.grammar is ir
    fresh = Compiler(byte_vocab).compile_gbnf(GBNF)
    assert masks_along(loaded, byte_vocab, byte_ids(GBNF_TEXT)) == masks_along(fresh, byte_vocab, byte_ids(GBNF_TEXT))


def test_disk_round_trip_with_a_real_vocabulary(llama3_vocab, tmp_path):
    writer = Compiler(llama3_vocab, cache_dir=tmp_path)
    fresh = writer.compile_json_schema(SCHEMA)
    reader = Compiler(llama3_vocab, cache_dir=tmp_path)
    loaded = reader.compile_json_schema(SCHEMA)
    assert reader.cache_info()["disk_hits"] == 1
    ids = llama3_vocab.encode(INSTANCE)
    assert masks_along(loaded, llama3_vocab, ids) == masks_along(fresh, llama3_vocab, ids)


def test_entries_are_keyed_by_options_and_limits(byte_vocab, tmp_path):
    Compiler(byte_vocab, cache_dir=tmp_path).compile_json_schema(SCHEMA)
    other = Compiler(byte_vocab, cache_dir=tmp_path)
    other.compile_json_schema(SCHEMA, whitespace="flexible")
    limited = Compiler(byte_vocab, cache_dir=tmp_path, limits=Limits(max_step_seconds=5.0))
    limited.compile_json_schema(SCHEMA)
    empty_ok = Compiler(byte_vocab, cache_dir=tmp_path, allow_empty_language=True)
    empty_ok.compile_json_schema(SCHEMA)
    for c in (other, limited, empty_ok):
        assert c.cache_info()["disk_hits"] == 0 and c.cache_info()["builds"] == 1
    assert len(entry_files(tmp_path)) == 4


def _rewrite(path, mutate) -> None:
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(mutate(data)))


def _flip_last(data: bytearray) -> bytearray:
    data[-1] ^= 0xFF
    return data


@pytest.mark.parametrize("damage", [
    pytest.param(_flip_last, id="flipped-byte"),
    pytest.param(lambda d: d[: len(d) // 2], id="truncated"),
    pytest.param(lambda d: d[:10], id="header-only"),
    pytest.param(lambda d: bytearray(b""), id="empty"),
    pytest.param(lambda d: bytearray(os.urandom(4096)), id="garbage"),
])
def test_damaged_file_is_ignored_and_recompiled(byte_vocab, tmp_path, damage):
    Compiler(byte_vocab, cache_dir=tmp_path).compile_json_schema(SCHEMA)
    (path,) = entry_files(tmp_path)
    _rewrite(path, damage)
    reader = Compiler(byte_vocab, cache_dir=tmp_path)
    grammar = reader.compile_json_schema(SCHEMA)
    info = reader.cache_info()
    assert info["disk_hits"] == 0 and info["builds"] == 1 and info["disk_writes"] == 1
    assert info["disk_rejected"] == 1
    fresh = Compiler(byte_vocab).compile_json_schema(SCHEMA)
    assert masks_along(grammar, byte_vocab, byte_ids(INSTANCE)) == masks_along(fresh, byte_vocab, byte_ids(INSTANCE))
    # the rewritten file is whole again
    assert Compiler(byte_vocab, cache_dir=tmp_path).compile_json_schema(SCHEMA).n_terminals == fresh.n_terminals
    assert Compiler(byte_vocab, cache_dir=tmp_path).cache_info()["disk_rejected"] == 0


def test_file_of_another_constraint_is_ignored(byte_vocab, tmp_path):
    writer = Compiler(byte_vocab, cache_dir=tmp_path)
    writer.compile_regex("a+")
    (a_file,) = entry_files(tmp_path)
    writer.compile_regex("b+")
    (b_file,) = [p for p in entry_files(tmp_path) if p != a_file]
    b_file.write_bytes(a_file.read_bytes())  # b's name, a's content (whole and checksummed)
    reader = Compiler(byte_vocab, cache_dir=tmp_path)
    grammar = reader.compile_regex("b+")
    info = reader.cache_info()
    assert info["disk_rejected"] == 1 and info["disk_hits"] == 0 and info["builds"] == 1
    assert grammar.matcher().allows(ord("b")) and not grammar.matcher().allows(ord("a"))


PROBE_CALLS: list = []


def probe(*args) -> None:
    PROBE_CALLS.append(args)


class Foreign:
    def __reduce__(self):
        return (probe, ("called",))


def test_file_naming_a_foreign_global_is_never_unpickled(byte_vocab, tmp_path):
    """A well-formed file (right key, right checksum) whose payload names a global outside the
    allow-list is rejected without calling it."""
    from grammars.compile import _HEADER

    Compiler(byte_vocab, cache_dir=tmp_path).compile_regex("a+")
    (path,) = entry_files(tmp_path)
    data = path.read_bytes()
    magic, fmt, key_len, _, _ = _HEADER.unpack_from(data)
    key = data[_HEADER.size:_HEADER.size + key_len]
    payload = zlib.compress(pickle.dumps(Foreign()))
    body = key + payload
    path.write_bytes(_HEADER.pack(magic, fmt, key_len, len(payload), hashlib.sha256(body).digest()) + body)
    reader = Compiler(byte_vocab, cache_dir=tmp_path)
    assert reader.compile_regex("a+").matcher().allows(ord("a"))
    assert reader.cache_info()["disk_rejected"] == 1 and not PROBE_CALLS


def test_unwritable_directory_is_not_an_error(byte_vocab, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    compiler = Compiler(byte_vocab, cache_dir=blocker / "cache")
    assert compiler.compile_regex("a+").matcher().allows(ord("a"))
    assert compiler.cache_info()["disk_errors"] >= 1  # the read and the write


def test_directory_is_pruned_to_its_bound(byte_vocab, tmp_path):
    compiler = Compiler(byte_vocab, cache_dir=tmp_path, cache_dir_bytes=1)
    for i in range(5):
        compiler.compile_regex(f"x{i}+")
    assert len(entry_files(tmp_path)) <= 1


def _compile_in_child(args) -> list[str]:
    """Run in a spawned process: compile every case with a compiler on the shared directory and
    return a digest of the masks along each valid text."""
    directory, vocab_pieces, eos = args
    from grammars import TokenVocabulary

    vocab = TokenVocabulary.from_bytes(vocab_pieces, eos_token_ids=[eos], special_token_ids=[eos])
    compiler = Compiler(vocab, cache_dir=directory)
    digests = []
    for kind, source, text in CASES:
        grammar = compile_case(compiler, kind, source)
        digests.append(hashlib.sha256(b"".join(masks_along(grammar, vocab, byte_ids(text)))).hexdigest())
    return digests


@pytest.mark.slow
def test_processes_sharing_a_directory(byte_vocab, tmp_path):
    pieces = list(byte_vocab.token_bytes)
    eos = min(byte_vocab.eos_token_ids)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = pool.map(_compile_in_child, [(str(tmp_path), pieces, eos)] * 4)
    expected = _compile_in_child((None, pieces, eos))  # no directory: plain compiles
    assert all(r == expected for r in results)
    assert len(entry_files(tmp_path)) == len(CASES)
    reader = Compiler(byte_vocab, cache_dir=tmp_path)
    for kind, source, _ in CASES:
        compile_case(reader, kind, source)
    assert reader.cache_info()["disk_hits"] == len(CASES) and reader.cache_info()["disk_rejected"] == 0
    assert not [p for p in tmp_path.iterdir() if p.suffix != ".cg"]  # no temporary file left behind


# --- the shared compiler --------------------------------------------------------------------------


def test_shared_compiler_is_one_per_vocabulary(byte_vocab):
    import dataclasses

    assert shared_compiler(byte_vocab) is shared_compiler(byte_vocab)
    twin = dataclasses.replace(byte_vocab, name="another object, same fingerprint")
    assert shared_compiler(twin) is shared_compiler(byte_vocab)
    wider = dataclasses.replace(byte_vocab, logits_width=byte_vocab.logits_width + 64)
    assert shared_compiler(wider) is not shared_compiler(byte_vocab)
    assert shared_compiler(wider).vocab.logits_width == wider.logits_width
    with pytest.raises(TypeError, match="vocab"):
        shared_compiler("gpt2")


@pytest.mark.slow  # imports the engine (torch, transformers)
def test_generate_without_a_compiler_reuses_the_shared_one(byte_vocab):
    pytest.importorskip("torch")
    from engine import ScriptedLM, generate

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
              "required": ["ok", "n"]}
    lm = ScriptedLM(byte_vocab.logits_width, lambda prefix: {})
    compiler = shared_compiler(byte_vocab)
    before = compiler.cache_info()
    first = generate("P", model=lm, tokenizer=byte_vocab, schema=schema, seed=0, max_tokens=40)
    after_first = compiler.cache_info()
    second = generate("Q", model=lm, tokenizer=byte_vocab, schema=schema, seed=1, max_tokens=40)
    after_second = compiler.cache_info()
    assert shared_compiler(byte_vocab) is compiler
    assert after_first["misses"] + after_first["hits"] > before["misses"] + before["hits"]  # it went through here
    assert after_second["builds"] == after_first["builds"]  # nothing compiled again
    assert after_second["hits"] > after_first["hits"]
    assert second.compile_s <= first.compile_s or second.compile_s < 0.05
    assert isinstance(first.text, str) and isinstance(second.text, str)
