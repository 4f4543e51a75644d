"""Checks of the deployment files: docker/, deploy/kubernetes/ and the Helm chart deploy/helm/pagellm.

    python tests/deploy/deploy_check.py          every check, one line each, then a summary

scripts/check-deploy.sh runs this after installing the pinned tools of scripts/requirements-deploy.txt
into .venv; tests/deploy/test_deploy_files.py runs the same checks one pytest test each. The checks:

- hadolint on the Dockerfiles, shellcheck on the shell scripts, yamllint on the YAML under deploy/;
- `helm lint --strict` and `helm template` of the chart for each stage (STAGES) and option set
  (VARIANTS), with Helm's own engine (helm-python-sdk), values checked against values.schema.json;
- every rendered object and every plain manifest against the Kubernetes JSON schemas of the oldest
  and newest Kubernetes versions supported (kubernetes-validate, strict: unknown fields fail), and
  the custom resources against deploy/schemas/;
- the objects against each other: what each selector, reference and port points at exists, the
  InferencePool of one track never selects the pods of another, route weights add up, the grace
  period covers preStop + drain, probe budgets, the API key comes from a Secret, and every metric
  the endpoint picker or an alert reads is one pagellm exports (src/server/metrics.cpp).
"""
from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the tools are installed beside the interpreter (.venv/bin)
CHART = ROOT / "deploy" / "helm" / "pagellm"
PLAIN = ROOT / "deploy" / "kubernetes"
SCHEMAS = ROOT / "deploy" / "schemas"
DOCKERFILES = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.cpu"]
SHELL_SCRIPTS = [ROOT / "docker" / "entrypoint.sh", ROOT / "scripts" / "check-deploy.sh"]
METRICS_SOURCE = ROOT / "src" / "server" / "metrics.cpp"
RELEASE, NAMESPACE = "pagellm", "llm"
# Oldest Kubernetes the manifests support (native preStop sleep), newest kubernetes-validate knows.
K8S_VERSIONS = ("1.30.0", "1.37.0")

# Stage -> values files layered on values.yaml, in `helm -f` order.
STAGES = {
    "default": [],
    "staging": ["values-staging.yaml"],
    "production": ["values-production.yaml"],
    "canary": ["values-production.yaml", "values-canary.yaml"],
}
# The chart's other options, each rendered on top of a stage: (stage, --set style overrides).
VARIANTS = {
    "canary-services": ("canary", {"inferencePool": {"enabled": False}}),
    "inference-v1alpha2": ("canary", {"inferencePool": {"apiVersion": "inference.networking.x-k8s.io/v1alpha2"}}),
    "all-options": ("production", {
        "autoscaling": {"enabled": True},
        "image": {"digest": "sha256:" + "0" * 64},
        "model": {"persistentVolumeClaim": "", "hostPath": "/srv/models"},
        "apiKey": {"existingSecret": ""},
        "tracing": {"otlpTracesEndpoint": "http://otel-collector.observability:4318/v1/traces"},
        "extraEnv": [{"name": "PAGELLM_MAX_WAITING", "value": "256"}],
        "inferencePool": {"objective": {"enabled": True, "priority": 10}},
        "epp": {"pluginsConfig": "apiVersion: inference.networking.x-k8s.io/v1alpha1\n"
                                 "kind: EndpointPickerConfig\n"},
        "route": {"hostnames": ["llm.internal"]},
        "canary": {"enabled": True, "weight": 20, "image": {"tag": "0.1.1-cuda13.0"},
                   "config": {"max-num-seqs": 32}},
    }),
}
# deploy/kubernetes/ is this rendering, written out (plain_matches_chart checks it).
VARIANTS["plain-equivalent"] = ("default", {"serviceMonitor": {"enabled": True}})
RENDERINGS = {**{s: (s, {}) for s in STAGES}, **VARIANTS}

CRD_SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-v1.json",
    ("inference.networking.x-k8s.io/v1alpha2", "InferencePool"): "inferencepool-v1alpha2.json",
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceModel"): "inferencemodel-v1alpha2.json",
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"): "inferenceobjective-v1alpha2.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-v1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-v1.json",
}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


