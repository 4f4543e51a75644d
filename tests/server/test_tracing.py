"""OpenTelemetry tracing end to end: `pagellm serve` exports its request spans over OTLP/HTTP (JSON)
to a receiver that this test runs on 127.0.0.1, which checks every body against the official
schema (opentelemetry-proto's ExportTraceServiceRequest, parsed with protobuf's json_format and no
unknown fields allowed). Requests carry W3C traceparent headers through the official openai
client; the spans must join their traces, carry vLLM's gen_ai.* attributes with plausible values,
and never slow the responses down, whatever the collector does.

A note on ids: OTLP/JSON writes traceId/spanId as hex, while protobuf's own JSON mapping reads
bytes fields as base64. json_format therefore accepts the hex text (hex digits are base64 digits)
but turns it into other bytes; base64-encoding those bytes gives the hex text back, which is what
hex_id() does. The raw JSON is checked for the hex form as well.
"""
import base64
import http.server
import json
import socket
import subprocess
import threading
import time

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from conftest import KV_BYTES, default_model_path, pagellm_bin
from test_lifecycle import metric
from test_openai_api import raw

# The W3C Trace Context specification's example parent.
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
SPAN_KIND_SERVER = 2
STATUS_CODE_ERROR = 2


def hex_id(b):
    return base64.b64encode(b).decode()


def attrs(key_values):
    """{key: python value} of OTLP KeyValues (arrays of strings as lists)."""
    out = {}
    for kv in key_values:
        kind = kv.value.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [v.string_value for v in kv.value.array_value.values]
        else:
            out[kv.key] = getattr(kv.value, kind)
    return out


class OtlpReceiver:
    """An OTLP/HTTP JSON receiver on 127.0.0.1. Each POST body must parse as an
    ExportTraceServiceRequest (else 400 and the error is kept, failing the test). `fail_first`
    requests are answered 503 with Retry-After: 0 (the exporter must retry them)."""

    def __init__(self, fail_first=0):
        self.lock = threading.Lock()
        self.posts = []      # (path, content type, raw JSON)
        self.spans = []      # (Span message, raw span JSON, resource attributes)
        self.errors = []
        self.fail_first = fail_first
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the exporter expects

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, out = receiver.receive(self.path, self.headers.get("Content-Type", ""), body)
                self.send_response(status)
                if status == 503:
                    self.send_header("Retry-After", "0")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def receive(self, path, content_type, body):
        with self.lock:
            self.posts.append((path, content_type, body))
            if len(self.posts) <= self.fail_first:
                return 503, b'{"message": "try again"}'
        try:
            req = json_format.Parse(body, ExportTraceServiceRequest(), ignore_unknown_fields=False)
        except Exception as e:  # noqa: BLE001 - any parse failure is the finding
            with self.lock:
                self.errors.append(f"{e}: {body[:500]!r}")
            return 400, json.dumps({"message": str(e)}).encode()
        doc = json.loads(body)
        with self.lock:
            for i, rs in enumerate(req.resource_spans):
                resource = attrs(rs.resource.attributes)
                for j, ss in enumerate(rs.scope_spans):
                    for k, span in enumerate(ss.spans):
                        raw_span = doc["resourceSpans"][i]["scopeSpans"][j]["spans"][k]
                        self.spans.append((span, raw_span, resource, ss.scope))
        return 200, b"{}"

    def wait_for(self, pred, timeout=15):
        """The first received span (tuple) for which pred(span, raw) holds."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.lock:
                assert not self.errors, self.errors
                for s in self.spans:
                    if pred(s[0], s[1]):
                        return s
            time.sleep(0.02)
        raise AssertionError(f"no such span after {timeout} s; got {[s[1]['name'] for s in self.spans]}")

    def by_trace(self, trace_id):
        with self.lock:
            return [s for s in self.spans if hex_id(s[0].trace_id) == trace_id]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = OtlpReceiver()
    yield r
    r.close()


def traced_server(server_factory, model_dir, endpoint, via="env", extra=(), env=None):
    """A server exporting to `endpoint`, configured by environment variable or by flag."""
    args = ["--model", model_dir, "--kv-cache-memory", KV_BYTES, "--served-model-name", "tiny", *extra]
    env = dict(env or {})
    if via == "env":
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint
    else:
        args += ["--otlp-traces-endpoint", endpoint]
    return server_factory(args, env=env)


def traceparent(trace_id=TRACE_ID, parent=PARENT_ID, flags="01"):
    return f"00-{trace_id}-{parent}-{flags}"


def check_common(span, raw_span, name):
    """What every request span has: hex ids in the raw JSON, SERVER kind, the route's name."""
    assert span.kind == SPAN_KIND_SERVER and raw_span["kind"] == SPAN_KIND_SERVER
    assert span.name == name
    for key, n in (("traceId", 32), ("spanId", 16)):
        v = raw_span[key]
        assert len(v) == n and v == v.lower() and int(v, 16) != 0, raw_span
    assert span.end_time_unix_nano >= span.start_time_unix_nano > 0


