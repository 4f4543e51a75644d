"""The command line as an operator meets it: every option documented by --help (with its default
and environment variable), --version, --config files (YAML and JSON) that a real server obeys,
sizes with units, and clear errors for unknown options and keys."""
import json
import re
import subprocess

import httpx

from conftest import GOLDEN_LLAMA, KV_BYTES, pagellm_bin

COMMANDS = ["serve", "generate", "chat", "inspect", "quantize", "tokenize", "detokenize", "template",
            "bench latency", "bench throughput", "bench serve", "bench cost"]


def run(*args, env=None):
    return subprocess.run([pagellm_bin(), *args], capture_output=True, text=True, timeout=60, env=env)


def kv_blocks(server):
    m = re.search(r"^pagellm:kv_cache_blocks(?:\{[^}]*\})? (\S+)$", httpx.get(server.url + "/metrics").text, re.M)
    return float(m.group(1))


def options_in(help_text):
    return re.findall(r"^  --([a-z0-9-]+)", help_text, re.M)


def test_every_command_documents_every_option():
    for cmd in COMMANDS:
        r = run(*cmd.split(), "--help")
        assert r.returncode == 0, (cmd, r.stderr)
        h = r.stdout
        assert h.startswith(f"usage: pagellm {cmd} [options]"), h[:200]
        opts = options_in(h)
        assert "config" in opts and "help" in opts, cmd
        assert len(opts) == len(set(opts)), f"{cmd}: an option listed twice"
        # Each option's entry (its lines up to the next option) has a description and, but for
        # --help, the option's environment variable.
        entries = re.findall(r"^  --([a-z0-9-]+)(.*?)(?=^  --|^\S|\Z)", h, re.M | re.S)
        assert [name for name, _ in entries] == opts
        for name, body in entries:
            text = re.sub(r"\s+", " ", body)
            if name != "help":
                assert "[env: PAGELLM_" + name.upper().replace("-", "_") in text, (cmd, name, text)
            assert len(re.sub(r"\[.*?\]", "", text)) > 20, f"{cmd} --{name}: no description: {text!r}"
        for line in h.splitlines():
            assert len(line) <= 100, (cmd, line)


def test_serve_help_groups_and_defaults():
    h = run("serve", "--help").stdout
    for group in ["Model:", "KV cache:", "Scheduler:", "Server:", "Observability:", "General:"]:
        assert f"\n{group}\n" in h, group
    flat = re.sub(r"\s+", " ", h)
    assert "--port PORT TCP port; 0 picks a free one (printed) [default: 8000] [env: PAGELLM_PORT]" in flat
    assert "[default: 0.9]" in flat and "[default: 8MiB]" in flat


def test_bench_help():
    r = run("bench", "--help")
    assert r.returncode == 0 and "latency" in r.stdout and "serve" in r.stdout
    r = run("bench", "serve", "--help")
    assert r.returncode == 0 and "--sweep-rate RATES" in r.stdout and "--base-url URL" in r.stdout


def test_version():
    r = run("--version")
    assert r.returncode == 0
    assert re.fullmatch(r"pagellm \d+\.\d+\.\d+ \(commit [0-9a-f]{7,}(-dirty)?\)\n|pagellm \d+\.\d+\.\d+ \(commit unknown\)\n",
                        r.stdout), r.stdout


def test_unknown_option_names_the_closest(tmp_path):
    r = run("serve", "--max-num-seq", "4")
    assert r.returncode == 1
    assert "unknown option --max-num-seq (did you mean --max-num-seqs?)" in r.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max-num-seqs: 4\nkv-cache-memroy: 8GiB\n")
    r = run("serve", "--config", str(cfg))
    assert r.returncode == 1
    assert "unknown key 'kv-cache-memroy' (did you mean 'kv-cache-memory'?)" in r.stderr
    r = run("serve", "--kv-cache-memory", "8 parsecs")
    assert r.returncode == 1 and "--kv-cache-memory expects a byte count" in r.stderr


def test_server_obeys_a_yaml_config_and_the_command_line_wins(server_factory, tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"""# a server's configuration, as a ConfigMap would hold it
model: {GOLDEN_LLAMA}
served-model-name: from-file
kv-cache-memory: 32MiB
max_num_seqs: 3
api-key: file-key
""")
    s = server_factory(["--config", str(cfg), "--api-key", "cli-key"])
    assert s.model == "from-file"
    assert httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer file-key"}).status_code == 401
    r = httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer cli-key"})
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "from-file"
    # The file's KV size took effect: twice the blocks of a 16 MiB pool.
    half = server_factory(["--config", str(cfg), "--kv-cache-memory", "16MiB"])
    assert kv_blocks(s) == 2 * kv_blocks(half) > 0


def test_server_reads_json_config_from_the_environment(server_factory, tmp_path):
    cfg = tmp_path / "serve.json"
    cfg.write_text(json.dumps({"model": GOLDEN_LLAMA, "served-model-name": "json-file",
                               "kv-cache-memory": int(KV_BYTES)}))
    s = server_factory([], env={"PAGELLM_CONFIG": str(cfg), "PAGELLM_SERVED_MODEL_NAME": "from-env"})
    assert s.model == "from-env"  # the environment wins over the file
    v = httpx.get(s.url + "/version").json()
    assert set(v) == {"version", "commit"}
