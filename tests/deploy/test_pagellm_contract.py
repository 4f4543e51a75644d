"""What the deployment files expect of the pagellm binary, checked against a real `pagellm serve`:
the probe paths answer without the API key, /metrics parses as Prometheus text and has every metric
the endpoint picker and the alerts read, with the types they expect, and every --config file the
manifests ship starts the server."""
import re
import subprocess
import urllib.error
import urllib.request

import pytest
import yaml

import deploy_check as dc
from conftest import GOLDEN_LLAMA

EPP_METRIC_FLAGS = {"total-queued-requests-metric": "gauge", "total-running-requests-metric": "gauge",
                    "kv-cache-usage-percentage-metric": "gauge", "lora-info-metric": "gauge",
                    "cache-info-metric": "gauge"}


@pytest.fixture(scope="module")
def server(pagellm_bin, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "w") as err:
        p = subprocess.Popen([pagellm_bin, "serve", "--model", GOLDEN_LLAMA, "--port", "0", "--kv-cache-memory",
                              str(32 << 20), "--api-key", "sekret"], stdout=subprocess.PIPE, stderr=err, text=True)
    line = p.stdout.readline()
    if not line.startswith("listening on "):
        p.kill()
        p.wait()
        pytest.fail(f"pagellm serve did not start: {line!r}\n{log.read_text()[-2000:]}")
    yield line.split()[2].rstrip(",")
    p.terminate()
    assert p.wait(timeout=30) == 0


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def all_objects():
    docs = dc.plain_manifests()
    for r in dc.RENDERINGS:
        docs += dc.render(r)
    return docs


def test_probe_paths_need_no_api_key(server):
    probes = {c[k]["httpGet"]["path"] for _, d in all_objects() for c in dc.containers(d)
              for k in ("startupProbe", "readinessProbe", "livenessProbe") if "httpGet" in c.get(k, {})}
    assert probes == {"/health", "/ping"}
    for path in probes:
        assert get(server + path)[0] == 200, path
    assert get(server + "/v1/models")[0] == 401  # while the API itself does


def test_metrics_have_what_the_endpoint_picker_and_alerts_read(server):
    from prometheus_client.parser import text_string_to_metric_families
    status, text = get(server + "/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    exported = set()
    for f in families.values():
        exported |= {s.name for s in f.samples}
    # The endpoint picker's metric flags, in every rendering and in deploy/kubernetes.
    for _, d in all_objects():
        for c in dc.containers(d):
            for flag, value in dc.arg_flags(c).items():
                if flag in EPP_METRIC_FLAGS and value:
                    name = value.split("{")[0]
                    assert name in exported, f"the endpoint picker reads {name} (--{flag}): not in /metrics"
                    family = name.removesuffix("_total") if families.get(name) is None else name
                    assert families[family].type == EPP_METRIC_FLAGS[flag], (name, families[family].type)
    # Every metric the alert rules read.
    rules = [d for _, d in dc.render("production") if d["kind"] == "PrometheusRule"]
    assert rules
    for group in rules[0]["spec"]["groups"]:
        for rule in group["rules"]:
            for name in re.findall(r"\b((?:vllm|pagellm):[a-z0-9_]+)", rule["expr"]):
                assert name in exported, f"alert {rule['alert']} reads {name}: not in /metrics"


def config_files():
    """{config.yaml text: [where it comes from]} of every ConfigMap the manifests and the chart ship."""
    out = {}
    for source, d in all_objects():
        if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {}):
            out.setdefault(d["data"]["config.yaml"], []).append(f"{source}: {d['metadata']['name']}")
    return out


def test_config_files_start_the_server(pagellm_bin, tmp_path):
    """pagellm reads each --config file as shipped (unknown keys and bad values are errors); the
    command line moves it onto this machine: CPU, loopback, a free port, the tiny test model."""
    files = config_files()
    assert len(files) >= 2
    for i, (text, sources) in enumerate(sorted(files.items())):
        config = tmp_path / f"config-{i}.yaml"
        config.write_text(text)
        p = subprocess.Popen([pagellm_bin, "serve", "--config", str(config), "--model", GOLDEN_LLAMA, "--device", "cpu",
                              "--host", "127.0.0.1", "--port", "0", "--kv-cache-memory", str(32 << 20),
                              "--max-model-len", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = p.stdout.readline()
            assert line.startswith("listening on http://127.0.0.1:"), f"{sources}: {line!r} {p.stderr.read()[-2000:]}"
            assert line.rstrip().endswith(yaml.safe_load(text)["served-model-name"]), line
            p.terminate()
            assert p.wait(timeout=30) == 0
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