class ToolMissing(Exception):
    pass


def tool(name):
    path = BIN / name
    if not path.exists():
        raise ToolMissing(f"{name} is not installed beside {sys.executable}: run scripts/check-deploy.sh "
                          "(it installs scripts/requirements-deploy.txt into .venv)")
    return str(path)


def run(cmd):
    """(exit status, stdout + stderr) of a command run from the repository root."""
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    return p.returncode, (p.stdout + p.stderr).strip()


def rel(path):
    path = Path(path)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# --- linters -------------------------------------------------------------------------------------

def hadolint(dockerfile):
    rc, out = run([tool("hadolint"), "--no-color", "--config", "docker/hadolint.yaml", rel(dockerfile)])
    return [] if rc == 0 else out.splitlines() or [f"hadolint exited {rc}"]


def shellcheck(script):
    rc, out = run([tool("shellcheck"), "--format=gcc", rel(script)])
    return [] if rc == 0 else out.splitlines() or [f"shellcheck exited {rc}"]


def yaml_files():
    return sorted(PLAIN.glob("*.yaml")) + sorted(CHART.glob("*.yaml")) + [ROOT / "deploy" / "yamllint.yaml",
                                                                        ROOT / "docker" / "hadolint.yaml"]


def yamllint():
    rc, out = run([tool("yamllint"), "--strict", "-f", "parsable", "-c", "deploy/yamllint.yaml",
                   *[rel(p) for p in yaml_files()]])
    return [] if rc == 0 else out.splitlines() or [f"yamllint exited {rc}"]


# scripts/setup.sh's packages the images do not build with (tests, benchmarks, fuzzing, tooling),
# and the Ubuntu 24.04 names of Debian 12 packages (docker/Dockerfile's build stage).
SETUP_ONLY = {"git", "python3-venv", "libgtest-dev", "libgmock-dev", "libbenchmark-dev", "clang-14",
              "libclang-rt-14-dev"}
UBUNTU_NAMES = {"libboost1.74-dev": "libboost1.83-dev"}


def build_packages(dockerfile):
    """The packages the first (build) stage's apt-get install names."""
    build_stage = dockerfile.read_text().split("\nFROM ")[1]
    text = build_stage.split("apt-get install", 1)[1].split("&&", 1)[0].replace("\\\n", " ")
    return {w for w in text.split() if not w.startswith("-")}


def images_build_what_setup_installs():
    """Every library scripts/setup.sh installs for the build is installed by both images' build
    stages: a library added to the build without the images fails here, not in an image build."""
    m = re.search(r"^pkgs=\(([^)]*)\)", (ROOT / "scripts" / "setup.sh").read_text(), re.M)
    if not m:
        return ["scripts/setup.sh: no pkgs=(...) list"]
    needed = set(m.group(1).split()) - SETUP_ONLY
    errors = []
    for dockerfile, names in ((DOCKERFILES[1], {}), (DOCKERFILES[0], UBUNTU_NAMES)):
        have = build_packages(dockerfile)
        for pkg in sorted(needed):
            if names.get(pkg, pkg) not in have:
                errors.append(f"{rel(dockerfile)}: the build stage does not install {names.get(pkg, pkg)} "
                              f"(scripts/setup.sh installs {pkg})")
    return errors


