"""The seam between diffusion decoders and masked-diffusion language models: ``MaskedDiffusionLM``.

A masked-diffusion LM (MDLM, LLaDA, Dream) does not predict the next token: it sees a whole
*canvas* — the prompt followed by the answer's positions, some of them still the mask token — with
bidirectional attention, and predicts a token for every position at once. A decoder unmasks some
positions, calls the model again, and so on until no mask is left. ``MaskedDiffusionLM`` is the
seam such a decoder needs, three members wide::

    logits_width: int                                          # columns of every logits row
    mask_token_id: int                                         # the id of a still-masked position
    canvas_logits(canvases: Sequence[Sequence[int]]) -> Tensor # [batch, length, logits_width]

``canvas_logits`` returns float logits for *every* position of each canvas (positions that hold a
real token too: decoders that remask or score may read them; most read only the masked ones).
All canvases of one call have the same length; pad them yourself (e.g. with EOS at the end, which
is what the models trained by ``engine.tiny_diffusion`` learn to put there) or make one call per
length. The call is functional: the answer depends only on the canvases passed. The result is a
fresh tensor the caller may modify in place (masking).

Implementations here:

* ``HFMaskedDiffusionLM`` — a transformers model with bidirectional attention that returns
  per-position logits: ``AutoModelForMaskedLM`` models (BERT, RoBERTa, ModernBERT, the tiny
  models of ``engine.tiny_diffusion``) and LLaDA/Dream-style checkpoints loaded with
  ``trust_remote_code=True``;
* ``ScriptedDiffusionLM`` — logits from a function of the canvas, counting its calls; the mock
  that lets diffusion decoders be tested without weights.

Errors: ``canvas_logits`` raises ``ValueError`` for an empty batch, an empty canvas, canvases of
different lengths or a token id outside ``[0, logits_width)``; a model whose mask id cannot be
found raises ``MissingMaskTokenError`` (a ``ValueError``) saying how to pass it. Adapters are not
thread-safe: use one per thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from engine.lm import _output_width, check_token_rows, placed_model, resolve_device, resolve_dtype

__all__ = [
    "MaskedDiffusionLM",
    "HFMaskedDiffusionLM",
    "ScriptedDiffusionLM",
    "MissingMaskTokenError",
    "check_canvases",
    "is_masked_diffusion_config",
    "is_masked_diffusion_checkpoint",
    "is_masked_diffusion_model",
]

#: ``model_type`` of masked-diffusion checkpoints whose classes are not ``*ForMaskedLM`` (custom code)
DIFFUSION_MODEL_TYPES = frozenset({"llada", "dream"})


def is_masked_diffusion_config(config: Any) -> bool:
    """Whether a transformers config (object or ``config.json`` dict) describes a masked-diffusion
    model: an ``*ForMaskedLM`` architecture, or a LLaDA/Dream ``model_type``. Loaders use it to
    pick ``HFMaskedDiffusionLM`` over a causal adapter, so one ``--model`` flag serves both kinds."""
    get = config.get if isinstance(config, dict) else (lambda name, default=None: getattr(config, name, default))
    architectures = get("architectures", None) or []
    model_type = str(get("model_type", "") or "").lower()
    return any(str(a).endswith("ForMaskedLM") for a in architectures) or model_type in DIFFUSION_MODEL_TYPES


def is_masked_diffusion_model(model: Any) -> bool:
    """``is_masked_diffusion_config`` of a loaded transformers model, or its class an
    ``*ForMaskedLM`` (a model built from a config has no ``architectures`` recorded yet)."""
    return is_masked_diffusion_config(getattr(model, "config", None) or {}) or \
        type(model).__name__.endswith("ForMaskedLM")


def is_masked_diffusion_checkpoint(source: str | os.PathLike[str], *, local_files_only: bool = False) -> bool:
    """``is_masked_diffusion_config`` of the ``config.json`` in a model folder or hub repository
    (False when there is none to read: the caller's causal loader then reports what is missing)."""
    import json
    from pathlib import Path

    path = Path(source).expanduser()
    if path.is_dir():
        config_file: Any = path / "config.json"
    else:
        try:
            from transformers.utils import cached_file

            config_file = cached_file(str(source), "config.json", local_files_only=local_files_only,
                                      _raise_exceptions_for_missing_entries=False)
        except (OSError, ValueError):
            return False
    if config_file is None or not Path(config_file).is_file():
        return False
    try:
        config = json.loads(Path(config_file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and is_masked_diffusion_config(config)


@runtime_checkable
class MaskedDiffusionLM(Protocol):
    """Per-position logits for a batch of partly masked canvases. See the module docstring."""

    @property
    def logits_width(self) -> int:
        """Number of logits per position (may exceed the tokenizer's vocabulary: padded output layers)."""
        ...

    @property
    def mask_token_id(self) -> int:
        """The token id of a masked position (inside ``[0, logits_width)``)."""
        ...

    def canvas_logits(self, canvases: Sequence[Sequence[int]]) -> torch.Tensor:
        """Float logits ``[len(canvases), length, logits_width]`` for every position of each canvas.

        Canvases are token ids (masked positions hold ``mask_token_id``), all of one non-zero
        length. The result is a fresh tensor the caller may modify in place.
        """
        ...


class MissingMaskTokenError(ValueError):
    """A model's mask token id was neither passed nor found on its tokenizer or config."""


def check_canvases(canvases: Sequence[Sequence[int]], width: int) -> list[list[int]]:
    """Validate and copy ``canvases`` as lists of ints, all of one length; raises ``ValueError``
    saying what is wrong."""
    return check_token_rows(canvases, width, what="canvas", call="canvas_logits", same_length=True)


def _check_mask_id(mask_token_id: int, width: int) -> int:
    if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int):
        raise TypeError(f"mask_token_id must be an int, got {type(mask_token_id).__name__}")
    if not 0 <= mask_token_id < width:
        raise ValueError(f"mask_token_id {mask_token_id} is outside the logits width [0, {width})")
    return int(mask_token_id)


# --- a mock ---------------------------------------------------------------------------------

CanvasScript = Callable[[tuple[int, ...]], "torch.Tensor | Sequence[Sequence[float]]"]


class ScriptedDiffusionLM:
    """A ``MaskedDiffusionLM`` whose logits are scripted: for tests of diffusion decoders.

    ``script`` is a callable ``canvas -> logits``: ``canvas`` a tuple of ints, ``logits`` a
    ``[len(canvas), logits_width]`` tensor (or nested sequence of floats), one row per position.

    Counters, for assertions: ``calls`` (invocations of ``canvas_logits``), ``rows`` (canvases
    scored in total) and ``canvases`` (every canvas seen, in order).
    """

    def __init__(self, logits_width: int, mask_token_id: int, script: CanvasScript):
        if logits_width <= 0:
            raise ValueError(f"logits_width must be positive, got {logits_width}")
        if not callable(script):
            raise TypeError(f"script must be a callable canvas -> logits, got {type(script).__name__}")
        self._width = int(logits_width)
        self._mask = _check_mask_id(mask_token_id, self._width)
        self._script = script
        self.calls = 0
        self.rows = 0
        self.canvases: list[tuple[int, ...]] = []

    @property
    def logits_width(self) -> int:
        return self._width

    @property
    def mask_token_id(self) -> int:
        return self._mask

    def canvas_logits(self, canvases: Sequence[Sequence[int]]) -> torch.Tensor:
        rows = check_canvases(canvases, self._width)
        out = torch.empty((len(rows), len(rows[0]), self._width), dtype=torch.float32)
        for i, row in enumerate(rows):
            canvas = tuple(row)
            logits = torch.as_tensor(self._script(canvas), dtype=torch.float32)
            if tuple(logits.shape) != (len(canvas), self._width):
                raise ValueError(
                    f"scripted logits have shape {tuple(logits.shape)}, expected [{len(canvas)}, {self._width}]"
                )
            out[i] = logits
            self.canvases.append(canvas)
        self.calls += 1
        self.rows += len(rows)
        return out


# --- Hugging Face models --------------------------------------------------------------------


class HFMaskedDiffusionLM:
    """A transformers model with bidirectional attention and per-position logits as a ``MaskedDiffusionLM``.

    Works with

    * ``AutoModelForMaskedLM`` models — BERT, RoBERTa, ModernBERT, … (built from a config or
      loaded), among them the tiny masked-diffusion models ``engine.tiny_diffusion`` trains;
    * LLaDA- and Dream-style checkpoints, whose modelling code ships with the weights and is
      loaded with ``trust_remote_code=True`` (``from_pretrained`` does). Dream is adapted from an
      autoregressive model and its logits at position ``i`` predict position ``i + 1``; the
      adapter shifts them back (as Dream's own sampler does) when ``shift_logits`` is true, which
      is the default for configs whose ``model_type`` is ``"Dream"``. Such checkpoints are billions
      of parameters and cannot be tested here without their weights: only the code paths shared
      with the masked-LM models are.

    The mask id is ``mask_token_id`` when given, else ``tokenizer.mask_token_id``, else
    ``model.config.mask_token_id`` (LLaDA's and Dream's configs carry it), else
    ``MissingMaskTokenError``. ``logits_width`` is the width of the output layer, which may exceed
    the tokenizer's vocabulary (padded embeddings, an appended mask token): decoders mask the
    columns no real token has, and the mask id's own column.

    The model is put in eval mode; ``device``/``dtype`` move it in place (``nn.Module.to``).
    ``canvas_logits`` runs one forward pass over the batch without an attention mask (canvases
    have one length) and returns float32 logits on the model's device. Counters: ``forward_calls``
    and ``tokens_fed``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        mask_token_id: int | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        shift_logits: bool | None = None,
    ):
        model = self.model = placed_model(model, "HFMaskedDiffusionLM", "a transformers model", device, dtype)
        self.tokenizer = tokenizer
        self._width = _logits_width(model)
        self._mask = _check_mask_id(_resolve_mask_id(model, tokenizer, mask_token_id), self._width)
        if shift_logits is None:
            shift_logits = str(getattr(model.config, "model_type", "")).lower() == "dream"
        self.shift_logits = bool(shift_logits)
        self.forward_calls = 0
        self.tokens_fed = 0

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        mask_token_id: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        trust_remote_code: bool = True,
        local_files_only: bool = False,
        shift_logits: bool | None = None,
        **kwargs: Any,
    ) -> HFMaskedDiffusionLM:
        """Load a model (and its tokenizer, when the folder or hub id has one) from ``path``.

        Tries ``AutoModelForMaskedLM`` first (BERT-style models, ``engine.tiny_diffusion``'s); a
        config that class does not know (LLaDA, Dream: custom code registered under ``AutoModel``)
        falls back to ``AutoModel`` with ``trust_remote_code``. ``trust_remote_code=True`` runs
        Python shipped with the checkpoint: pass ``False`` for checkpoints you do not trust
        (masked-LM models still load). Extra ``kwargs`` go to both ``from_pretrained`` calls.
        """
        from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

        if device is not None:
            resolve_device(device)  # before loading: a bad device is the caller's error, found at once
        load_kwargs = dict(kwargs, local_files_only=local_files_only, trust_remote_code=trust_remote_code)
        if dtype is not None:
            load_kwargs["dtype"] = resolve_dtype(dtype)
        source = str(path)
        try:
            model = AutoModelForMaskedLM.from_pretrained(source, **load_kwargs)
        except ValueError as masked_error:  # "Unrecognized configuration class ... for AutoModelForMaskedLM"
            if not trust_remote_code:
                raise
            try:
                model = AutoModel.from_pretrained(source, **load_kwargs)
            except ValueError:
                raise masked_error from None
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                source, local_files_only=local_files_only, trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError, TypeError):  # no tokenizer files: the config's mask id may still do
            tokenizer = None
        return cls(model, tokenizer, mask_token_id, device=device, shift_logits=shift_logits)

    @property
    def logits_width(self) -> int:
        return self._width

    @property
    def mask_token_id(self) -> int:
        return self._mask

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def canvas_logits(self, canvases: Sequence[Sequence[int]]) -> torch.Tensor:
        rows = check_canvases(canvases, self._width)
        ids = torch.tensor(rows, dtype=torch.long, device=self.device)
        with torch.no_grad():
            out = self.model(input_ids=ids)
        logits = out.logits if hasattr(out, "logits") else out[0]
        self.forward_calls += 1
        self.tokens_fed += ids.numel()
        if tuple(logits.shape) != (*ids.shape, self._width):
            raise RuntimeError(
                f"{type(self.model).__name__} returned logits of shape {tuple(logits.shape)} for canvases of shape "
                f"{tuple(ids.shape)}; expected [batch, length, {self._width}]"
            )
        logits = logits.float()  # a fresh tensor per call: the caller may write into it
        if self.shift_logits:  # position i's logits were for i + 1: Dream's autoregressive heritage
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits


def _logits_width(model: Any) -> int:
    """The output layer's rows; for custom models without ``get_output_embeddings`` (LLaDA), the
    config's ``embedding_size`` (the padded table) before its ``vocab_size``."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "weight", None) is None:
        padded = getattr(model.config, "embedding_size", None)
        if isinstance(padded, int) and padded > 0:
            return padded
    return _output_width(model)


def _resolve_mask_id(model: Any, tokenizer: Any, mask_token_id: int | None) -> int:
    if mask_token_id is not None:
        return mask_token_id
    from_tokenizer = getattr(tokenizer, "mask_token_id", None) if tokenizer is not None else None
    if from_tokenizer is not None:
        return int(from_tokenizer)
    config = model.config
    for cfg in (config, config.get_text_config() if hasattr(config, "get_text_config") else None):
        value = getattr(cfg, "mask_token_id", None) if cfg is not None else None
        if value is not None:
            return int(value)
    where = "its tokenizer has no mask token" if tokenizer is not None else "no tokenizer was given"
    raise MissingMaskTokenError(
        f"cannot tell the mask token id of {type(model).__name__}: {where} and its config has no mask_token_id; "
        "pass mask_token_id=... (LLaDA-8B uses 126336, Dream-7B 151666), a tokenizer with a mask token, or set "
        "model.config.mask_token_id"
    )