# --- the main path ---

def test_streamed_chat_span_joins_the_callers_trace(server_factory, byte_model_dir, receiver):
    s = traced_server(server_factory, byte_model_dir, receiver.url, via="env",
                      env={"OTEL_SERVICE_NAME": "pagellm-under-test"})
    t0 = time.time_ns()
    start = time.monotonic()
    stream = s.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say something."}], max_tokens=12,
        temperature=0.5, top_p=0.9, stream=True, stream_options={"include_usage": True},
        extra_headers={"traceparent": traceparent(), "tracestate": "rojo=00f067aa0ba902b7"},
        extra_body={"ignore_eos": True})
    chunks = list(stream)
    wall = time.monotonic() - start
    t1 = time.time_ns()
    usage = chunks[-1].usage
    assert usage.completion_tokens == 12

    span, raw_span, resource, scope = receiver.wait_for(lambda sp, r: r["traceId"] == TRACE_ID)
    check_common(span, raw_span, "POST /v1/chat/completions")
    # A child of the caller's span, in the caller's trace, with its own id and the caller's state.
    assert hex_id(span.trace_id) == TRACE_ID and raw_span["traceId"] == TRACE_ID
    assert hex_id(span.parent_span_id) == PARENT_ID and raw_span["parentSpanId"] == PARENT_ID
    assert raw_span["spanId"] not in (PARENT_ID, "0" * 16)
    assert span.trace_state == "rojo=00f067aa0ba902b7"
    assert span.flags & 0xFF == 0x01 and span.flags & 0x300 == 0x300  # sampled; remote parent
    assert resource["service.name"] == "pagellm-under-test"
    assert scope.name == "pagellm.server"
    # Within the request's wall-clock window (ms of slack for clock reads).
    assert t0 - 5_000_000 <= span.start_time_unix_nano <= span.end_time_unix_nano <= t1 + 5_000_000

    a = attrs(span.attributes)
    assert a["gen_ai.request.id"] == chunks[0].id and a["gen_ai.request.id"].startswith("chatcmpl-")
    assert a["gen_ai.response.model"] == "tiny"
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.max_tokens"] == 12
    assert a["gen_ai.request.temperature"] == pytest.approx(0.5)
    assert a["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert a["gen_ai.request.n"] == 1
    assert a["gen_ai.usage.prompt_tokens"] == usage.prompt_tokens > 0
    assert a["gen_ai.usage.completion_tokens"] == 12
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    queue, ttft, e2e = (a["gen_ai.latency.time_in_queue"], a["gen_ai.latency.time_to_first_token"],
                        a["gen_ai.latency.e2e"])
    prefill, decode = a["gen_ai.latency.time_in_model_prefill"], a["gen_ai.latency.time_in_model_decode"]
    assert 0 <= queue <= ttft <= e2e <= wall
    assert prefill >= 0 and decode >= 0
    assert queue + prefill == pytest.approx(ttft, abs=1e-3)
    assert ttft + decode <= e2e + 1e-6
    assert a["gen_ai.latency.time_in_model_inference"] == pytest.approx(prefill + decode, abs=1e-3)
    assert abs(e2e - (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9) < 0.01
    assert a["pagellm.stream"] is True and a["pagellm.num_preemptions"] == 0
    assert a["http.request.method"] == "POST" and a["url.path"] == "/v1/chat/completions"
    assert a["http.response.status_code"] == 200
    assert "pagellm.client_disconnected" not in a
    assert span.status.code == 0  # UNSET: the request succeeded

    # /metrics counts it.
    deadline = time.time() + 5
    while metric(s.url, "pagellm:trace_spans_exported_total") < 1 and time.time() < deadline:
        time.sleep(0.05)
    assert metric(s.url, "pagellm:trace_spans_exported_total") >= 1
    assert metric(s.url, 'pagellm:trace_spans_dropped_total{model_name="tiny",reason="queue_full"}') == 0


def test_flag_endpoint_completions_sampling_and_bad_headers(server_factory, byte_model_dir, receiver):
    s = traced_server(server_factory, byte_model_dir, receiver.url, via="flag")
    c = s.client()
    # The caller's trace is not sampled: honoured, no span.
    unsampled = "a" * 32
    c.completions.create(model="tiny", prompt="abc", max_tokens=3,
                         extra_headers={"traceparent": traceparent(unsampled, flags="00")})
    # A malformed traceparent (uppercase hex): ignored, a new trace is started.
    bad = "B" * 32
    r_bad = c.completions.create(model="tiny", prompt="abc", max_tokens=3,
                                 extra_headers={"traceparent": traceparent(bad)})
    # No traceparent: a new root span. Two prompts x n=2: four sequences.
    r_root = c.completions.create(model="tiny", prompt=["abc", "defg"], n=2, max_tokens=4,
                                  extra_body={"ignore_eos": True})
    # Sampled: joins the trace.
    sampled = "c" * 32
    r_in = c.completions.create(model="tiny", prompt="abc", max_tokens=2,
                                extra_headers={"traceparent": traceparent(sampled, parent="1" * 16)})

    def attr_is(key, value):
        return lambda sp, r: attrs(sp.attributes).get(key) == value

    span, raw_span, _, _ = receiver.wait_for(attr_is("gen_ai.request.id", r_in.id))
    check_common(span, raw_span, "POST /v1/completions")
    assert raw_span["traceId"] == sampled and raw_span["parentSpanId"] == "1" * 16
    # Spans leave in the order their requests ended: the unsampled one would be here by now.
    assert receiver.by_trace(unsampled) == []

    span, raw_span, resource, _ = receiver.wait_for(attr_is("gen_ai.request.id", r_bad.id))
    assert raw_span["traceId"] not in (bad, bad.lower()) and "parentSpanId" not in raw_span
    assert resource["service.name"] == "pagellm"  # the default

    span, raw_span, _, _ = receiver.wait_for(attr_is("gen_ai.request.id", r_root.id))
    assert "parentSpanId" not in raw_span and span.flags & 0x300 == 0x100  # a root: no remote parent
    a = attrs(span.attributes)
    assert a["gen_ai.operation.name"] == "text_completion"
    assert a["gen_ai.request.n"] == 2 and a["gen_ai.usage.num_sequences"] == 4
    assert a["gen_ai.response.finish_reasons"] == ["length"] * 4
    assert a["gen_ai.usage.completion_tokens"] == r_root.usage.completion_tokens == 16
    assert a["gen_ai.usage.prompt_tokens"] == r_root.usage.prompt_tokens
    assert a["pagellm.stream"] is False
    assert a["gen_ai.request.temperature"] == pytest.approx(1.0)  # the default


@pytest.fixture
def smol_traced(server_factory, receiver):
    """The default model (slow enough to time out and to walk away from), with a 2 s request
    timeout."""
    default_model_path()
    s = server_factory(["--max-model-len", "512", "--kv-cache-memory", KV_BYTES, "--request-timeout", "2"],
                       env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url})
    return s


def test_refused_and_timed_out_requests(smol_traced, receiver):
    s = smol_traced
    # A client mistake: a span with status 400 and status UNSET (OpenTelemetry's HTTP rules).
    status, _, _ = raw(s.url, "/v1/completions", {"prompt": "x", "max_tokens": -1},
                       headers={"traceparent": traceparent("d" * 32)})
    assert status == 400
    span, raw_span, _, _ = receiver.wait_for(lambda sp, r: r["traceId"] == "d" * 32)
    check_common(span, raw_span, "POST /v1/completions")
    a = attrs(span.attributes)
    assert a["http.response.status_code"] == 400 and span.status.code == 0
    assert "gen_ai.request.id" not in a  # refused before it became a generation
    # The server's failure: 400 tokens take longer than the 2 s request timeout -> 504, ERROR.
    status, _, _ = raw(s.url, "/v1/completions",
                       {"prompt": "Write a poem", "max_tokens": 400, "ignore_eos": True},
                       headers={"traceparent": traceparent("e" * 32)})
    assert status == 504
    span, _, _, _ = receiver.wait_for(lambda sp, r: r["traceId"] == "e" * 32)
    a = attrs(span.attributes)
    assert span.status.code == STATUS_CODE_ERROR
    assert "request-timeout" in span.status.message
    assert a["error.type"] == "timeout_error" and a["http.response.status_code"] == 504
    assert a["gen_ai.response.finish_reasons"] == ["abort"]
    assert 0 < a["gen_ai.usage.completion_tokens"] < 400
    assert a["gen_ai.latency.e2e"] >= 2.0


def test_client_disconnect_still_produces_a_span(smol_traced, receiver):
    s = smol_traced
    body = json.dumps({"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 400,
                       "stream": True, "ignore_eos": True}).encode()
    k = socket.create_connection((s.host, s.port))
    k.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"traceparent: {traceparent('f' * 32)}\r\n".encode()
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += k.recv(4096)
    k.close()
    span, raw_span, _, _ = receiver.wait_for(lambda sp, r: r["traceId"] == "f" * 32)
    check_common(span, raw_span, "POST /v1/chat/completions")
    a = attrs(span.attributes)
    assert a["pagellm.stream"] is True
    assert a["http.response.status_code"] == 200  # the stream had begun
    assert a["pagellm.client_disconnected"] is True
    assert a["gen_ai.response.finish_reasons"] == ["abort"]
    assert 2 <= a["gen_ai.usage.completion_tokens"] < 400
    assert span.status.code == 0  # the client left: not the server's failure


def test_preemptions_become_span_events(server_factory, byte_model_dir, receiver):
    # 8 KV blocks of 16 tokens; one request of six prompts (submitted together) of 15 + 45 tokens
    # (4 blocks each when done): they cannot all run to the end at once, so some are preempted.
    s = traced_server(server_factory, byte_model_dir, receiver.url, extra=["--kv-cache-memory", str(64 << 10)])
    r = s.client().completions.create(model="tiny", prompt=[f"hello world {i:03d}" for i in range(6)],
                                      max_tokens=45, extra_body={"ignore_eos": True})
    assert [c.finish_reason for c in r.choices] == ["length"] * 6
    n_preempted = metric(s.url, "vllm:num_preemptions_total")
    assert n_preempted > 0
    span, _, _, _ = receiver.wait_for(lambda sp, raw_span: attrs(sp.attributes).get("gen_ai.request.id") == r.id)
    a = attrs(span.attributes)
    assert len(span.events) == a["pagellm.num_preemptions"] == n_preempted
    for e in span.events:
        assert e.name == "preempted"
        assert span.start_time_unix_nano <= e.time_unix_nano <= span.end_time_unix_nano
        assert 0 <= attrs(e.attributes)["pagellm.prompt_index"] < 6
    assert a["gen_ai.response.finish_reasons"] == ["length"] * 6
    assert a["gen_ai.usage.completion_tokens"] == 6 * 45


def test_finished_requests_are_freed(server_factory, byte_model_dir, receiver):
    # A request is over once its response has ended and the engine has let go of it: then its
    # span is sent and its state (here each request's 1 MB "user" field, held twice) is freed.
    # 150 requests would hold 300 MB if anything kept them.
    s = traced_server(server_factory, byte_model_dir, receiver.url)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "user": "x" * (1 << 20)}
    for stream in (False, True):
        assert raw(s.url, "/v1/completions", dict(body, stream=stream))[0] == 200
    before = s.rss_kib()
    for i in range(150):
        assert raw(s.url, "/v1/completions", dict(body, stream=i % 2 == 1))[0] == 200
    assert s.rss_kib() - before < 64 << 10, "finished requests are being kept"
    receiver.wait_for(lambda sp, r: True)


