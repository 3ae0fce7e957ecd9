#!/usr/bin/env bash
# Integration tests against a serving engine's real classes, in a virtual environment of its own:
#
#     scripts/integration.sh sglang|vllm
#
# Each engine pins torch and transformers versions that differ from corral's, so each gets
# .venv-<engine> beside the clone: the engine first (scripts/integration/<engine>.txt, its pinned
# version), then corral on top of it (its dependencies already satisfied by the engine's), then the
# tests marked `integration` in tests/integrations/test_<engine>_*.py.
set -euo pipefail
cd "$(dirname "$0")/.."

engine="${1:-}"
case "$engine" in
  sglang|vllm) ;;
  *) echo "usage: scripts/integration.sh sglang|vllm" >&2; exit 2 ;;
esac

venv=".venv-$engine"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# shellcheck disable=SC1090
. "$venv/bin/activate"
# the engines pin numba versions of their own: keep this environment's compiled-function cache apart
# from the development one's (both would write into the same __pycache__ folders and wipe each other's)
export NUMBA_CACHE_DIR="$PWD/$venv/numba-cache"
pip install -q --upgrade pip
pip install -r "scripts/integration/$engine.txt"
pip install -e ".[test]"
shift
# one process: the tests share the engine's model and accelerator
python -m pytest -m integration -n 0 -p no:cacheprovider tests/integrations/ -k "$engine" "$@"
