"""Fixtures for the server tests (see ``serve_helpers``): the session's tiny model and server,
an ``openai`` client and an ``httpx`` client for it.

Without the ``serve`` extra (fastapi, uvicorn, openai, httpx) the tests here are not collected
(install it with ``pip install -e '.[serve,test]'``); without ``../shared`` they skip.
"""

from __future__ import annotations

import importlib.util
import signal
from pathlib import Path

import pytest
from serve_helpers import API_KEY, start_server
from shared_data import vocab_file

MISSING = [m for m in ("fastapi", "uvicorn", "openai", "httpx") if importlib.util.find_spec(m) is None]
if MISSING:  # the server's optional dependencies are not installed: nothing here can run
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    """Where the tiny model lives; the first server started builds it there."""
    vocab_file("gpt-2")  # skips when the shared data is missing
    return tmp_path_factory.mktemp("tiny-serve-model")


@pytest.fixture(scope="session")
def server(tiny_model_path, tmp_path_factory):
    """The session's server (API key ``API_KEY``, model id ``MODEL_NAME``)."""
    log_path = tmp_path_factory.mktemp("serve-log") / "server.log"
    proc = start_server(tiny_model_path, log_path, "--max-batch", "64", "--max-tokens-limit", "1024",
                        "--compile-timeout", "20", "--shutdown-timeout", "10")
    yield proc
    code = proc.stop()
    # uvicorn re-raises the signal it shut down on, so a clean exit after SIGTERM is -SIGTERM
    assert code in (0, -signal.SIGTERM), f"the server exited with code {code} on SIGTERM:\n{proc.log()}"


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def http(server):
    import httpx

    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as c:
        yield c
