"""Graceful shutdown through ``corral serve``: SIGTERM to the CLI reaches the server, requests in
flight (a plain one and a stream) finish with their full output, then the process exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from serve_helpers import API_KEY, MODEL_NAME, ServerProcess, free_port
from shared_data import REPO_ROOT

pytestmark = pytest.mark.slow


def test_sigterm_finishes_in_flight_requests_then_exits(server, tiny_model_path, tmp_path):
    port = free_port()
    log_path = tmp_path / "serve-cli.log"
    command = [sys.executable, "-m", "engine.cli", "serve", "--model", str(tiny_model_path), "--served-model-name",
               MODEL_NAME, "--port", str(port), "--api-key", API_KEY, "--threads", "1", "--log-level", "warning"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    proc = ServerProcess(process, f"http://127.0.0.1:{port}", log_path)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, proc.log()
            try:
                if httpx.get(proc.base_url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, proc.log()
            time.sleep(0.3)
        headers = {"Authorization": f"Bearer {API_KEY}"}
        outcomes: dict[str, object] = {}

        def plain():
            body = {"model": MODEL_NAME, "prompt": "Go:", "max_tokens": 400, "ignore_eos": True}
            outcomes["plain"] = httpx.post(proc.base_url + "/v1/completions", json=body, headers=headers, timeout=120)

        def stream():
            body = {"model": MODEL_NAME, "prompt": "Go:", "max_tokens": 400, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", proc.base_url + "/v1/completions", json=body, headers=headers,
                              timeout=120) as response:
                outcomes["stream"] = (response.status_code, [line for line in response.iter_lines() if line])

        threads = [threading.Thread(target=plain), threading.Thread(target=stream)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while httpx.get(proc.base_url + "/health", timeout=10).json()["active"] < 2:
            assert time.monotonic() < deadline, proc.log()
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        response = outcomes["plain"]
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert choice["finish_reason"] == "length" and response.json()["usage"]["completion_tokens"] == 400
        status, lines = outcomes["stream"]
        assert status == 200 and lines[-1] == "data: [DONE]"
        assert '"finish_reason":"length"' in lines[-2]
        assert process.wait(60) == 0, proc.log()
        with pytest.raises(httpx.ConnectError):
            httpx.get(proc.base_url + "/health", timeout=5)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
