"""Where the shared test data lives. A plain module (not a conftest), so test files in any folder
can import it: ``from shared_data import shared_path``. Tests that need ``../shared`` skip with a
message naming the missing path, so a fresh clone without the data still runs the rest.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["REPO_ROOT", "SHARED_DIR", "VOCAB_NAMES", "shared_path", "vocab_file"]

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = Path(os.environ.get("CORRAL_SHARED_DIR", REPO_ROOT.parent / "shared"))


def shared_path(*parts: str) -> Path:
    """Path under the shared data folder; skips the calling test when it is absent."""
    path = SHARED_DIR.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data not found: {path} (set CORRAL_SHARED_DIR to its location)")
    return path


VOCAB_NAMES = ("llama-bpe", "qwen2", "gpt-2", "llama-spm", "phi-3", "deepseek-coder", "starcoder")


def vocab_file(name: str) -> Path:
    return shared_path("vocab", f"ggml-vocab-{name}.gguf")
