"""Multi-region infilling with autoregressive models: fill every hole of ``x1 □ x2 □ … □ xn``.

Holes are written left to right, one token at a time, by the model. A token may come next only
if the text stays *completable*: some fill of this hole's rest and of the later holes makes the
whole text a string of the language. The cheapest exact route decides it:

1. the matcher's mask (the text so far must stay a prefix of the language) removes most tokens
   at once, as in ordinary constrained decoding;
2. the drawn token alone is then checked against the rest of the parts: the prefix's Earley sets
   are kept (``grammars.automata.holes.HoleChart``) and extended by the token's bytes, and the
   hole's ``grammars.automata.suffix.SuffixOracle`` — built when the hole opens, which is when
   the text after it is parsed (``HoleReport.setup_seconds``) — carries the prefix's stack
   through what it learnt of that text. A refused token is removed and the draw repeated, so the
   token is drawn exactly from the model's distribution renormalised over the admitted tokens,
   with one check per draw instead of one per vocabulary token.

A hole ends when the model ends it — EOS, and for a plain causal LM also the first token of the
next fixed text (the model starts writing what follows) — and the next fixed text can follow
there. When the model cannot close a hole within ``max_tokens_per_hole``, or ``max_resamples``
draws in a row are refused, the shortest fill that completes the text (``CompiledGrammar.complete``)
closes it, and the result says so. A check that hits a ``Limits`` bound counts as a refusal
(``HoleReport.undecided``): an unverified token is never accepted. The text returned is always
in the language: a completion exists whenever the parts are completable, and ``infill`` refuses
parts that are not.

Models: any ``LanguageModel`` (a transformers causal LM or path, as for ``generate``). With
fill-in-the-middle tokens (``fim=FIMTokens(...)``, or found in a transformers tokenizer), each
hole is prompted as ``<prefix> text-before <suffix> text-after <middle> fill-so-far`` and the
model sees the text after the hole; without, the model sees the text before it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from grammars import CompiledGrammar, Compiler, shared_compiler
from grammars.automata.holes import HoleChart, texts_as_bytes
from grammars.automata.suffix import SuffixOracle
from grammars.bitmask import allocate_token_bitmask
from grammars.errors import GrammarError, LimitExceeded
from grammars.vocab.vocabulary import TokenVocabulary
from samplers._numeric import sample_categorical
from samplers.base import SamplingParams, process_logits
from samplers.kernels import apply_token_bitmask_inplace

__all__ = ["FIMTokens", "HoleReport", "InfillResult", "infill"]

HoleEnd = Literal["model", "witness_budget", "witness_refused"]

#: refused draws of one step after which the prefix mask is filled (see ``_Infill._draw``)
MASK_AFTER_REFUSALS = 4


@dataclass(frozen=True)
class FIMTokens:
    """A fill-in-the-middle model's marker token ids (prefix-suffix-middle order)."""

    prefix: int
    suffix: int
    middle: int


@dataclass
class HoleReport:
    """How one hole was filled: the model's tokens, the checks they cost, and how it ended."""

    fill: str
    tokens: int = 0
    checks: int = 0
    refused: int = 0
    undecided: int = 0  # checks that hit a Limits bound: counted as refusals
    check_seconds: list[float] = field(default_factory=list, repr=False)
    setup_seconds: float = 0.0  # when the hole opened: the text after it parsed once, for every check
    end: HoleEnd = "model"
    witness: str = ""  # the part of ``fill`` the witness wrote (closing the hole)

    @property
    def closed_by_witness(self) -> bool:
        return self.end != "model"


@dataclass
class InfillResult:
    """The fills (one per hole), the joined text, and per-hole reports with check counts and times."""

    fills: list[str]
    text: str
    holes: list[HoleReport]
    model_calls: int = 0
    seconds: float = 0.0

    @property
    def checks(self) -> int:
        return sum(h.checks for h in self.holes)

    @property
    def check_seconds(self) -> list[float]:
        return [s for h in self.holes for s in h.check_seconds]

    @property
    def setup_seconds(self) -> list[float]:
        """Per hole: the time to parse the text after it when it opened (its checks reuse that)."""
        return [h.setup_seconds for h in self.holes]

    @property
    def closed_by_witness(self) -> bool:
        return any(h.closed_by_witness for h in self.holes)


