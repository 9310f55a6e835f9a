"""deploy/ is checked, not just shipped: YAML lint, Kubernetes schemas, `nginx -t`, and every metric the
alerts, dashboard and KEDA queries name exists in the gateway."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import yaml
from yamllint import config as yamllint_config
from yamllint import linter

from gateway.ops.metrics import GatewayMetrics, LeanCounter, LeanHistogram
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.33.0"
LINT = yamllint_config.YamlLintConfig("extends: default\nrules: {line-length: {max: 120}, document-start: disable, "
                                      "truthy: {check-keys: false}, comments: {min-spaces-from-content: 1}, "
                                      "braces: {max-spaces-inside: 1}, brackets: {max-spaces-inside: 1}}")


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def test_every_yaml_file_lints_clean() -> None:
    problems = [f"{path.relative_to(ROOT)}:{p.line}: {p.desc}" for path in yaml_files()
                for p in linter.run(path.read_text(), LINT) if p.level == "error"]
    assert problems == []


def test_kubernetes_manifests_match_the_schemas() -> None:
    checked = 0
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None or doc["apiVersion"].startswith("keda.sh/"):
                continue  # a custom resource: checked below
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            checked += 1
    assert checked >= 10


def test_keda_scales_the_worker_deployment_on_the_gateways_signal() -> None:
    keda = yaml.safe_load((DEPLOY / "kubernetes" / "keda.yaml").read_text())
    workers = [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "workers.yaml").read_text())
               if d["kind"] == "Deployment"]
    assert keda["kind"] == "ScaledObject" and keda["spec"]["scaleTargetRef"]["name"] == workers[0]["metadata"]["name"]
    queries = [t["metadata"]["query"] for t in keda["spec"]["triggers"]]
    assert any("tollgate_scale_desired_workers" in q for q in queries)
    behaviour = keda["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behaviour["scaleDown"]["stabilizationWindowSeconds"] == 300  # the sources' cooldown


def exported_names() -> set[str]:
    names = set()
    for family in GatewayMetrics().registry.collect():
        base = family.name
        names |= {base, base + "_total", base + "_bucket", base + "_sum", base + "_count"}
    return names


def test_alerts_dashboard_and_keda_name_only_metrics_the_gateway_exports() -> None:
    known = exported_names()
    texts = [(DEPLOY / "prometheus" / "alerts.yml").read_text(), (DEPLOY / "grafana" / "tollgate.json").read_text(),
             (DEPLOY / "kubernetes" / "keda.yaml").read_text()]
    used = {m for text in texts for m in re.findall(r"\btollgate_[a-z0-9_]+", text)}
    assert used and used <= known, sorted(used - known)
    rules = yaml.safe_load(texts[0])
    assert {r["alert"] for g in rules["groups"] for r in g["rules"]} >= {"TollgatePremiumTTFTp95", "TollgateErrorRate"}
    assert len(json.loads(texts[1])["panels"]) >= 8


def test_the_dashboard_has_the_operators_panels_and_tenant_and_model_variables() -> None:
    board = json.loads((DEPLOY / "grafana" / "tollgate.json").read_text())
    titles = " | ".join(p["title"] for p in board["panels"])
    for wanted in ("Request rate", "Error rate", "Worker health", "Tokens per second", "GPU busy and idle"):
        assert wanted in titles, (wanted, titles)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"tenant", "model"} <= set(variables)
    labels_of = {m._name: set(m._labelnames) for m in vars(GatewayMetrics()).values() if hasattr(m, "_labelnames")}
    labels_of.update({m.name: set(m.labelnames) for m in vars(GatewayMetrics()).values()
                      if isinstance(m, LeanCounter | LeanHistogram)})  # the families every request writes
    assert "model" in labels_of["tollgate_requests"] and "tenant" in labels_of["tollgate_cost_usd"]
    for panel in board["panels"]:
        for target in panel["targets"]:
            for name, labels in re.findall(r"\b(tollgate_[a-z0-9_]+)(\{[^}]*\})?", target["expr"]):
                base = re.sub(r"_(bucket|total|sum|count)$", "", name)
                for label in ("model", "tenant"):  # each panel follows the dashboard's tenant and model choice
                    if label in labels_of.get(base, labels_of.get(name, set())):
                        assert f'{label}=~"${label}"' in labels, (panel["title"], target["expr"])


def test_compose_nginx_conf_is_the_generated_copy() -> None:
    source = (DEPLOY / "nginx" / "tollgate.conf").read_text()
    expected = source.replace("server 127.0.0.1:8081", "server gateway-1:8081").replace(
        "server 127.0.0.1:8082", "server gateway-2:8082")
    copy = (DEPLOY / "nginx" / "compose.conf").read_text()
    assert copy.split("\n", 1)[1] == expected


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    assert found, "nginx is needed (.ci/run installs it from Debian)"
    return found


def test_nginx_accepts_the_conf(tmp_path: Path) -> None:
    nginx = nginx_binary()
    main = tmp_path / "nginx.conf"
    main.write_text(f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
                    f"http {{\n  access_log off;\n  client_body_temp_path {tmp_path}/body;\n"
                    f"  proxy_temp_path {tmp_path}/proxy;\n  include {DEPLOY / 'nginx' / 'tollgate.conf'};\n}}\n")
    done = subprocess.run([nginx, "-t", "-c", str(main), "-p", str(tmp_path)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert "test is successful" in done.stderr
