"""Fixtures for the server tests: real `pagellm serve` processes on 127.0.0.1 (ephemeral ports).

The binary is $PAGELLM_BIN (CTest sets it) or build/cpu/tools/pagellm. Models: the tiny golden
Llama (token ids only), the same with a byte-level tokenizer (text, fast), and the default model
(SmolLM2-135M-Instruct, installed by scripts/setup.sh). A missing binary or model is a failure,
not a skip: these tests are how we know the server works.
"""
import atexit
import os
import re
import signal
import subprocess
import tempfile
import time

import pytest

from byte_model import make_byte_model

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN_LLAMA = os.path.join(ROOT, "tests", "data", "golden", "llama")
# Small KV pools keep every server's memory (and RSS measurements) small.
KV_BYTES = str(32 << 20)


def pagellm_bin():
    path = os.environ.get("PAGELLM_BIN") or os.path.join(ROOT, "build", "cpu", "tools", "pagellm")
    if not os.access(path, os.X_OK):
        pytest.fail(f"pagellm binary not found at {path} (build it, or set PAGELLM_BIN)")
    return path


def default_model_path():
    cache = os.environ.get("PAGELLM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "pagellm")
    path = os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        pytest.fail(f"default model missing at {path}: run scripts/setup.sh")
    return path


def _remove_log(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Server:
    """One `pagellm serve` process. stderr (the log) goes to a file, read by log(); the file is
    removed when the test session ends (a failing test has quoted what it needs of it by then)."""

    def __init__(self, args, env=None, startup_timeout=60):
        self.log_file = tempfile.NamedTemporaryFile(prefix="pagellm-serve-", suffix=".log", delete=False)
        atexit.register(_remove_log, self.log_file.name)
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.args = [pagellm_bin(), "serve", "--port", "0", *args]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.log_file, env=full_env, text=True)
        deadline = time.time() + startup_timeout
        line = ""
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if line or self.proc.poll() is not None:
                break
        m = re.match(r"listening on http://([0-9.]+):(\d+), model (.+)", line.strip())
        if not m:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"server did not start: {self.args}\nstdout: {line!r}\nlog:\n{self.log()[-3000:]}")
        self.host, self.port, self.model = m.group(1), int(m.group(2)), m.group(3)
        self.url = f"http://{self.host}:{self.port}"

    def log(self):
        with open(self.log_file.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def client(self, **kw):
        import openai
        kw.setdefault("api_key", "none")
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 120)
        return openai.OpenAI(base_url=self.url + "/v1", **kw)


@pytest.fixture(scope="session")
def byte_model_dir(tmp_path_factory):
    return make_byte_model(GOLDEN_LLAMA, str(tmp_path_factory.mktemp("byte_llama")))


@pytest.fixture(scope="session")
def tiny_server():
    """The golden Llama without a tokenizer: token-id prompts, token-id outputs."""
    s = Server(["--model", GOLDEN_LLAMA, "--kv-cache-memory", KV_BYTES])
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="session")
def byte_server(byte_model_dir):
    """The golden Llama with a byte tokenizer: text in and out, ~0.1 ms per step."""
    s = Server(["--model", byte_model_dir, "--kv-cache-memory", KV_BYTES, "--served-model-name", "tiny"])
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="session")
def smol_server():
    """The default model (no --model), with its tokenizer and chat template."""
    default_model_path()
    s = Server(["--max-model-len", "512", "--kv-cache-memory", KV_BYTES])
    yield s
    assert s.stop() == 0


@pytest.fixture
def server_factory():
    """Starts servers with custom flags for one test; stops them after it."""
    started = []

    def make(args, env=None):
        s = Server(args, env=env)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()
