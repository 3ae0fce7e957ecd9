"""Helpers for the server tests: build a tiny model on disk and run ``python -m server`` on it.

The model is a randomly initialised GPT-2 (hidden size 32, two layers, 1,024 positions) over the
real GPT-2 vocabulary from ``../shared/vocab``, saved with its tokenizer and a small chat
template, built by the server's own process before it starts serving. The server runs as a subprocess on a free loopback port with an API key and one torch
thread, once per session; tests talk to it over real
sockets with the official ``openai`` client and ``httpx``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from shared_data import REPO_ROOT, vocab_file

API_KEY = "test-key"
MODEL_NAME = "tiny"

#: a minimal chat template, so the server's template path is the one exercised end to end
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_model(folder: Path, vocab_path: Path, *, n_positions: int = 1024, seed: int = 0) -> Path:
    """Save a random tiny GPT-2 with the GPT-2 tokenizer (and ``CHAT_TEMPLATE``) to ``folder``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from grammars import TokenVocabulary

    vocab = TokenVocabulary.from_pretrained(vocab_path)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab.logits_width, n_embd=32, n_layer=2, n_head=2, n_positions=n_positions,
                        bos_token_id=50256, eos_token_id=50256)
    model = GPT2LMHeadModel(config).eval()
    model.generation_config.eos_token_id = 50256
    model.save_pretrained(folder)
    tokenizer = vocab.hf_tokenizer
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


#: run in the server's process: build the model there (the test process then never imports
#: torch or transformers for it, seconds saved on a busy machine), then ``python -m server``
LAUNCHER = """
import pathlib, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
folder, vocab = pathlib.Path(sys.argv[3]), pathlib.Path(sys.argv[4])
if not (folder / "config.json").exists():
    from serve_helpers import build_tiny_model
    build_tiny_model(folder, vocab)
from server.__main__ import main
sys.exit(main(sys.argv[5:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    """A running ``python -m server``: its process, base URL and log file."""

    process: subprocess.Popen
    base_url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-6000:]

    def health(self) -> dict:
        import httpx

        return httpx.get(self.base_url + "/health", timeout=10).json()

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode


def start_server(model_dir: Path, log_path: Path, *extra: str, startup_timeout: float = 240.0) -> ServerProcess:
    """Start the server on a free port (building the tiny model in ``model_dir`` first when it
    holds none) and wait until ``/health`` answers; fails the test with the server's log."""
    import httpx

    port = free_port()
    here = Path(__file__).resolve().parent
    args = ["--model", str(model_dir), "--served-model-name", MODEL_NAME, "--port", str(port), "--api-key", API_KEY,
            "--threads", "1", "--log-level", "warning", *extra]
    command = [sys.executable, "-c", LAUNCHER, str(here.parent), str(here), str(model_dir), str(vocab_file("gpt-2")),
               *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    log_file = open(log_path, "w", encoding="utf-8")
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    server = ServerProcess(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the server exited with code {process.returncode} during startup:\n{server.log()}")
        try:
            if httpx.get(server.base_url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.stop()
    pytest.fail(f"the server did not answer /health within {startup_timeout} s:\n{server.log()}")




def build_tiny_diffusion_model(folder: Path, vocab_path: Path, *, seed: int = 0) -> Path:
    """Save a random tiny ModernBERT masked-diffusion model (``engine.tiny_diffusion``'s build) over
    the GPT-2 vocabulary plus its mask token, with the tokenizer, to ``folder``."""
    from engine.tiny_diffusion import DiffusionConfig, add_mask_token, build_diffusion_model
    from grammars import TokenVocabulary

    tokenizer = add_mask_token(TokenVocabulary.from_pretrained(vocab_path).hf_tokenizer)
    config = DiffusionConfig(vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id, n_layer=1, hidden=32,
                             n_head=2, max_positions=512, eos_token_id=50256)
    build_diffusion_model(config, seed=seed).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