class UncompletableError(GrammarError, ValueError):
    """The fixed parts cannot be completed into the language: no fill of the holes exists."""


def infill(
    parts: Sequence[str], *, model: Any, grammar: Any = None, schema: Any = None, regex: str | None = None,
    tokenizer: Any = None, compiler: Compiler | None = None, max_tokens_per_hole: int = 64,
    temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
    fim: FIMTokens | bool | None = None, prompt: str = "", max_resamples: int = 100,
    constrained: bool = True, sampler: str = "masked", steps: int | None = None,
) -> InfillResult:
    """Fill the holes between ``parts`` (``len(parts) - 1`` holes) with ``model``.

    Constraint, one of: ``grammar`` (GBNF text, a built-in name ``"cpp"``/``"json"``, a
    ``grammars.Grammar`` or a ``CompiledGrammar``), ``schema`` (JSON Schema) or ``regex``.
    ``constrained=False`` writes the holes without any check (the baseline benchmarks compare
    with). ``prompt``: text the model sees before ``parts[0]`` (an instruction), not part of the
    constrained text. ``sampler``: ``"masked"`` (the only one defined for holes: ASAp/AWRS/SMC
    reweight whole sequences of one left-to-right text). Raises ``UncompletableError`` when the
    parts admit no fill at all.

    With a masked-diffusion model (``engine.MaskedDiffusionLM``) the holes are written at once:
    the canvas is the parts' tokens with ``max_tokens_per_hole`` masked positions per hole, each
    to hold at least one byte, decoded by ``engine.diffusion`` (DINGO for regular constraints,
    completability checks otherwise) in ``steps`` model calls (default: one per masked position).
    """
    from engine.generate import (
        GenerationOptions,
        _compile_constraint,
        _is_diffusion_model,
        load_model,
        load_vocabulary,
    )

    if sampler != "masked":
        raise ValueError(f"infill supports sampler='masked' only, got {sampler!r}")
    if isinstance(max_tokens_per_hole, bool) or not isinstance(max_tokens_per_hole, int) or max_tokens_per_hole < 0:
        raise ValueError(f"max_tokens_per_hole must be an int >= 0, got {max_tokens_per_hole!r}")
    if isinstance(max_resamples, bool) or not isinstance(max_resamples, int) or max_resamples < 1:
        raise ValueError(f"max_resamples must be an int >= 1, got {max_resamples!r}")
    _, text_parts = texts_as_bytes(parts)
    if not text_parts:
        raise TypeError("infill parts must be str")
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    started = time.perf_counter()
    if _is_diffusion_model(model):
        lm, tok_source = model, tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        if tok_source is None:
            raise TypeError("pass tokenizer= (a TokenVocabulary, tokenizer or path) for this diffusion model")
    else:
        lm, tok_source = load_model(model, tokenizer)
    vocab = load_vocabulary(tok_source, lm, compiler)
    compiler = compiler if compiler is not None and compiler.vocab == vocab else shared_compiler(vocab)
    compiled = None
    if constrained:
        compiled = _compile_constraint(
            compiler, vocab, GenerationOptions(schema=schema, regex=regex, grammar=grammar, budget_closing=False))
        if compiled is None:
            raise ValueError("infill needs a constraint (grammar=, schema= or regex=) unless constrained=False")
    generator = torch.Generator().manual_seed(int(seed)) if seed is not None else None
    if _is_diffusion_model(lm):
        if compiled is not None and not compiled.completable(list(parts)):
            raise UncompletableError("the fixed parts cannot be completed into the language: no fill of the holes exists")
        result = _infill_diffusion(lm, vocab, compiled, list(parts), prompt, max_tokens_per_hole, temperature,
                                   generator, steps)
        result.seconds = time.perf_counter() - started
        if compiled is not None and not compiled.completable([result.text]):  # fail closed
            raise AssertionError("infill produced text outside the language; please report this with the inputs")
        return result
    fim_tokens = _fim_tokens(fim, tok_source)
    run = _Infill(lm, vocab, compiled, list(parts), params, generator, fim_tokens, prompt,
                  max_tokens_per_hole, max_resamples)
    if compiled is not None and not run.first_hole_completable():
        raise UncompletableError("the fixed parts cannot be completed into the language: no fill of the holes exists")
    result = run.fill_all()
    result.seconds = time.perf_counter() - started
    if compiled is not None and not run.accepts(result.text):  # fail closed
        raise AssertionError("infill produced text outside the language; please report this with the inputs")
    return result