# --- the collector misbehaving ---

def test_retries_a_throttling_collector(server_factory, byte_model_dir):
    rx = OtlpReceiver(fail_first=2)
    try:
        s = traced_server(server_factory, byte_model_dir, rx.url)
        r = s.client().completions.create(model="tiny", prompt="abc", max_tokens=2)
        rx.wait_for(lambda sp, raw_span: attrs(sp.attributes).get("gen_ai.request.id") == r.id)
        assert len(rx.posts) >= 3
        assert rx.posts[0][2] == rx.posts[2][2]  # the same batch, sent again
        assert all(p[0] == "/v1/traces" and p[1] == "application/json" for p in rx.posts)
    finally:
        rx.close()


def timed_requests(s, n):
    c = s.client()
    times = []
    for i in range(n):
        t = time.monotonic()
        stream = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"hi {i}"}],
                                           max_tokens=4, stream=True,
                                           extra_headers={"traceparent": traceparent()})
        assert len([ch for ch in stream if ch.choices]) >= 1
        times.append(time.monotonic() - t)
    return times


def test_collector_down_changes_nothing_for_clients(server_factory, byte_model_dir):
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    closed = port.getsockname()[1]
    port.close()  # nothing listens there now
    s = traced_server(server_factory, byte_model_dir, f"http://127.0.0.1:{closed}/v1/traces")
    times = timed_requests(s, 20)
    assert max(times) < 1.0, times
    assert metric(s.url, "pagellm:trace_spans_exported_total") == 0
    assert raw(s.url, "/health")[0] == 200
    t = time.monotonic()
    assert s.stop() == 0
    # Drain, then at most the exporter's 5 s shutdown limit (plus start-up slack).
    assert time.monotonic() - t < 9
    assert "trace export" in s.log()  # the failure was logged (rate-limited), not fatal


def test_hung_collector_never_delays_responses(server_factory, byte_model_dir):
    # Accepts connections (the kernel's backlog) and never answers: every export waits for its
    # timeout. Responses must not notice.
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    try:
        s = traced_server(server_factory, byte_model_dir, f"http://127.0.0.1:{hung.getsockname()[1]}/v1/traces")
        baseline = s.client().completions.create(model="tiny", prompt="warm", max_tokens=2)
        assert baseline.choices
        times = timed_requests(s, 30)
        assert max(times) < 1.0, times
        t = time.monotonic()
        assert s.stop() == 0
        assert time.monotonic() - t < 9  # the shutdown limit cuts the hung export short
    finally:
        hung.close()


def test_https_endpoint_is_refused_at_startup(byte_model_dir):
    p = subprocess.run([pagellm_bin(), "serve", "--port", "0", "--model", byte_model_dir,
                        "--kv-cache-memory", KV_BYTES],
                       env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://collector:4318/v1/traces",
                            "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "https is not supported" in p.stderr


def test_tracing_off_by_default(byte_server):
    status, _, body = raw(byte_server.url, "/metrics")
    assert status == 200 and b"pagellm:trace_spans" not in body
