"""The seam between decoders and models: ``LanguageModel`` and its adapters.

A decoder needs one thing from a model: the next-token logits for a batch of token prefixes.
``LanguageModel`` is that seam, two members wide (STYLE.md example 10)::

    logits_width: int                                        # columns of every logits row
    next_logits(prefixes: Sequence[Sequence[int]]) -> Tensor # [len(prefixes), logits_width]

The call is *functional*: the answer depends only on the prefixes passed, never on earlier
calls. Adapters may keep state to go faster — ``HFCausalLM`` keeps a KV cache and finds, for each
new prefix, the cached row sharing the longest prefix with it (so extending a prefix, fast-
forwarding several tokens, rolling back, dropping finished rows and reordering or duplicating
rows for SMC resampling are all handled by the same call) — but that state is an optimisation
callers never have to manage.

Tree verification (speculative decoding with token trees) asks for the logits after every node
of a token tree hanging off one context: ``tree_logits(lm, context, parents, tokens)`` answers
``[1 + len(tokens), logits_width]`` (row 0 after ``context``, row ``1 + j`` after ``context`` +
the root-to-node path of node ``j``; ``parents[j] < j``, ``-1`` for the context). A model with a
``tree_logits`` method answers itself (``HFCausalLM``: one forward pass, the tree's tokens
appended after the cached context with a tree attention mask and explicit positions); any other
``LanguageModel`` answers through ``next_logits`` over the paths.

Implementations here:

* ``HFCausalLM`` — any transformers ``AutoModelForCausalLM`` (KV cache reuse via
  ``past_key_values``, cropped with ``DynamicCache.crop`` on rollback);
* ``ScriptedLM`` — fixed logits per step or a function of the prefix, counting its calls; the
  mock that lets decoders be tested without weights.

Errors: ``next_logits`` raises ``ValueError`` for an empty batch, an empty prefix or a token id
outside ``[0, logits_width)``. Adapters are not thread-safe: use one per thread.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = [
    "OUTPUT_VOCAB_FILE",
    "HFCausalLM",
    "LanguageModel",
    "OutputSubset",
    "ScriptedLM",
    "chain_logits",
    "check_prefixes",
    "check_tree",
    "read_output_vocab",
    "resolve_device",
    "resolve_dtype",
    "tree_logits",
    "tree_paths",
]


@runtime_checkable
class LanguageModel(Protocol):
    """Next-token logits for a batch of prefixes. See the module docstring for the contract."""

    @property
    def logits_width(self) -> int:
        """Number of logits per row (may exceed the tokenizer's vocabulary: padded output layers)."""
        ...

    def next_logits(self, prefixes: Sequence[Sequence[int]]) -> torch.Tensor:
        """Float logits ``[len(prefixes), logits_width]`` for the token after each prefix.

        The result is a fresh tensor the caller may modify in place (masking). Prefixes must be
        non-empty (start them with BOS when the model has no natural first token).
        """
        ...


def check_prefixes(prefixes: Sequence[Sequence[int]], width: int) -> list[list[int]]:
    """Validate and copy ``prefixes`` as lists of ints; raises ``ValueError`` saying what is wrong."""
    return check_token_rows(prefixes, width, what="prefix", call="next_logits",
                            empty_hint="; start it with a BOS (or EOS) token id")


def check_token_rows(rows: Sequence[Sequence[int]], width: int, *, what: str, call: str, empty_hint: str = "",
                     same_length: bool = False) -> list[list[int]]:
    """Rows of token ids (prefixes, canvases) checked and copied as lists of ints: at least one
    row, none empty, every id in ``[0, width)``, and with ``same_length`` all of one length."""
    if isinstance(rows, torch.Tensor):
        rows = rows.tolist()
    out = [[int(t) for t in r] for r in rows]
    if not out:
        raise ValueError(f"{call} needs at least one {what}")
    for i, row in enumerate(out):
        if not row:
            raise ValueError(f"{what} {i} is empty{empty_hint}")
        if same_length and len(row) != len(out[0]):
            raise ValueError(
                f"{what} {i} has {len(row)} tokens, {what} 0 has {len(out[0])}: the rows of one call must have one "
                "length (pad them, e.g. with EOS, or make one call per length)"
            )
        bad = [t for t in row if not 0 <= t < width]
        if bad:
            raise ValueError(f"{what} {i} holds token ids {bad[:5]} outside [0, {width})")
    return out



def check_tree(parents: Sequence[int], tokens: Sequence[int], width: int) -> tuple[list[int], list[int]]:
    """A token tree's ``parents`` and ``tokens`` checked and copied: one parent per token, each an
    earlier node or ``-1`` (the context), every token id in ``[0, width)``."""
    parents, tokens = [int(x) for x in parents], [int(t) for t in tokens]
    if len(parents) != len(tokens):
        raise ValueError(f"a token tree needs one parent per token: {len(parents)} parents, {len(tokens)} tokens")
    for j, (parent, token) in enumerate(zip(parents, tokens)):
        if not -1 <= parent < j:
            raise ValueError(f"tree node {j} has parent {parent}: parents must be earlier nodes or -1 (the context)")
        if not 0 <= token < width:
            raise ValueError(f"tree node {j} holds token id {token} outside [0, {width})")
    return parents, tokens


def tree_paths(parents: Sequence[int], tokens: Sequence[int]) -> list[list[int]]:
    """The root-to-node token path of every node of a (checked) token tree."""
    paths: list[list[int]] = []
    for parent, token in zip(parents, tokens):
        paths.append((paths[parent] if parent >= 0 else []) + [token])
    return paths


def tree_logits(lm: LanguageModel, context: Sequence[int], parents: Sequence[int],
                tokens: Sequence[int]) -> torch.Tensor:
    """Logits after ``context`` and after every node of a token tree below it (see the module
    docstring): ``lm.tree_logits`` where the model has one, else ``next_logits`` over the paths."""
    own = getattr(lm, "tree_logits", None)
    if callable(own):
        return own(context, parents, tokens)
    ctx = check_prefixes([context], lm.logits_width)[0]
    parents, tokens = check_tree(parents, tokens, lm.logits_width)
    return lm.next_logits([ctx] + [ctx + path for path in tree_paths(parents, tokens)])

def chain_logits(lm: LanguageModel, context: Sequence[int], tokens: Sequence[int],
                 positions: Sequence[int] | None = None) -> torch.Tensor:
    """Logits after ``context + tokens[:i]`` for each ``i`` in ``positions`` (default ``0..n``):
    ``lm.chain_logits`` (one pass over one row) where the model has it, else ``next_logits`` over
    just those prefixes. Speculative verification of a chain draft."""
    wanted = list(range(len(tokens) + 1)) if positions is None else [int(i) for i in positions]
    own = getattr(lm, "chain_logits", None)
    if callable(own):
        rows = own(context, tokens)
        return rows if len(wanted) == rows.shape[0] else rows[torch.tensor(wanted, device=rows.device)]
    return lm.next_logits([list(context) + list(tokens[:i]) for i in wanted])


#: the file beside a model's weights that lists its reduced output vocabulary (``engine.distill``
#: writes it; ``engine.speculative.load_draft_lm`` reads it)
OUTPUT_VOCAB_FILE = "output_vocab.json"


def read_output_vocab(folder: str | os.PathLike[str]) -> list[int] | None:
    """The token ids of ``folder/output_vocab.json`` (``{"ids": [...], ...}``), or ``None`` when the
    folder has none. A malformed file is a ``ValueError`` naming it."""
    import json

    path = os.path.join(os.path.expanduser(str(folder)), OUTPUT_VOCAB_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            ids = json.load(f)["ids"]
        return [int(t) for t in ids]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not an output vocabulary ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class OutputSubset:
    """The rows of a model's output layer for a subset of token ids: full-width logits with
    ``-inf`` outside the subset, at the cost of the subset's rows only (a reduced-vocabulary head)."""

    ids: torch.Tensor  # [n] long, sorted, unique
    weight: torch.Tensor  # [n, hidden]
    bias: torch.Tensor | None
    width: int

    #: config fields of models that transform logits after the output layer, which a sliced head
    #: would skip: refused rather than silently changing the model's distribution
    _POST_HEAD = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")

    @classmethod
    def of(cls, model: Any, output_ids: Sequence[int], width: int) -> OutputSubset:
        ids = sorted({int(t) for t in output_ids})
        if not ids:
            raise ValueError("output_ids is empty: a model needs at least one token it can output")
        if ids[0] < 0 or ids[-1] >= width:
            raise ValueError(f"output_ids holds ids outside [0, {width})")
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        for name in cls._POST_HEAD:
            value = getattr(config, name, None)
            if value not in (None, 1, 1.0):
                raise ValueError(f"output_ids cannot restrict {type(model).__name__}: its config sets {name}={value}, "
                                 "a transform after the output layer that a reduced head would skip")
        head = model.get_output_embeddings()
        if head is None or getattr(head, "weight", None) is None or getattr(model, "base_model", model) is model:
            raise TypeError(f"output_ids needs a model with an output layer over a base model; "
                            f"{type(model).__name__} has none")
        index = torch.tensor(ids, dtype=torch.long, device=head.weight.device)
        bias = getattr(head, "bias", None)
        return cls(index, head.weight.detach().index_select(0, index).clone(),
                   None if bias is None else bias.detach().index_select(0, index).clone(), width)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        sub = torch.nn.functional.linear(hidden, self.weight, self.bias)
        out = torch.full((*sub.shape[:-1], self.width), float("-inf"), dtype=sub.dtype, device=sub.device)
        out[..., self.ids] = sub
        return out


# --- a mock ---------------------------------------------------------------------------------

Script = Callable[[tuple[int, ...]], "torch.Tensor | Mapping[int, float] | Sequence[float]"]


class ScriptedLM:
    """A ``LanguageModel`` whose logits are scripted: for tests of decoders and samplers.

    ``script`` is either

    * a callable ``prefix -> logits`` (``prefix`` a tuple of ints), or
    * a sequence of per-step logits: call ``k`` of ``next_logits`` answers ``script[k]`` for
      every row (the last entry repeats once the script runs out).

    Logits are given as a full row (tensor or sequence of ``logits_width`` floats) or as a sparse
    mapping ``{token: logit}``, every other token getting ``default``.

    Counters, for assertions: ``calls`` (invocations of ``next_logits``), ``rows`` (prefixes
    scored in total) and ``prefixes`` (every prefix seen, in order).
    """

    def __init__(self, logits_width: int, script: Script | Sequence[Any], *, default: float = 0.0):
        if logits_width <= 0:
            raise ValueError(f"logits_width must be positive, got {logits_width}")
        self._width = int(logits_width)
        self._script = script
        self._default = float(default)
        self.calls = 0
        self.rows = 0
        self.prefixes: list[tuple[int, ...]] = []

    @property
    def logits_width(self) -> int:
        return self._width

    def next_logits(self, prefixes: Sequence[Sequence[int]]) -> torch.Tensor:
        rows = check_prefixes(prefixes, self._width)
        out = torch.empty((len(rows), self._width), dtype=torch.float32)
        for i, row in enumerate(rows):
            prefix = tuple(row)
            if callable(self._script):
                spec = self._script(prefix)
            else:
                steps = self._script
                if not len(steps):
                    raise ValueError("ScriptedLM script is an empty sequence")
                spec = steps[min(self.calls, len(steps) - 1)]
            out[i] = self._row(spec)
            self.prefixes.append(prefix)
        self.calls += 1
        self.rows += len(rows)
        return out

    def _row(self, spec) -> torch.Tensor:
        if isinstance(spec, Mapping):
            row = torch.full((self._width,), self._default, dtype=torch.float32)
            for token, value in spec.items():
                row[int(token)] = float(value)
            return row
        row = torch.as_tensor(spec, dtype=torch.float32).reshape(-1)
        if row.shape[0] != self._width:
            raise ValueError(f"scripted logits have {row.shape[0]} entries, expected logits_width={self._width}")
        return row


# --- Hugging Face causal LMs ----------------------------------------------------------------


@dataclass
class _CacheRows:
    """What the KV cache holds: per row, the token in each physical column (``-1`` = a hole).

    Rows of one batch cache share their columns, so rows of different lengths (and rows that
    advanced by different numbers of tokens) leave holes, masked out by ``attention``.
    """

    columns: list[list[int]]
    tokens: list[list[int]]  # the real tokens of each row, in order (its logical prefix)
    attention: torch.Tensor  # [rows, columns] long, 1 = a real token
    last_logits: torch.Tensor  # [rows, width], logits after each row's last real token
    cache: Any = field(repr=False)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def placed_model(model: Any, owner: str, kind: str, device: str | torch.device | None,
                 dtype: torch.dtype | str | None) -> Any:
    """``model`` checked to be a transformers model, cast to ``dtype``, moved to ``device`` and in
    eval mode: what every adapter of a transformers model does first."""
    if not callable(getattr(model, "forward", None)) or not hasattr(model, "config"):
        raise TypeError(f"{owner} needs {kind} (a PreTrainedModel), got {type(model).__name__}")
    if dtype is not None:
        model = model.to(dtype=resolve_dtype(dtype))
    if device is not None:
        model = model.to(resolve_device(device))
    return model.eval()


class HFCausalLM:
    """A transformers causal LM (``GPT2LMHeadModel``, ``LlamaForCausalLM``, any
    ``AutoModelForCausalLM``) as a ``LanguageModel``, with KV-cache reuse across calls.

    Each ``next_logits`` call maps every new prefix to the cached row sharing its longest
    prefix (reordering or duplicating cache rows when needed), crops the cache where some row
    diverges (``DynamicCache.crop``), and feeds only the missing tokens — several per row in one
    forward pass when a decoder fast-forwards forced tokens. Rows of different lengths are
    aligned with holes in the attention mask and explicit ``position_ids``.

    ``use_cache=False`` recomputes every prefix from scratch (the reference the cache is tested
    against). The model is put in eval mode; ``device``/``dtype`` move it in place
    (``nn.Module.to``). ``logits_width`` is the width of the output layer, which may exceed the
    tokenizer's vocabulary (padded embeddings): decoders mask the padding columns.

    Only the logits a call returns are computed (``logits_to_keep`` where the model takes it: a
    prefill of a long prompt does not pay the output layer at every prompt position).

    ``output_ids`` restricts the output layer to those token ids (``OutputSubset``; the other
    logits are ``-inf``): a *reduced-vocabulary draft model* (FR-Spec, Zhao et al. 2025), whose
    draft step skips most of a large vocabulary's output matmul. The model's distribution is then
    the softmax over the subset, which is the ``q`` speculative verification uses, so decoding
    stays exact.
    """

    #: the fewest output-layer rows a pass computes when it needs more than one (see ``_forward``)
    min_scored_rows: int = 4

    def __init__(
        self,
        model: Any,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        use_cache: bool = True,
        pad_token_id: int = 0,
        output_ids: Sequence[int] | None = None,
    ):
        self.model = placed_model(model, "HFCausalLM", "a transformers causal LM", device, dtype)
        self.use_cache = use_cache
        self.pad_token_id = int(pad_token_id)
        self._width = _output_width(model)
        self._head = None if output_ids is None else OutputSubset.of(self.model, output_ids, self._width)
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._state: _CacheRows | None = None
        self._tree: _PendingTree | None = None
        self.forward_calls = 0
        self.tokens_fed = 0

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        local_files_only: bool = False,
        **kwargs: Any,
    ) -> HFCausalLM:
        """Load with ``AutoModelForCausalLM.from_pretrained(path, ...)`` (a folder or a hub id);
        ``output_ids=`` is passed to the constructor, everything else to ``from_pretrained``."""
        from transformers import AutoModelForCausalLM

        if device is not None:
            resolve_device(device)  # before loading: a bad device is the caller's error, found at once
        load_kwargs = dict(kwargs)
        output_ids = load_kwargs.pop("output_ids", None)
        if dtype is not None:
            load_kwargs["dtype"] = resolve_dtype(dtype)
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=local_files_only, **load_kwargs)
        return cls(model, device=device, output_ids=output_ids)

    @property
    def logits_width(self) -> int:
        return self._width

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def output_ids(self) -> torch.Tensor | None:
        """The ids of a reduced output vocabulary (sorted, on the CPU), or ``None`` for the full one."""
        return None if self._head is None else self._head.ids.cpu()

    @property
    def cached_tokens(self) -> int:
        """Physical columns held by the KV cache (holes included); 0 when empty."""
        return 0 if self._state is None else len(self._state.columns[0])

    def reset(self) -> None:
        """Drop the KV cache (the next call prefills from scratch)."""
        self._state = None
        self._tree = None

    def next_logits(self, prefixes: Sequence[Sequence[int]]) -> torch.Tensor:
        rows = check_prefixes(prefixes, self._width)
        with torch.no_grad():
            if not self.use_cache:
                return torch.stack([self._forward_plain(row) for row in rows])
            if self._state is None:
                return self._prefill(rows)
            return self._extend(rows)

    def tree_logits(self, context: Sequence[int], parents: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """Logits after ``context`` and after each node of a token tree below it (module docstring),
        in one forward pass: the uncached tail of ``context`` then the tree's tokens, fed after the
        cached context with a 4D additive mask (node ``j`` sees the context, its ancestors and
        itself) and ``position_ids`` ``len(context) + depth``. The tree stays in the cache as
        holes; the next call that extends ``context`` along one of its paths turns that path's
        columns into real ones (verification keeps the accepted path without feeding it again).
        A call whose tree extends the last call's tree (same context, its nodes first) feeds only
        the new nodes: a tree grown level by level (a draft model's) costs one node per node."""
        ctx = check_prefixes([context], self._width)[0]
        parents, tokens = check_tree(parents, tokens, self._width)
        if not tokens:
            return self.next_logits([ctx])
        if not self.use_cache:
            return self.next_logits([ctx] + [ctx + path for path in tree_paths(parents, tokens)])
        with torch.no_grad():
            grown = self._grown(ctx, parents, tokens)
            if grown:  # the last tree plus new nodes below it: feed only those
                return self._feed_tree(self._state, ctx, len(ctx), parents, tokens, grown)
            retained = self._align([ctx]) if self._state is not None else None
            if retained is not None:
                self._compact()
            if retained is None or self._state is None:
                return self._feed_tree(self._empty(1), ctx, 0, parents, tokens)
            return self._feed_tree(self._state, ctx, retained[0], parents, tokens)

    def chain_logits(self, context: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """Logits after ``context + tokens[:i]`` for ``i = 0..len(tokens)`` (``[1 + n, width]``) from
        one forward pass of one row: the uncached tail of ``context`` and ``tokens`` fed causally
        after the cached prefix. The tokens stay in the cache as real tokens; the next call that
        diverges from them crops them (a rejected speculative draft costs no extra pass).

        A pass feeds at least ``min_scored_rows`` positions, re-feeding cached context positions to
        get there, so that ``_forward`` can score that many rows: a target pass verifying 1, 2 and
        3 drafts took 14.6, 20.8 and 10.2 ms before, about 12 ms each after."""
        ctx = check_prefixes([context], self._width)[0]
        toks = check_token_rows([tokens], self._width, what="chain", call="chain_logits")[0] if len(tokens) else []
        if not toks:
            return self.next_logits([ctx])
        if not self.use_cache:
            return self.next_logits([ctx + toks[:i] for i in range(len(toks) + 1)])
        with torch.no_grad():
            short = self.min_scored_rows - len(toks) - 1  # context positions to re-feed, at most
            aligned = ctx[: len(ctx) - short] if 0 < short < len(ctx) else ctx
            retained = self._align([aligned]) if self._state is not None else None  # None: cache dropped
            state, r = (self._empty(1), 0) if retained is None else (self._state, retained[0])
            tail = ctx[r:]
            first = None if tail else state.last_logits[:1].clone()  # ctx cached whole: its logits are cached
            rows = self._feed([tail + toks], [r], keep=len(toks) + (1 if tail else 0))[0]
            return rows if first is None else torch.cat([first.to(rows.device), rows])

    # --- internals -------------------------------------------------------------------------

    def _forward(self, keep: int, **inputs: Any) -> torch.Tensor:
        """The model's logits ``[rows, positions, width]`` at the last ``keep`` positions of a
        forward pass over ``inputs`` (``keep=0``: all), only those computed where the model allows.

        Asked for 2 or 3 positions, it scores up to ``min_scored_rows`` (as many as the pass has)
        and drops the extra rows: on CPU BLAS (MKL here) a 2- or 3-row product through a large
        output layer takes longer than a 4-row one (50,257 wide: 8.9 and 11.2 ms against 5.7 ms),
        so a short speculative draft would cost more to verify than a longer one."""
        scored = keep
        if 1 < keep < self.min_scored_rows:
            scored = min(self.min_scored_rows, int(inputs["input_ids"].shape[1]))
        if self._head is not None:
            hidden = self.model.base_model(**inputs).last_hidden_state
            logits = self._head(hidden[:, -scored:] if scored else hidden)
        elif self._keeps_logits:
            logits = self.model(**inputs, logits_to_keep=scored).logits
        else:  # pragma: no cover - models without logits_to_keep
            logits = self.model(**inputs).logits
        return logits[:, -keep:] if keep else logits

    def _forward_plain(self, row: list[int]) -> torch.Tensor:
        ids = torch.tensor([row], dtype=torch.long, device=self.device)
        self.forward_calls += 1
        self.tokens_fed += len(row)
        return self._forward(1, input_ids=ids, use_cache=False)[0, -1].float().clone()

    def _new_cache(self) -> Any:
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.model.config)
        except TypeError:  # pragma: no cover - transformers < 4.56 takes no config
            return DynamicCache()

    def _empty(self, n: int) -> _CacheRows:
        self._state = _CacheRows(
            columns=[[] for _ in range(n)],
            tokens=[[] for _ in range(n)],
            attention=torch.zeros((n, 0), dtype=torch.long),
            last_logits=torch.zeros((n, self._width), dtype=torch.float32, device=self.device),
            cache=self._new_cache(),
        )
        self._tree = None
        return self._state

    def _prefill(self, rows: list[list[int]]) -> torch.Tensor:
        self._empty(len(rows))
        return self._feed([list(r) for r in rows], [0] * len(rows))

    def _extend(self, rows: list[list[int]]) -> torch.Tensor:
        retained = self._align(rows)
        if retained is None:
            return self._prefill(rows)
        return self._feed([row[r:] for row, r in zip(rows, retained)], retained)

    def _align(self, rows: list[list[int]]) -> list[int] | None:
        """Make cache row ``i`` hold the longest usable prefix of ``rows[i]`` (reordering,
        duplicating and cropping rows); the real tokens each keeps, or ``None`` (cache dropped)
        when nothing is reusable. A row equal to its cached prefix keeps it all (its logits are
        cached); otherwise at least one token is left to feed, whose logits the caller needs."""
        state = self._state
        assert state is not None
        self._promote(rows)
        # 1. each new row takes the cached row sharing its longest prefix (itself on ties)
        sources, matched = [], []
        for i, row in enumerate(rows):
            own = state.tokens[i] if i < len(state.tokens) else None
            if own is not None and row[: len(own)] == own:  # the common case: row i grew
                sources.append(i)
                matched.append(len(own))
                continue
            best, best_len = -1, -1
            order = ([i] if own is not None else []) + [j for j in range(len(state.tokens)) if j != i]
            for j in order:
                n = _common_prefix(row, state.tokens[j])
                if n > best_len:
                    best, best_len = j, n
                if best_len == len(row):
                    break
            sources.append(best)
            matched.append(best_len)
        if all(m == 0 for m in matched):
            self._state = None
            return None
        if sources != list(range(len(state.tokens))):
            index = torch.tensor(sources, dtype=torch.long)
            state.cache.reorder_cache(index.to(self.device))
            state.columns = [list(state.columns[s]) for s in sources]
            state.tokens = [list(state.tokens[s]) for s in sources]
            state.attention = state.attention[index]
            state.last_logits = state.last_logits[index.to(state.last_logits.device)]
        # 2. how many real tokens of each row stay valid, and the column to crop the cache at
        width = len(state.columns[0])
        crop_at = width
        keep = []
        for i, row in enumerate(rows):
            cached = state.tokens[i]
            m = matched[i]
            exact = m == len(row) == len(cached)
            k = len(cached) if exact else min(m, len(row) - 1)  # re-feed one token to get its logits
            keep.append(k)
            if k < len(cached):
                crop_at = min(crop_at, _column_after(state.columns[i], k))
        if crop_at == 0:
            self._state = None
            return None
        if crop_at < width:
            state.cache.crop(-(width - crop_at))  # negative: remove that many (old and new API)
            state.columns = [c[:crop_at] for c in state.columns]
            state.attention = state.attention[:, :crop_at]
            state.tokens = [[t for t in c if t >= 0] for c in state.columns]
        return [len(t) for t in state.tokens]

    def _feed(self, new: list[list[int]], retained: list[int], keep: int = 0) -> torch.Tensor:
        """Append ``new[i]`` to row ``i`` (which holds ``retained[i]`` real tokens) in one forward pass;
        the logits after every row's last token, or with ``keep`` the logits ``[rows, keep, width]``
        at the last ``keep`` positions of the pass (every row must then be fed)."""
        state = self._state
        assert state is not None
        chunk = max(map(len, new))
        if chunk:
            ids, att, pos = [], [], []
            for toks, r in zip(new, retained):
                holes = chunk - len(toks)
                ids.append([self.pad_token_id] * holes + toks)
                att.append([0] * holes + [1] * len(toks))
                pos.append([max(r - 1, 0)] * holes + list(range(r, r + len(toks))))
            chunk_att = torch.tensor(att, dtype=torch.long)
            attention = torch.cat([state.attention, chunk_att], dim=1)
            device = self.device
            logits = self._forward(
                max(keep, 1),
                input_ids=torch.tensor(ids, dtype=torch.long, device=device),
                attention_mask=attention.to(device),
                position_ids=torch.tensor(pos, dtype=torch.long, device=device),
                past_key_values=state.cache,
                use_cache=True,
            ).float()
            self.forward_calls += 1
            self.tokens_fed += sum(map(len, new))
            last = logits[:, -1]
            fed = torch.tensor([bool(t) for t in new], device=last.device)
            state.last_logits = torch.where(fed[:, None], last, state.last_logits.to(last.device))
            state.attention = attention
            for i, toks in enumerate(new):
                state.columns[i].extend([-1] * (chunk - len(toks)) + toks)
                state.tokens[i].extend(toks)
            if keep:
                return logits.clone()
        return state.last_logits.clone()


    def _grown(self, ctx: list[int], parents: list[int], tokens: list[int]) -> int:
        """How many leading nodes of this tree the last ``tree_logits`` call left in the cache
        below the same context (0: none, or nothing new to feed)."""
        tree, state = self._tree, self._state
        if tree is None or state is None or len(state.tokens) != 1 or state.tokens[0] != ctx:
            return 0
        done = len(tree.tokens)
        if len(tokens) <= done or tokens[:done] != tree.tokens or parents[:done] != tree.parents:
            return 0
        return done

    def _feed_tree(self, state: _CacheRows, ctx: list[int], r: int, parents: list[int],
                   tokens: list[int], done: int = 0) -> torch.Tensor:
        """One forward pass over ``ctx[r:]`` (causal) and tree nodes ``done..`` (tree-masked; the
        nodes before ``done`` are the cached last tree, which then has no context tail)."""
        tail, n = ctx[r:], len(tokens)
        m, past = len(tail), len(state.columns[0])
        start = self._tree.start if done else past + m  # the column of node 0; node j sits at start + j
        depth: list[int] = []
        for parent in parents:
            depth.append(depth[parent] + 1 if parent >= 0 else 0)
        new = n - done
        sees = torch.zeros((m + new, past + m + new), dtype=torch.bool)
        sees[:, :past] = state.attention[0].bool()
        if m:
            sees[:m, past:past + m] = torch.tril(torch.ones((m, m), dtype=torch.bool))
            sees[m:, past:past + m] = True
        for j in range(done, n):
            node = j
            while node >= 0:  # the node itself and its ancestors
                sees[m + j - done, start + node] = True
                node = parents[node]
        device = self.device
        dtype = next(self.model.parameters()).dtype
        mask = torch.zeros(sees.shape, dtype=dtype).masked_fill(~sees, torch.finfo(dtype).min)
        positions = list(range(r, r + m)) + [len(ctx) + d for d in depth[done:]]
        keep = new + (1 if m else 0)  # the last context position's logits and the new nodes'
        logits = self._forward(
            keep,
            input_ids=torch.tensor([tail + tokens[done:]], dtype=torch.long, device=device),
            attention_mask=mask[None, None].to(device),
            position_ids=torch.tensor([positions], dtype=torch.long, device=device),
            past_key_values=state.cache,
            use_cache=True,
        )[0].float()
        self.forward_calls += 1
        self.tokens_fed += m + new
        if m:
            state.last_logits = logits[:1].clone()
            logits = logits[1:]
        state.columns[0].extend(tail + [-1] * new)
        state.tokens[0].extend(tail)
        state.attention = torch.cat([state.attention, torch.tensor([[1] * m + [0] * new], dtype=torch.long)], dim=1)
        nodes = logits.clone()
        if done:
            nodes = torch.cat([self._tree.logits.to(nodes.device), nodes])
        self._tree = _PendingTree(start, parents, tokens, nodes)
        return torch.cat([state.last_logits[:1].to(nodes.device), nodes]).clone()

    def _promote(self, rows: list[list[int]]) -> None:
        """Turn the last tree's columns along the path some row extends the cached context with
        into real tokens (one cached row), then forget the tree."""
        tree, state = self._tree, self._state
        self._tree = None
        if tree is None or state is None or len(state.tokens) != 1:
            return
        base = state.tokens[0]
        best: list[int] = []
        for row in rows:
            if len(row) <= len(base) or row[:len(base)] != base:
                continue
            path, node = [], -1
            for token in row[len(base):]:
                node = next((j for j in tree.children(node) if tree.tokens[j] == token), -1)
                if node < 0:
                    break
                path.append(node)
            if len(path) > len(best):
                best = path
        for node in best:
            col = tree.start + node
            state.columns[0][col] = tree.tokens[node]
            state.attention[0, col] = 1
            state.tokens[0].append(tree.tokens[node])
        if best:
            state.last_logits = tree.logits[best[-1]:best[-1] + 1].to(state.last_logits.device)

    def _compact(self) -> None:
        """Drop the hole columns every row shares (tree nodes never accepted) once they
        outnumber the real ones: they cost attention in every later pass. Where the cache's
        layers are not plain tensors of keys and values, the cache is dropped instead."""
        state = self._state
        if state is None:
            return
        width = len(state.columns[0])
        keep = [c for c in range(width) if any(row[c] >= 0 for row in state.columns)]
        if width - len(keep) <= max(64, len(keep)):
            return
        layers = getattr(state.cache, "layers", None)
        if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
            self._state = None  # pragma: no cover - other cache kinds: prefill again
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        for layer in layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys = layer.keys.index_select(-2, index)
                layer.values = layer.values.index_select(-2, index)
        state.columns = [[row[c] for c in keep] for row in state.columns]
        state.attention = state.attention[:, keep]


@dataclass
class _PendingTree:
    """The last ``tree_logits`` call's nodes, cached as holes from column ``start`` on."""

    start: int
    parents: list[int]
    tokens: list[int]
    logits: torch.Tensor  # [nodes, width]

    def children(self, node: int) -> list[int]:
        return [j for j, p in enumerate(self.parents) if p == node]

def _column_after(columns: list[int], k: int) -> int:
    """The number of physical columns holding the first ``k`` real tokens of a row."""
    if k == 0:
        return 0
    seen = 0
    for col, token in enumerate(columns):
        if token >= 0:
            seen += 1
            if seen == k:
                return col + 1
    return len(columns)


def _output_width(model: Any) -> int:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    config = model.config
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text_config, "vocab_size", None)
    if not isinstance(size, int):
        raise TypeError(f"cannot tell the logits width of {type(model).__name__}: no output layer nor vocab_size")
    return size


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A floating ``torch.dtype`` from a dtype or its name (``"bfloat16"``, ``"torch.float16"``)."""
    if isinstance(dtype, torch.dtype):
        value = dtype
    elif isinstance(dtype, str):
        value = getattr(torch, dtype.replace("torch.", ""), None)
        if not isinstance(value, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16' or 'float16'")  # noqa: TRY004
    else:
        raise TypeError(f"dtype must be a torch.dtype or its name, got {type(dtype).__name__}")
    if not value.is_floating_point:
        raise ValueError(f"dtype {dtype!r} is not a floating type; a model runs in e.g. float32 or bfloat16")
    return value


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device`` this machine has, else ``ValueError`` saying why.

    Checked before a model is loaded or moved, so ``"cuda"`` without CUDA (or a misspelt device)
    is an argument error, not an ``AssertionError`` from deep inside torch.
    """
    if isinstance(device, str):
        try:
            resolved = torch.device(device)
        except RuntimeError as exc:
            first = str(exc).splitlines()[0] if str(exc) else "not a device"
            raise ValueError(f"unknown device {device!r}: {first}") from None
    elif isinstance(device, torch.device):
        resolved = device
    else:
        raise TypeError(f"device must be a str (e.g. 'cpu', 'cuda:0') or a torch.device, got {type(device).__name__}")
    if resolved.type == "cpu":
        return resolved
    count = _device_count(resolved.type)
    if count == 0:
        raise ValueError(f"device {str(device)!r} is not available on this machine (torch finds no "
                         f"{resolved.type} device); run on 'cpu' instead")
    if resolved.index is not None and resolved.index >= count:
        raise ValueError(f"device {str(device)!r} is not available: this machine has {count} {resolved.type} device(s)")
    return resolved


def _device_count(kind: str) -> int:
    """How many devices of ``kind`` torch can use here (0 for kinds that hold no data, like ``meta``)."""
    if kind == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "mps":
        return int(torch.backends.mps.is_available())
    backend = getattr(torch, kind, None)
    available = getattr(backend, "is_available", None)
    if not callable(available) or not available():
        return 0
    counter = getattr(backend, "device_count", None)
    return int(counter()) if callable(counter) else 1
