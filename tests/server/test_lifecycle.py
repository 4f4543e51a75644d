"""Connection and process life: auth, CORS, body limit, slow bodies, request timeout, client
disconnects, graceful shutdown, JSON logs with request ids."""
import json
import signal
import socket
import threading
import time

import openai
import pytest

from conftest import GOLDEN_LLAMA, KV_BYTES
from test_openai_api import raw


def metric(url, name):
    _, _, body = raw(url, "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_api_key(server_factory, byte_model_dir):
    s = server_factory(["--model", byte_model_dir, "--kv-cache-memory", KV_BYTES], env={"PAGELLM_API_KEY": "sekret"})
    with pytest.raises(openai.AuthenticationError):
        s.client(api_key="wrong").models.list()
    status, headers, body = raw(s.url, "/v1/models")
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    assert s.client(api_key="sekret").models.list().data[0].id == s.model
    # Health and metrics stay open for probes and scrapers.
    assert raw(s.url, "/health")[0] == 200 and raw(s.url, "/metrics")[0] == 200


def test_cors_preflight_and_headers(server_factory, byte_model_dir):
    s = server_factory(["--model", byte_model_dir, "--kv-cache-memory", KV_BYTES,
                        "--cors-origin", "https://app.example", "--api-key", "k"])
    status, headers, _ = raw(s.url, "/v1/completions", method="OPTIONS",
                             headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                                      "Access-Control-Request-Headers": "authorization, content-type"})
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "POST" in headers["Access-Control-Allow-Methods"]
    assert "authorization" in headers["Access-Control-Allow-Headers"]
    status, headers, _ = raw(s.url, "/v1/models", headers={"Origin": "https://app.example", "Authorization": "Bearer k"})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "https://app.example"
    status, headers, _ = raw(s.url, "/v1/models", headers={"Origin": "https://evil.example", "Authorization": "Bearer k"})
    assert "Access-Control-Allow-Origin" not in headers


def test_body_limit(server_factory, byte_model_dir):
    s = server_factory(["--model", byte_model_dir, "--kv-cache-memory", KV_BYTES, "--max-body-bytes", "2000"])
    status, _, body = raw(s.url, "/v1/completions", {"prompt": "x" * 5000, "max_tokens": 1})
    assert status == 413 and "max-body-bytes" in json.loads(body)["error"]["message"]
    status, _, _ = raw(s.url, "/v1/completions", {"prompt": "x" * 10, "max_tokens": 1})
    assert status == 200


def test_slow_body_times_out_without_blocking_others(server_factory, byte_model_dir):
    # A 3 s read timeout: answering the others in well under that shows they were not queued
    # behind the slow clients, with room for a loaded machine's scheduling delays.
    s = server_factory(["--model", byte_model_dir, "--kv-cache-memory", KV_BYTES, "--read-timeout", "3",
                        "--io-threads", "1"])
    socks = []
    for _ in range(20):  # more slow clients than I/O threads
        k = socket.create_connection((s.host, s.port))
        k.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\"")
        socks.append(k)
    t0 = time.time()
    # The server still answers everyone else at once.
    assert raw(s.url, "/v1/completions", {"prompt": "hi", "max_tokens": 2})[0] == 200
    assert time.time() - t0 < 2.0
    k = socks[0]
    k.settimeout(10)
    data = b""
    while True:
        chunk = k.recv(4096)
        if not chunk:
            break
        data += chunk
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert 2.8 < time.time() - t0 < 8
    for k in socks:
        k.close()


def test_request_timeout(server_factory):
    s = server_factory(["--max-model-len", "512", "--kv-cache-memory", KV_BYTES, "--request-timeout", "0.5"])
    with pytest.raises(openai.APIStatusError) as e:
        s.client().completions.create(model=s.model, prompt="Write a poem", max_tokens=400,
                                      extra_body={"ignore_eos": True})
    assert e.value.status_code == 504
    deadline = time.time() + 5
    while metric(s.url, "vllm:num_requests_running") and time.time() < deadline:
        time.sleep(0.05)
    assert metric(s.url, "vllm:kv_cache_usage_perc") == 0


def test_disconnect_mid_stream_aborts_and_frees_kv(smol_server):
    body = json.dumps({"prompt": "Write a very long story.", "max_tokens": 400, "stream": True,
                       "ignore_eos": True}).encode()
    k = socket.create_connection((smol_server.host, smol_server.port))
    k.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += k.recv(4096)
    assert metric(smol_server.url, "vllm:num_requests_running") == 1
    assert metric(smol_server.url, "vllm:kv_cache_usage_perc") > 0
    k.close()
    deadline = time.time() + 5
    while metric(smol_server.url, "vllm:num_requests_running") and time.time() < deadline:
        time.sleep(0.02)
    assert metric(smol_server.url, "vllm:num_requests_running") == 0
    assert metric(smol_server.url, "vllm:kv_cache_usage_perc") == 0
    # 400 tokens take the CPU several seconds: freed well before means the disconnect aborted it
    # (2.5 s of slack for a loaded machine).
    assert time.time() < deadline - 2.5, "the abort took more than 2.5 seconds"


def test_sigterm_drains_in_flight_request(server_factory):
    s = server_factory(["--max-model-len", "512", "--kv-cache-memory", KV_BYTES, "--drain-timeout", "30"])
    result = {}

    def run():
        c = s.client()
        result["r"] = c.completions.create(model=s.model, prompt="Count: 1, 2, 3,", max_tokens=60, temperature=0,
                                           extra_body={"ignore_eos": True})

    t = threading.Thread(target=run)
    t.start()
    deadline = time.time() + 10
    while metric(s.url, "vllm:num_requests_running") == 0 and time.time() < deadline:
        time.sleep(0.01)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    # No new connections once draining.
    with pytest.raises(OSError):
        socket.create_connection((s.host, s.port), timeout=2).recv(1) or (_ for _ in ()).throw(OSError("closed"))
    t.join(60)
    assert s.proc.wait(30) == 0
    r = result["r"]
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 60
    assert "draining" in s.log() and "stopped" in s.log()


def test_json_logs_carry_request_ids(server_factory):
    s = server_factory(["--model", GOLDEN_LLAMA, "--kv-cache-memory", KV_BYTES, "--log-format", "json"])
    raw(s.url, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2}, headers={"X-Request-Id": "abc-123"})
    # The access line is written once the response is out, so it may trail the client a little.
    deadline = time.time() + 5
    while "abc-123" not in s.log() and time.time() < deadline:
        time.sleep(0.02)
    lines = [json.loads(line) for line in s.log().splitlines() if line.strip()]
    assert all({"ts", "level", "msg"} <= set(j) for j in lines)
    mine = [j for j in lines if j.get("request_id") == "abc-123"]
    assert mine and mine[-1]["status"] == 200 and mine[-1]["path"] == "/v1/completions"
