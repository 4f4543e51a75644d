"""The deployment checks of deploy_check.py (what scripts/check-deploy.sh runs), one test each, and
proof that they catch the mistakes they are there for."""
import copy

import pytest

import deploy_check as dc

CHECKS = dict(dc.checks())


@pytest.mark.parametrize("name", list(CHECKS))
def test_check(name):
    try:
        errors = CHECKS[name]()
    except dc.ToolMissing as e:
        pytest.fail(str(e))
    assert not errors, "\n".join(errors)


def find(docs, kind, name):
    return next(d for _, d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def server_container(docs, name="pagellm"):
    return find(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]


def mutated(fn):
    docs = dc.render("canary")
    fn(docs)
    return docs


@pytest.mark.parametrize("mutation, expected", [
    (lambda d: server_container(d).update(readinesProbe={}), "'readinesProbe' was unexpected"),
    (lambda d: find(d, "HTTPRoute", "pagellm")["spec"]["rules"][0].update(timeout={}), "'timeout' was unexpected"),
    (lambda d: find(d, "InferencePool", "pagellm")["spec"]["endpointPickerRef"].pop("port"),
     "'port' is a required property"),
    (lambda d: find(d, "Service", "pagellm")["metadata"]["labels"].update({"bad key": "x"}), "does not match"),
])
def test_schemas_reject(mutation, expected):
    errors = dc.validate_objects(mutated(mutation))
    assert any(expected in e for e in errors), errors


def epp_reads_gpu_cache_usage(docs):
    c = find(docs, "Deployment", "pagellm-epp")["spec"]["template"]["spec"]["containers"][0]
    c["args"] = [a.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc") for a in c["args"]]


@pytest.mark.parametrize("mutation, expected", [
    (lambda d: find(d, "HTTPRoute", "pagellm")["spec"]["rules"][0]["backendRefs"][0].update(weight=90),
     "add up to 95"),
    (lambda d: find(d, "InferencePool", "pagellm")["spec"]["selector"]["matchLabels"].pop("pagellm/track"),
     "selects 2 Deployments"),
    (epp_reads_gpu_cache_usage, "vllm:gpu_cache_usage_perc (--kv-cache-usage-percentage-metric), which pagellm"),
    (lambda d: find(d, "Deployment", "pagellm")["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=60),
     "terminationGracePeriodSeconds 60"),
    (lambda d: server_container(d).pop("lifecycle"), "no preStop sleep"),
    (lambda d: server_container(d)["startupProbe"].update(failureThreshold=12), "for the model load"),
    (lambda d: server_container(d)["env"].__setitem__(1, {"name": "PAGELLM_API_KEY", "value": "k"}),
     "must come from a Secret"),
    (lambda d: find(d, "Service", "pagellm-epp")["spec"]["ports"][0].update(port=9005), "has no port 9002"),
    (lambda d: find(d, "HTTPRoute", "pagellm")["spec"]["rules"][0]["backendRefs"][1].update(name="pagellm-next"),
     "InferencePool/pagellm-next does not exist"),
    (lambda d: find(d, "Role", "pagellm-epp")["rules"].pop(0), "may not list/watch inferencepools"),
])
def test_consistency_rejects(mutation, expected):
    errors = dc.consistency(mutated(mutation))
    assert any(expected in e for e in errors), errors


def test_canary_takes_five_percent():
    route = find(dc.render("canary"), "HTTPRoute", "pagellm")
    weights = {r["name"]: r["weight"] for r in route["spec"]["rules"][0]["backendRefs"]}
    assert weights == {"pagellm": 95, "pagellm-canary": 5}
    assert "weight" not in str(find(dc.render("production"), "HTTPRoute", "pagellm")["spec"])


def test_canary_overrides_only_the_canary():
    docs = dc.render("all-options")
    assert server_container(docs)["image"] == "pagellm@sha256:" + "0" * 64
    assert server_container(docs, "pagellm-canary")["image"] == "pagellm:0.1.1-cuda13.0"
    assert "max-num-seqs: 64" in find(docs, "ConfigMap", "pagellm-config")["data"]["config.yaml"]
    assert "max-num-seqs: 32" in find(docs, "ConfigMap", "pagellm-canary-config")["data"]["config.yaml"]
    # The HPA owns the stable replica count; the canary keeps its own.
    assert "replicas" not in find(docs, "Deployment", "pagellm")["spec"]
    assert find(docs, "Deployment", "pagellm-canary")["spec"]["replicas"] == 1


def test_config_change_rolls_the_pods():
    def checksum(overrides):
        dc.RENDERINGS["checksum-probe"] = ("default", overrides)
        dc._render.cache_clear()
        try:
            return find(dc.render("checksum-probe"), "Deployment", "pagellm")["spec"]["template"]["metadata"][
                "annotations"]["checksum/config"]
        finally:
            del dc.RENDERINGS["checksum-probe"]
            dc._render.cache_clear()
    assert checksum({}) != checksum({"config": {"max-num-seqs": 8}})


def test_notes_render():
    text = dc.notes("canary")
    assert "rollout status deployment/pagellm-canary" in text and "5% of the route's requests" in text


def test_values_outside_the_schema_are_refused():
    from helm_python.errors import HelmError
    values = copy.deepcopy(dc.values_for("default"))
    values["replicas"] = 3  # misspelt replicaCount
    with pytest.raises(HelmError, match="replicas"):
        dc.chart().render(values=values, name=dc.RELEASE, namespace=dc.NAMESPACE)


def test_a_library_missing_from_an_image_is_caught(tmp_path, monkeypatch):
    copies = []
    for f in dc.DOCKERFILES:
        copy_ = tmp_path / f.name
        copy_.write_text(f.read_text().replace(" libyaml-cpp-dev", ""))
        copies.append(copy_)
    monkeypatch.setattr(dc, "DOCKERFILES", copies)
    errors = dc.images_build_what_setup_installs()
    assert len(errors) == 2 and all("does not install libyaml-cpp-dev" in e for e in errors), errors


def test_two_model_volumes_are_refused():
    from helm_python.errors import HelmError
    values = dc.merge(dc.values_for("default"), {"model": {"hostPath": "/srv/models"}})
    with pytest.raises(HelmError, match="set one of model.persistentVolumeClaim and model.hostPath"):
        dc.chart().render(values=values, name=dc.RELEASE, namespace=dc.NAMESPACE)