def _infill_diffusion(lm, vocab: TokenVocabulary, compiled: CompiledGrammar | None, parts: list[str], prompt: str,
                      per_hole: int, temperature: float, generator, steps: int | None) -> InfillResult:
    """The holes as runs of masked positions in one canvas, filled by the diffusion decoder."""
    from engine.diffusion import diffusion_decode

    if per_hole < 1:
        raise ValueError("a diffusion model needs max_tokens_per_hole >= 1 (the masked positions of each hole)")
    mask = lm.mask_token_id
    canvas: list[int] = []
    regions: list[tuple[int, int]] = []
    for j, part in enumerate(parts):
        canvas += vocab.encode(part) if part else []
        if j < len(parts) - 1:
            regions.append((len(canvas), len(canvas) + per_hole))
            canvas += [mask] * per_hole
    prompt_ids = vocab.encode(prompt) if prompt else []
    out = diffusion_decode(lm, vocab, prompt_ids, compiled, canvas=canvas, steps=steps or per_hole * len(regions),
                           mode="none" if compiled is None else "auto", temperature=temperature, generator=generator)
    holes = []
    for a, b in regions:
        written = b"".join(out.position_bytes[a:b])
        opened = [i for i in range(a, b) if out.position_bytes[i] and canvas[i] == mask]
        report = HoleReport(fill=written.decode("utf-8", "replace"), tokens=len(opened))
        holes.append(report)
    if holes:
        holes[0].checks = out.checks
        holes[0].refused = out.refused
        holes[0].undecided = out.undecided
    if out.witness_bytes:
        for report in holes:
            report.end = "witness_refused"
    fills = [h.fill for h in holes]
    text = out.text.decode("utf-8", "replace")
    return InfillResult(fills, text, holes, out.model_calls)


def _fim_tokens(fim: FIMTokens | bool | None, tok_source: Any) -> FIMTokens | None:
    if isinstance(fim, FIMTokens):
        return fim
    if fim is False:
        return None
    found = find_fim_tokens(tok_source)
    if fim is True and found is None:
        raise ValueError("fim=True but the tokenizer has no fill-in-the-middle tokens; pass fim=FIMTokens(...)")
    return found


def find_fim_tokens(tokenizer: Any) -> FIMTokens | None:
    """The FIM markers of a transformers tokenizer (or a folder with one), by their usual texts."""
    from grammars.vocab.llama_vocab import FIM_TOKEN_TEXTS

    if isinstance(tokenizer, TokenVocabulary) or tokenizer is None:
        return None
    if isinstance(tokenizer, str):
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        except (OSError, ValueError):
            return None
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if get_vocab is None:
        return None
    texts = get_vocab()
    ids = {}
    for kind in ("pre", "suf", "mid"):
        hit = next((texts[t] for t in FIM_TOKEN_TEXTS[kind] if t in texts), None)
        if hit is None:
            return None
        ids[kind] = int(hit)
    return FIMTokens(ids["pre"], ids["suf"], ids["mid"])


