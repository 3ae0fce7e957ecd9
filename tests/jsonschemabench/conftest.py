"""Fixtures of the runner tests: workers over the byte tokenizer, and matplotlib present or not.

Both plotting branches run in every environment: ``matplotlib_missing`` hides matplotlib from
the import system, and ``matplotlib_present`` uses the real one when installed (the ``bench``
extra) or else a stand-in pyplot whose figures write a PNG signature.
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest.mock import MagicMock

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # spawned workers import the fakes from this folder by module name
    sys.path.insert(0, str(HERE))

from fake_engines import byte_tokenizer, spec  # noqa: E402  (needs the path above)

from jsonschemabench.maskbench import WorkerConfig  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def byte_workers() -> WorkerConfig:
    """Workers that load the byte tokenizer and the fake engines."""
    return WorkerConfig(tokenizer_loader=spec(byte_tokenizer))


def _stand_in_pyplot() -> MagicMock:
    """Just the pyplot calls the runners make; a figure's ``savefig`` writes a PNG signature."""
    def subplots(rows: int = 1, cols: int = 1, *, squeeze: bool = True, **_: object):
        figure = MagicMock(name="figure")
        figure.savefig.side_effect = lambda path, **_: Path(path).write_bytes(PNG_SIGNATURE)
        axes = [[MagicMock(name="axes") for _ in range(cols)] for _ in range(rows)]
        if not squeeze:
            return figure, axes
        flat = [ax for row in axes for ax in row]  # squeezed as pyplot does: one axes, or a flat list
        return figure, flat[0] if len(flat) == 1 else (flat if rows == 1 or cols == 1 else axes)

    return MagicMock(name="pyplot", subplots=subplots)


@pytest.fixture
def matplotlib_present(monkeypatch: pytest.MonkeyPatch) -> bool:
    """matplotlib importable; True when it is the real one, False for the stand-in."""
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        pyplot = _stand_in_pyplot()
        monkeypatch.setitem(sys.modules, "matplotlib", MagicMock(name="matplotlib", pyplot=pyplot))
        monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
        return False


@pytest.fixture
def matplotlib_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import matplotlib`` fails, as without the ``bench`` extra (installed or not)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