def versions_agree():
    """The version in CMakeLists.txt's project() is the images' label default, the chart's
    appVersion and the start of every pagellm image tag the manifests name."""
    m = re.search(r"project\(pagellm VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text())
    version = m.group(1) if m else None
    errors = [] if version else ["CMakeLists.txt: no project(pagellm VERSION ...)"]
    for f in DOCKERFILES:
        if f"ARG PAGELLM_VERSION={version}\n" not in f.read_text():
            errors.append(f"{rel(f)}: PAGELLM_VERSION is not {version}")
    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    if chart_meta["appVersion"] != version:
        errors.append(f"Chart.yaml: appVersion {chart_meta['appVersion']} is not {version}")
    tags = [yaml.safe_load((CHART / "values.yaml").read_text())["image"]["tag"]]
    tags += [i["newTag"] for i in yaml.safe_load((PLAIN / "kustomization.yaml").read_text())["images"]]
    tags += [c["image"].split(":")[1] for _, d in plain_manifests() for c in containers(d)
             if c["image"].startswith("pagellm:")]
    errors += [f"image tag {t} is not of version {version}" for t in tags if not t.startswith(f"{version}-")]
    return errors


# --- the chart -----------------------------------------------------------------------------------

def merge(base, over):
    """Deep merge as `helm -f a -f b` does: maps merge key by key, anything else is replaced."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def values_for(rendering):
    stage, overrides = RENDERINGS[rendering]
    values = {}
    for name in STAGES[stage]:
        values = merge(values, yaml.safe_load((CHART / name).read_text()) or {})
    return merge(values, overrides)


@lru_cache(maxsize=None)
def chart():
    from helm_python import Chart  # installed by scripts/check-deploy.sh
    return Chart.load(str(CHART))


def helm_lint(rendering):
    from helm_python import lint
    report = lint(str(CHART), values_for(rendering), strict=True, namespace=NAMESPACE,
                  kube_version="v" + K8S_VERSIONS[0])
    # Severity 1 is informational (e.g. "icon is recommended"); warnings and errors fail.
    errors = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2]
    return errors + list(report.get("errors") or [])


@lru_cache(maxsize=None)
def _render(rendering):
    values = values_for(rendering)
    chart().validate_schema(values)
    manifests = chart().render(values=values, name=RELEASE, namespace=NAMESPACE)
    docs = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append((f"{rendering}:{path.split('/', 1)[1]}", doc))
    return docs, manifests.get("pagellm/templates/NOTES.txt", "")


def render(rendering):
    """[(source, object)] of the chart rendered for a stage or variant."""
    return copy.deepcopy(_render(rendering)[0])


def notes(rendering):
    return _render(rendering)[1]


def plain_manifests():
    docs = []
    for path in sorted(PLAIN.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((rel(path), doc))
    return docs


def kustomization():
    k = yaml.safe_load((PLAIN / "kustomization.yaml").read_text())
    errors = [f"kustomization.yaml: resource {r} does not exist" for r in k.get("resources", [])
              if not (PLAIN / r).exists()]
    images = {c["image"].split(":")[0] for _, d in plain_manifests() for c in containers(d)}
    errors += [f"kustomization.yaml: image {i['name']} is used by no container" for i in k.get("images", [])
               if i["name"] not in images]
    return errors


# --- schemas -------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _registry():
    from referencing import Registry, Resource
    resources = [(p.name, Resource.from_contents(json.loads(p.read_text()))) for p in SCHEMAS.glob("*.json")]
    return Registry().with_resources(resources)


def schema_errors(schema_file, instance):
    import jsonschema
    schema = json.loads((SCHEMAS / schema_file).read_text())
    validator = jsonschema.Draft202012Validator(schema, registry=_registry())
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))]


def kind_name(doc):
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def validate_objects(docs):
    """Each object against its schema, for each Kubernetes version; metadata and pod-template labels
    against objectmeta.json."""
    import kubernetes_validate
    errors = []
    for source, doc in docs:
        where = f"{source}: {kind_name(doc)}"
        key = (doc.get("apiVersion"), doc.get("kind"))
        for e in schema_errors("objectmeta.json", doc.get("metadata", {})):
            errors.append(f"{where}: metadata.{e}")
        if doc.get("kind") in WORKLOADS:
            template_meta = doc.get("spec", {}).get("template", {}).get("metadata", {})
            for e in schema_errors("objectmeta.json", {"name": "template", **template_meta}):
                errors.append(f"{where}: spec.template.metadata.{e}")
        if key in CRD_SCHEMAS:
            errors += [f"{where}: {e}" for e in schema_errors(CRD_SCHEMAS[key], doc)]
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path) or "(root)"
                errors.append(f"{where}: Kubernetes {version}: {path}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError:
                errors.append(f"{where}: no schema for {key[0]} {key[1]} (Kubernetes {version}, deploy/schemas)")
    return errors


# --- the objects against each other ----------------------------------------------------------------

@lru_cache(maxsize=None)
def _metric_literals():
    return frozenset(re.findall(r'"((?:vllm|pagellm):[a-z0-9_]+)"', METRICS_SOURCE.read_text()))


def exported(metric):
    """Whether pagellm exports this series name: a metric named in src/server/metrics.cpp, or a
    histogram's _bucket, _sum or _count series. (tests/deploy/test_pagellm_contract.py checks the
    same names against a running server's /metrics, exactly.)"""
    base = re.sub(r"_(bucket|sum|count)$", "", metric)
    return metric in _metric_literals() or base in _metric_literals()


def containers(doc):
    spec = doc.get("spec", {}).get("template", {}).get("spec", {}) if doc.get("kind") in WORKLOADS else {}
    return spec.get("containers", [])


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_labels(doc):
    return doc["spec"]["template"]["metadata"].get("labels", {})


def arg_flags(container):
    """--name=value flags of a container, {name: value}."""
    flags = {}
    for a in container.get("args", []):
        m = re.match(r"--([a-z0-9-]+)(?:=(.*))?$", a)
        if m:
            flags[m.group(1)] = m.group(2)
    return flags


def consistency(docs):
    errors = []
    objs = {}
    for source, doc in docs:
        key = (doc["kind"], doc["metadata"]["name"])
        if key in objs:
            errors.append(f"{source}: {kind_name(doc)} is defined twice")
        objs[key] = doc
    by_kind = lambda kind: [d for (k, _), d in objs.items() if k == kind]  # noqa: E731
    deployments = by_kind("Deployment")
    servers = [d for d in deployments if pod_labels(d).get("app.kubernetes.io/component") == "server"]
    pickers = [d for d in deployments if pod_labels(d).get("app.kubernetes.io/component") == "endpoint-picker"]
    configmaps = {d["metadata"]["name"]: d for d in by_kind("ConfigMap")}
    services = {d["metadata"]["name"]: d for d in by_kind("Service")}

    for d in deployments:
        name = kind_name(d)
        if not matches(d["spec"]["selector"].get("matchLabels"), pod_labels(d)):
            errors.append(f"{name}: its selector does not match its own pod labels")
    for d in servers:
        name = kind_name(d)
        pod = d["spec"]["template"]["spec"]
        c = pod["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        config = {}
        for v in pod.get("volumes", []):
            if "configMap" in v:
                cm = configmaps.get(v["configMap"]["name"])
                if cm is None:
                    errors.append(f"{name}: ConfigMap {v['configMap']['name']} does not exist")
                else:
                    config = yaml.safe_load(cm["data"]["config.yaml"])
        if not config:
            errors.append(f"{name}: no --config file mounted")
        if config.get("port") != ports.get("http"):
            errors.append(f"{name}: config port {config.get('port')} is not the container port {ports.get('http')}")
        if config.get("host") != "0.0.0.0":
            errors.append(f"{name}: config host {config.get('host')!r} is unreachable from outside the pod")
        pre_stop = c.get("lifecycle", {}).get("preStop", {})
        sleep = pre_stop.get("sleep", {}).get("seconds")
        if not sleep:
            errors.append(f"{name}: no preStop sleep: the drain would start before endpoints drop the pod")
        drain = float(config.get("drain-timeout", 30))
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if grace < (sleep or 0) + drain + 5:
            errors.append(f"{name}: terminationGracePeriodSeconds {grace} < preStop {sleep} + drain-timeout {drain} + 5")
        probes = {k: c.get(k + "Probe") for k in ("startup", "readiness", "liveness")}
        for kind, path in (("startup", "/health"), ("readiness", "/health"), ("liveness", "/ping")):
            p = probes[kind]
            if not p or p.get("httpGet", {}).get("path") != path:
                errors.append(f"{name}: {kind} probe is not an HTTP GET of {path}")
        if probes["startup"]:
            budget = probes["startup"]["periodSeconds"] * probes["startup"]["failureThreshold"]
            if budget < 600:
                errors.append(f"{name}: startup probe allows {budget} s for the model load (< 600 s)")
            if d["spec"].get("progressDeadlineSeconds", 600) <= budget:
                errors.append(f"{name}: progressDeadlineSeconds is within the startup probe's {budget} s")
        if probes["liveness"]:
            patience = probes["liveness"]["periodSeconds"] * probes["liveness"]["failureThreshold"]
            if patience < 60:
                errors.append(f"{name}: liveness probe restarts after {patience} s (< 60 s)")
        rolling = d["spec"].get("strategy", {}).get("rollingUpdate", {})
        if rolling.get("maxUnavailable") != 0 or not rolling.get("maxSurge"):
            errors.append(f"{name}: rolling updates must add a pod before removing one (maxUnavailable 0)")
        for env in c.get("env", []):
            if env["name"] == "PAGELLM_API_KEY" and "secretKeyRef" not in env.get("valueFrom", {}):
                errors.append(f"{name}: PAGELLM_API_KEY must come from a Secret (secretKeyRef)")
        res = c.get("resources", {})
        gpu_req = res.get("requests", {}).get("nvidia.com/gpu")
        if gpu_req != res.get("limits", {}).get("nvidia.com/gpu"):
            errors.append(f"{name}: nvidia.com/gpu requests and limits differ")
        for m in c.get("volumeMounts", []):
            if m["name"] == "models" and not m.get("readOnly"):
                errors.append(f"{name}: the models volume is not mounted read-only")
        if not any(e["name"] == "PAGELLM_MODEL" for e in c.get("env", [])) and "model" not in config:
            errors.append(f"{name}: no model (PAGELLM_MODEL or the config's model key)")

    for s in by_kind("Service"):
        sel = s["spec"].get("selector", {})
        targets = [d for d in deployments if matches(sel, pod_labels(d))]
        if not targets:
            errors.append(f"{kind_name(s)}: selects no pods")
        for port in s["spec"]["ports"]:
            for d in targets:
                names = {p.get("name") for c in containers(d) for p in c.get("ports", [])}
                if isinstance(port["targetPort"], str) and port["targetPort"] not in names:
                    errors.append(f"{kind_name(s)}: targetPort {port['targetPort']} is not a port of {kind_name(d)}")
    for p in by_kind("PodDisruptionBudget"):
        if not [d for d in deployments if matches(p["spec"]["selector"]["matchLabels"], pod_labels(d))]:
            errors.append(f"{kind_name(p)}: selects no pods")

    pools = by_kind("InferencePool")
    for pool in pools:
        name = kind_name(pool)
        group = pool["apiVersion"].split("/")[0]
        spec = pool["spec"]
        if "matchLabels" in spec["selector"]:
            selector, port = spec["selector"]["matchLabels"], spec["targetPorts"][0]["number"]
            epp_ref = spec["endpointPickerRef"]
            epp_port = epp_ref.get("port", {}).get("number", 9002)
        else:
            selector, port = spec["selector"], spec["targetPortNumber"]
            epp_ref = spec["extensionRef"]
            epp_port = epp_ref.get("portNumber", 9002)
        selected = [d for d in deployments if matches(selector, pod_labels(d))]
        if len(selected) != 1 or selected[0] not in servers:
            errors.append(f"{name}: selects {len(selected)} Deployments' pods, not one server track: "
                          f"{[kind_name(d) for d in selected]}")
        for d in selected:
            ports = [p["containerPort"] for c in containers(d) for p in c.get("ports", [])]
            if port not in ports:
                errors.append(f"{name}: target port {port} is not a port of {kind_name(d)}")
        svc = services.get(epp_ref["name"])
        if svc is None:
            errors.append(f"{name}: endpoint picker Service {epp_ref['name']} does not exist")
            continue
        if epp_port not in [p["port"] for p in svc["spec"]["ports"]]:
            errors.append(f"{name}: endpoint picker Service {epp_ref['name']} has no port {epp_port}")
        epps = [d for d in pickers if matches(svc["spec"]["selector"], pod_labels(d))]
        if len(epps) != 1:
            errors.append(f"{name}: Service {epp_ref['name']} selects {len(epps)} endpoint pickers")
            continue
        flags = arg_flags(epps[0]["spec"]["template"]["spec"]["containers"][0])
        if flags.get("pool-name") != pool["metadata"]["name"] or flags.get("pool-group") != group:
            errors.append(f"{name}: its endpoint picker watches pool {flags.get('pool-name')} "
                          f"of group {flags.get('pool-group')}")
        for flag in ("total-queued-requests-metric", "total-running-requests-metric",
                     "kv-cache-usage-percentage-metric", "lora-info-metric", "cache-info-metric"):
            metric = (flags.get(flag) or "").split("{")[0]
            if metric and not exported(metric):
                errors.append(f"{name}: the endpoint picker reads {metric} (--{flag}), which pagellm does not export")
        errors += rbac_errors(objs, epps[0], group)

    for route in by_kind("HTTPRoute"):
        for rule in route["spec"].get("rules", []):
            refs = rule.get("backendRefs", [])
            for ref in refs:
                kind = ref.get("kind", "Service")
                target = objs.get((kind, ref["name"]))
                if target is None:
                    errors.append(f"{kind_name(route)}: backend {kind}/{ref['name']} does not exist")
                elif kind == "InferencePool" and ref.get("group") != target["apiVersion"].split("/")[0]:
                    errors.append(f"{kind_name(route)}: backend {ref['name']} has group {ref.get('group')}, "
                                  f"the pool {target['apiVersion']}")
                elif kind == "Service" and ref.get("port") not in [p["port"] for p in target["spec"]["ports"]]:
                    errors.append(f"{kind_name(route)}: Service {ref['name']} has no port {ref.get('port')}")
            if len(refs) > 1 and sum(r.get("weight", 1) for r in refs) != 100:
                errors.append(f"{kind_name(route)}: backend weights add up to "
                              f"{sum(r.get('weight', 1) for r in refs)}, not 100 (percent)")
    for sm in by_kind("ServiceMonitor"):
        sel = sm["spec"]["selector"].get("matchLabels", {})
        selected = [s for s in by_kind("Service") if matches(sel, s["metadata"].get("labels", {}))]
        if not selected:
            errors.append(f"{kind_name(sm)}: selects no Service")
        for ep in sm["spec"].get("endpoints", []):
            for s in selected:
                if ep.get("port") not in [p.get("name") for p in s["spec"]["ports"]]:
                    errors.append(f"{kind_name(sm)}: Service {s['metadata']['name']} has no port {ep.get('port')}")
    track_label = any("pagellm/track" in sm["spec"].get("podTargetLabels", []) for sm in by_kind("ServiceMonitor"))
    for rule_obj in by_kind("PrometheusRule"):
        for group in rule_obj["spec"]["groups"]:
            for r in group["rules"]:
                expr = str(r["expr"])
                for metric in re.findall(r"\b((?:vllm|pagellm):[a-z0-9_]+)", expr):
                    if not exported(metric):
                        errors.append(f"{kind_name(rule_obj)}: {r.get('alert')} reads {metric}, "
                                      "which pagellm does not export")
                if "pagellm_track" in expr and not track_label:
                    errors.append(f"{kind_name(rule_obj)}: {r.get('alert')} groups by pagellm_track, "
                                  "which no ServiceMonitor adds")
    return errors


def rbac_errors(objs, epp, group):
    """The endpoint picker's ServiceAccount may list and watch its pool and the pods."""
    sa = epp["spec"]["template"]["spec"].get("serviceAccountName")
    if ("ServiceAccount", sa) not in objs:
        return [f"{kind_name(epp)}: ServiceAccount {sa} does not exist"]
    allowed = set()
    for (kind, _), rb in objs.items():
        if kind != "RoleBinding" or not any(s.get("name") == sa for s in rb.get("subjects", [])):
            continue
        role = objs.get(("Role", rb["roleRef"]["name"]))
        for rule in (role or {}).get("rules", []):
            for g in rule["apiGroups"]:
                for res in rule["resources"]:
                    if {"list", "watch"} <= set(rule["verbs"]):
                        allowed.add((g, res))
    needed = {(group, "inferencepools"), ("", "pods")}
    return [f"{kind_name(epp)}: ServiceAccount {sa} may not list/watch {res} ({g or 'core'})"
            for g, res in sorted(needed - allowed)]


def plain_matches_chart():
    """deploy/kubernetes and the chart's equivalent rendering agree on what matters at run time."""
    plain = {(d["kind"], d["metadata"]["name"]): d for _, d in plain_manifests()}
    chart_objs = {(d["kind"], d["metadata"]["name"]): d for _, d in render("plain-equivalent")}
    errors = []
    for key in sorted(plain):
        if key[0] in ("PersistentVolumeClaim",):
            continue
        if key not in chart_objs:
            errors.append(f"{key[0]}/{key[1]} is in deploy/kubernetes but not in the chart's default rendering")
            continue
        a, b = plain[key], chart_objs[key]
        if key[0] == "ConfigMap":
            if yaml.safe_load(a["data"]["config.yaml"]) != yaml.safe_load(b["data"]["config.yaml"]):
                errors.append(f"ConfigMap/{key[1]}: the config files differ")
        if key[0] == "Role" and a["rules"] != b["rules"]:
            errors.append(f"Role/{key[1]}: rules differ")
        if key[0] == "Deployment":
            pa, pb = a["spec"]["template"]["spec"], b["spec"]["template"]["spec"]
            for field in ("terminationGracePeriodSeconds", "securityContext", "tolerations"):
                if pa.get(field) != pb.get(field):
                    errors.append(f"Deployment/{key[1]}: {field} differs")
            if a["spec"].get("progressDeadlineSeconds") != b["spec"].get("progressDeadlineSeconds"):
                errors.append(f"Deployment/{key[1]}: progressDeadlineSeconds differs")
            ca, cb = pa["containers"][0], pb["containers"][0]
            for field in ("args", "env", "ports", "startupProbe", "readinessProbe", "livenessProbe", "lifecycle",
                          "image", "resources", "securityContext", "volumeMounts"):
                if ca.get(field) != cb.get(field):
                    errors.append(f"Deployment/{key[1]}: container {field} differs")
            if a["spec"].get("strategy") != b["spec"].get("strategy"):
                errors.append(f"Deployment/{key[1]}: strategy differs")
        if key[0] in ("Service", "InferencePool", "HTTPRoute", "ServiceMonitor", "PodDisruptionBudget"):
            if a["spec"] != b["spec"]:
                errors.append(f"{key[0]}/{key[1]}: spec differs")
    return errors


# --- all checks ----------------------------------------------------------------------------------

def checks():
    """[(name, function returning a list of errors)]."""
    out = [(f"hadolint {rel(f)}", lambda f=f: hadolint(f)) for f in DOCKERFILES]
    out += [(f"shellcheck {rel(f)}", lambda f=f: shellcheck(f)) for f in SHELL_SCRIPTS]
    out.append(("yamllint deploy", yamllint))
    out.append(("images build what scripts/setup.sh installs", images_build_what_setup_installs))
    out.append(("versions agree", versions_agree))
    out.append(("kustomization deploy/kubernetes", kustomization))
    out.append(("schemas deploy/kubernetes", lambda: validate_objects(plain_manifests())))
    out.append(("consistency deploy/kubernetes", lambda: consistency(plain_manifests())))
    for r in RENDERINGS:
        out.append((f"helm lint {r}", lambda r=r: helm_lint(r)))
        out.append((f"schemas chart {r}", lambda r=r: validate_objects(render(r))))
        out.append((f"consistency chart {r}", lambda r=r: consistency(render(r))))
    out.append(("deploy/kubernetes = chart defaults", plain_matches_chart))
    return out


def main():
    passed = failed = 0
    for name, fn in checks():
        try:
            errors = fn()
        except ToolMissing as e:
            errors = [str(e)]
        except Exception as e:  # a render failure is a failed check, not a crash
            errors = [f"{type(e).__name__}: {e}"]
        if errors:
            failed += 1
            print(f"FAIL {name}")
            for e in errors:
                print(f"     {e}")
        else:
            passed += 1
            print(f"ok   {name}")
    print(f"deploy checks: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