class _Infill:
    """One infilling run: the holes in order, each written by the model under the checks."""

    def __init__(self, lm, vocab: TokenVocabulary, compiled: CompiledGrammar | None, parts: list[str],
                 params: SamplingParams, generator, fim: FIMTokens | None, prompt: str, max_tokens: int,
                 max_resamples: int):
        self.lm, self.vocab, self.compiled, self.parts = lm, vocab, compiled, parts
        self.params, self.generator, self.fim, self.prompt = params, generator, fim, prompt
        self.max_tokens, self.max_resamples = max_tokens, max_resamples
        self.eos = frozenset(vocab.eos_token_ids)
        self.width = lm.logits_width
        self.model_calls = 0
        self.chart = HoleChart(compiled.hole_grammar, compiled._runtime.limits) if compiled is not None else None
        self.matcher = compiled.matcher() if compiled is not None else None
        self.matched = bytearray()  # the bytes of the tokens the matcher read
        self._oracles: dict[int, tuple[SuffixOracle, SuffixOracle]] = {}
        self._first_setup = 0.0

    def first_hole_completable(self) -> bool:
        """Whether the parts admit any fill, asked of the first hole's oracle (so the text after
        the first hole is parsed once, here, and the hole's checks reuse it)."""
        if len(self.parts) == 1:
            return self.compiled.completable(self.parts)
        self.chart.extend(self.parts[0].encode("utf-8"))  # the matcher follows in fill_all
        t0 = time.perf_counter()
        try:
            return self._oracle(0)[0].completable(self.chart)
        finally:
            self._first_setup = time.perf_counter() - t0
            self.chart.truncate(0)

    def _oracle(self, j: int) -> tuple[SuffixOracle, SuffixOracle]:
        """Hole ``j``'s oracles: the hole may go on (its rest unbounded), or it ends here."""
        found = self._oracles.get(j)
        if found is None:
            rest = [p.encode("utf-8") for p in self.parts[j + 1:]]
            grammar, limits = self.compiled.hole_grammar, self.compiled._runtime.limits
            later = [(0, None)] * (len(rest) - 1)
            found = (SuffixOracle(grammar, rest, [(0, None), *later], limits),
                     SuffixOracle(grammar, rest, [(0, 0), *later], limits))
            self._oracles = {j: found}  # an earlier hole's are done with
        return found

    # --- the run -------------------------------------------------------------------------------

    def fill_all(self) -> InfillResult:
        fills: list[str] = []
        reports: list[HoleReport] = []
        self._append_fixed(self.parts[0])
        for j in range(len(self.parts) - 1):
            report = self._fill_hole(j, "".join(p + f for p, f in zip(self.parts, fills)) + self.parts[j])
            fills.append(report.fill)
            reports.append(report)
            self._append_fixed(self.parts[j + 1])
        text = self.parts[0] + "".join(f + p for f, p in zip(fills, self.parts[1:]))
        return InfillResult(fills, text, reports, self.model_calls)

    def _fill_hole(self, j: int, before: str) -> HoleReport:
        after = self.parts[j + 1:]
        rest = [p.encode("utf-8") for p in after]
        context = self._context(before, after)
        ends = set(self.eos)
        if self.fim is None and after[0]:
            first = self.vocab.encode(after[0])
            if first:
                ends.add(first[0])  # a causal LM ends the hole by starting the next fixed text
        report = HoleReport(fill="")
        oracles = None
        if self.compiled is not None:
            oracles = self._oracle(j)
            t0 = time.perf_counter()
            try:
                oracles[0].completable(self.chart)  # parses the text after the hole, once
            except LimitExceeded:
                report.undecided += 1
            report.setup_seconds = time.perf_counter() - t0 + (self._first_setup if j == 0 else 0.0)
        generated: list[int] = []
        while True:
            if len(generated) >= self.max_tokens:
                report.end = "witness_budget"
                break
            choice = self._draw(self._logits(context + generated), ends, oracles, report)
            if choice is None:
                report.end = "witness_refused"
                break
            if choice == "end":
                break
            generated.append(choice)
            report.tokens += 1
            self._advance(choice)
        written = self.vocab.decode(generated)
        if self.compiled is None:
            report.fill = written.decode("utf-8", "replace")
            return report
        if report.end != "model":
            witness = self.compiled.complete([before.encode("utf-8") + written, *rest])
            if witness is None:  # cannot happen: every admitted token kept the text completable
                raise AssertionError("a hole lost its completion; please report this with the inputs")
            report.witness = witness[0].decode("utf-8", "replace")
            written += witness[0]
            self._restart(before.encode("utf-8") + written, witness[0])
        report.fill = written.decode("utf-8")  # between whole characters of a text in the language
        return report

    # --- one step ------------------------------------------------------------------------------

    def _draw(self, logits: torch.Tensor, ends: set[int], oracles: tuple[SuffixOracle, SuffixOracle] | None,
              report: HoleReport) -> int | str | None:
        """The next token, ``"end"`` (the hole closes here) or None (every draw was refused)."""
        if self.compiled is None:
            token = sample_categorical(torch.softmax(process_logits(logits, self.params), dim=-1), self.generator)
            return "end" if token in ends else token
        masked = logits.detach().float().clone()
        # A drawn token is checked whole (chart and oracle), so the prefix mask only removes in
        # bulk tokens a check would refuse one by one: refused draws are removed and the draw
        # repeated, which draws exactly from the model renormalised over the admitted tokens,
        # mask or no mask. The mask can cost far more than a check (hundreds of ms on C++), so
        # it is filled only after ``MASK_AFTER_REFUSALS`` refusals — or first, when top-k/top-p
        # must see the admitted tokens alone.
        truncates = self.params.top_k > 0 or self.params.top_p < 1.0
        masked_yet = False
        if truncates:
            self._apply_mask(masked, ends)
            masked_yet = True
        can_end: bool | None = None
        refusals = 0
        for _ in range(self.max_resamples):
            if not masked_yet and refusals >= MASK_AFTER_REFUSALS:
                self._apply_mask(masked, ends)
                masked_yet = True
            if torch.isneginf(masked).all():
                return None
            token = sample_categorical(torch.softmax(process_logits(masked, self.params), dim=-1), self.generator)
            if token in ends:
                if can_end is None:
                    can_end = self._check(b"", oracles[1], report)
                if can_end:
                    return "end"
                if token in self.eos:
                    masked[token] = float("-inf")
                    report.refused += 1
                    refusals += 1
                    continue
            data = self.vocab.token_bytes[token] if token < len(self.vocab.token_bytes) else b""
            if data and self._check(data, oracles[0], report):  # special and padding ids match no text
                return token
            masked[token] = float("-inf")
            report.refused += 1
            refusals += 1
        return None

    def _apply_mask(self, masked: torch.Tensor, ends: set[int]) -> None:
        """The prefix mask on ``masked``, end tokens left as they are (ending is checked apart)."""
        words = allocate_token_bitmask(1, self.width)
        self.matcher.fill_mask(words, 0)
        end_logits = {t: float(masked[t]) for t in ends if t < self.width}
        apply_token_bitmask_inplace(masked, words[0])
        for t, value in end_logits.items():
            masked[t] = value

    def _check(self, data: bytes, oracle: SuffixOracle, report: HoleReport) -> bool:
        """Whether the text so far, then ``data``, then what ``oracle`` stands for (the hole's
        rest or its end, the fixed texts and later holes) can be completed; the chart is left
        as it was."""
        t0 = time.perf_counter()
        chart = self.chart
        mark = chart.length
        try:
            if data and not chart.extend(data):
                return False
            return oracle.completable(chart)
        except LimitExceeded:  # undecided within Limits: refused, never accepted unverified
            report.undecided += 1
            return False
        finally:
            chart.truncate(mark)
            report.checks += 1
            report.check_seconds.append(time.perf_counter() - t0)

    # --- state ---------------------------------------------------------------------------------

    def _append_fixed(self, text: str) -> None:
        if not text or self.compiled is None:
            return
        for token in self.vocab.encode(text):
            self._advance(token)

    def _advance(self, token: int) -> None:
        if self.compiled is None:
            return
        self.matcher.advance(token)
        self.matched += self.vocab.token_bytes[token]
        self.chart.extend(self.vocab.token_bytes[token])

    def _restart(self, text: bytes, witness: bytes) -> None:
        """After a witness: the chart reads its bytes; the matcher, which reads tokens, is rebuilt
        over ``text``'s tokens (the witness may finish a character the model's last token began)."""
        self.chart.extend(witness)
        self.matcher = self.compiled.matcher()
        self.matched = bytearray()
        for token in self.vocab.encode(text.decode("utf-8")):
            self.matcher.advance(token)
            self.matched += self.vocab.token_bytes[token]

    def accepts(self, text: str) -> bool:
        """Whether the matcher read exactly ``text`` and accepts it: the output checked by the
        matcher's parser, independently of the Earley chart that admitted its tokens."""
        return bytes(self.matched) == text.encode("utf-8") and self.matcher.is_accepting()

    def _context(self, before: str, after: list[str]) -> list[int]:
        vocab = self.vocab
        bos = [vocab.bos_token_id] if vocab.bos_token_id is not None else []
        if self.fim is not None:
            suffix = "".join(after)
            return bos + [self.fim.prefix] + vocab.encode(self.prompt + before) + [self.fim.suffix] + \
                vocab.encode(suffix) + [self.fim.middle]
        ids = bos + vocab.encode(self.prompt + before)
        return ids or [next(iter(self.eos))]

    def _logits(self, ids: list[int]) -> torch.Tensor:
        self.model_calls += 1
        return self.lm.next_logits([ids])[0]
