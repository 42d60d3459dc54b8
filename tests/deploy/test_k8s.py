"""k8s/: both overlays render with `kubectl kustomize`, every object validates against the Kubernetes
schemas (offline, strict), and what matters holds: each container's arguments and environment are
accepted by the real CLI, probes and Services point at the ports the services listen on, the router
reaches every worker of its pool, only routers reach workers and the profiler, the gateway reaches the
routers and nothing else, nothing runs as root, and the a100 overlay puts each worker on an A100 of its
own."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import kubernetes_validate
import pytest

from tests.deploy.commands import (REPO_ROOT, ServiceCommand, host_of, listens_everywhere, parse_serve, port_of,
                                   repo_path_of_image_path)
from tests.deploy.kustomize import (K8S, OVERLAYS, by_kind, component, container_env, matches, pod_labels,
                                    read_yaml, relative_overlay, render)

# The oldest Kubernetes these manifests are for (native gRPC probes are GA from 1.27) and the newest
# whose schemas kubernetes-validate carries.
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
DEMO_POOL = REPO_ROOT / "models" / "demo-pool"
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


@dataclass
class Container:
    deployment: dict
    spec: dict
    command: ServiceCommand

    @property
    def name(self) -> str:
        return self.deployment["metadata"]["name"]

    @property
    def pod(self) -> dict:
        return self.deployment["spec"]["template"]["spec"]

    def mount_of(self, path: Path) -> dict:
        """The volume mount that holds `path`, and the volume it mounts."""
        mounts = [m for m in self.spec.get("volumeMounts", [])
                  if PurePosixPath(path).is_relative_to(PurePosixPath(m["mountPath"]))]
        assert mounts, f"{self.name}: nothing is mounted at {path}"
        mount = max(mounts, key=lambda m: len(m["mountPath"]))
        volume = next(v for v in self.pod["volumes"] if v["name"] == mount["name"])
        return {**mount, "volume": volume}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {overlay: render(K8S / "overlays" / overlay) for overlay in OVERLAYS}


def specrouter_containers(objects: list[dict]) -> list[Container]:
    """Every SpecRouter container, its arguments and environment parsed as its service's main would."""
    found = []
    for d in by_kind(objects, "Deployment").values():
        for c in d["spec"]["template"]["spec"]["containers"]:
            if "/specrouter" in c["image"] or c["image"].startswith("specrouter"):
                assert "command" not in c, f"{d['metadata']['name']}: the image's entrypoint is `specrouter`"
                found.append(Container(d, c, parse_serve(c["args"], container_env(c, objects))))
    return found


def of(containers: list[Container], service: str) -> list[Container]:
    return [c for c in containers if c.command.service == service]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request, rendered) -> tuple[str, list[dict], list[Container]]:
    objects = rendered[request.param]
    return request.param, objects, specrouter_containers(objects)


def test_overlays_render_the_whole_deployment(overlay):
    name, objects, containers = overlay
    kinds = {"Namespace", "ConfigMap", "Secret", "Deployment", "Service", "HorizontalPodAutoscaler",
             "PodDisruptionBudget", "NetworkPolicy"} | ({"PersistentVolumeClaim"} if name == "a100" else set())
    assert {o["kind"] for o in objects} == kinds
    assert {o["metadata"].get("namespace", "specrouter") for o in objects} == {"specrouter"}
    assert sorted(c.command.service for c in containers) == ["gateway", "profiler", "router", "worker", "worker",
                                                             "worker"]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_validates_against_the_kubernetes_schemas(overlay, version):
    _, objects, _ = overlay
    failures = []
    for o in objects:
        try:
            kubernetes_validate.validate(o, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{o['kind']}/{o['metadata']['name']}: {exc.message}")
    assert not failures, "\n".join(failures)


def test_the_validation_refuses_a_broken_object(rendered):
    """The check above can fail: a misspelt field and a mistyped port are refused."""
    deployment = copy.deepcopy(by_kind(rendered["local"], "Deployment")["router"])
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)
    service = copy.deepcopy(by_kind(rendered["local"], "Service")["router"])
    service["spec"]["ports"][0]["port"] = "fifty"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, VERSIONS[0], strict=True)


def test_services_listen_on_the_ports_their_probes_check(overlay):
    _, _, containers = overlay
    for c in containers:
        settings = c.command.settings
        assert listens_everywhere(settings.host), f"{c.name} listens on {settings.host} only"
        ports = {p["name"]: p["containerPort"] for p in c.spec["ports"]}
        assert ports["metrics"] == settings.metrics_port > 0, c.name
        if c.command.service == "gateway":   # HTTP: ready while its router serves, alive while it listens
            assert ports["http"] == settings.port, c.name
            assert c.spec["readinessProbe"]["httpGet"] == {"path": "/health", "port": settings.port}
            for probe in ("startupProbe", "livenessProbe"):
                assert c.spec[probe]["tcpSocket"] == {"port": settings.port}, f"{c.name}: {probe} {c.spec[probe]}"
            continue
        assert ports["grpc"] == settings.port, c.name
        for probe in PROBES:
            assert c.spec[probe]["grpc"] == {"port": settings.port}, f"{c.name}: {probe} {c.spec[probe]}"


def test_every_service_reaches_pods_on_a_port_they_have(overlay):
    _, objects, _ = overlay
    deployments = by_kind(objects, "Deployment").values()
    for name, service in by_kind(objects, "Service").items():
        selected = [d for d in deployments if matches({"matchLabels": service["spec"]["selector"]}, pod_labels(d))]
        assert len(selected) == 1, f"Service {name} selects {[d['metadata']['name'] for d in selected]}"
        ports = {p.get("name"): p["containerPort"] for c in selected[0]["spec"]["template"]["spec"]["containers"]
                 for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert target in ports or target in ports.values(), f"Service {name}: no container port {target}"


def test_prometheus_scrapes_every_service_where_it_serves_its_metrics(overlay):
    _, _, containers = overlay
    for c in containers:
        annotations = c.deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true", c.name
        assert annotations["prometheus.io/port"] == str(c.command.settings.metrics_port), c.name
        assert annotations["prometheus.io/path"] == "/metrics", c.name


def test_router_reaches_one_headless_service_per_model_of_its_pool(overlay):
    _, objects, containers = overlay
    services = by_kind(objects, "Service")
    [router] = of(containers, "router")
    workers = {w.name: w for w in of(containers, "worker")}
    reached = {}
    for address in router.command.settings.workers:
        service = services[host_of(address)]
        assert service["spec"]["clusterIP"] == "None", f"{host_of(address)} is not headless"
        assert [p["port"] for p in service["spec"]["ports"]] == [port_of(address)]
        [worker] = [w for w in workers.values() if matches({"matchLabels": service["spec"]["selector"]},
                                                            pod_labels(w.deployment))]
        assert worker.command.settings.port == port_of(address)
        reached[worker.command.settings.model_name] = worker
    assert len(reached) == len(workers) == 3, "a router reaches every worker Deployment, one per model"

    # the pool ConfigMap, mounted at the router's --pool-dir, names the same models and target
    mount = router.mount_of(router.command.settings.pool_dir)
    assert mount["mountPath"] == str(router.command.settings.pool_dir)
    pool = json.loads(by_kind(objects, "ConfigMap")[mount["volume"]["configMap"]["name"]]["data"]["pool.json"])
    assert {m["name"]: m["path"] for m in pool["members"]} == {
        name: str(w.command.settings.model_dir) for name, w in reached.items()}
    assert pool["target"] == router.command.settings.target
    assert router.command.settings.tokenizer_dir == reached[pool["target"]].command.settings.model_dir

    [profiler] = of(containers, "profiler")
    profiler_service = services[host_of(router.command.settings.profiler)]
    assert matches({"matchLabels": profiler_service["spec"]["selector"]}, pod_labels(profiler.deployment))
    assert profiler_service["spec"]["ports"][0]["port"] == port_of(router.command.settings.profiler)


def test_profiler_keeps_its_metrics_in_the_clusters_redis(overlay):
    _, objects, containers = overlay
    [profiler] = of(containers, "profiler")
    url = profiler.command.settings.redis_url
    assert url == "redis://redis:6379/0"
    redis = by_kind(objects, "Service")["redis"]
    assert redis["spec"]["ports"][0]["port"] == 6379
    assert matches({"matchLabels": redis["spec"]["selector"]}, pod_labels(by_kind(objects, "Deployment")["redis"]))


def allowed_sources(objects: list[dict], pods: dict) -> tuple[list[dict], set]:
    """The ingress rules that apply to `pods` (a Deployment's), and the ports they open."""
    rules, ports = [], set()
    for policy in by_kind(objects, "NetworkPolicy").values():
        if matches(policy["spec"]["podSelector"], pod_labels(pods)) and "Ingress" in policy["spec"]["policyTypes"]:
            for rule in policy["spec"].get("ingress", []):
                rules.append(rule)
                ports |= {p["port"] for p in rule.get("ports", [])}
    return rules, ports


def test_only_routers_reach_workers_and_the_profiler(overlay):
    """And only Prometheus, from its own namespace, reaches a service's metrics port."""
    _, objects, containers = overlay
    deployments = by_kind(objects, "Deployment")
    deny = by_kind(objects, "NetworkPolicy")["default-deny-ingress"]["spec"]
    assert deny["podSelector"] == {} and deny["policyTypes"] == ["Ingress"] and not deny.get("ingress")
    metrics_ports = {c.name: c.command.settings.metrics_port for c in containers}

    def sources(rule) -> set[str]:
        """The Deployments whose pods a rule admits (all of them for a rule without `from`)."""
        if "from" not in rule:
            return {"*"}
        admitted = set()
        for peer in rule["from"]:
            assert set(peer) == {"podSelector"}, f"a peer from outside the namespace: {peer}"
            admitted |= {n for n, d in deployments.items() if matches(peer["podSelector"], pod_labels(d))}
        return admitted

    def scrape_rule(name: str, rule) -> bool:
        """Whether `rule` opens the metrics port of `name`'s pods; if so it admits Prometheus's namespace alone."""
        ports = {p["port"] for p in rule.get("ports", [])}
        if name not in metrics_ports or metrics_ports[name] not in ports:
            return False
        assert ports == {metrics_ports[name]}, f"{name}: the scrape rule opens {ports}"
        assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
        return True

    expected = {"worker": {"router"}, "profiler": {"router"}, "redis": {"profiler"}}
    for name, d in deployments.items():
        kind = component(d)
        if kind not in expected:
            continue
        rules, ports = allowed_sources(objects, d)
        rules = [r for r in rules if not scrape_rule(name, r)]
        assert rules, f"{name}: no policy admits anything"
        admitted = set().union(*(sources(r) for r in rules))
        assert {component(deployments[a]) for a in admitted} == expected[kind], f"{name} admits {admitted}"
        listening = {c["containerPort"] for c in d["spec"]["template"]["spec"]["containers"][0]["ports"]}
        assert ports == listening, f"{name}: policies open {ports}, the pod listens on {listening}"
    [router] = of(containers, "router")
    rules, ports = allowed_sources(objects, router.deployment)
    assert ports == {router.command.settings.port, router.command.settings.metrics_port}
    assert sum(scrape_rule(router.name, r) for r in rules) == 1
    for c in containers:   # every service's metrics port is open to the scrape
        assert any(scrape_rule(c.name, r) for r in allowed_sources(objects, c.deployment)[0]), c.name


def test_no_pod_runs_as_root_or_writes_its_image(overlay):
    _, objects, _ = overlay
    namespace = by_kind(objects, "Namespace")["specrouter"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for name, d in by_kind(objects, "Deployment").items():
        pod = d["spec"]["template"]["spec"]
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] > 0, name
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert pod["automountServiceAccountToken"] is False, name
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), name
        assert not any("hostPath" in v for v in pod.get("volumes", [])), name
        for c in pod["containers"]:
            s = c["securityContext"]
            assert s["allowPrivilegeEscalation"] is False and s["readOnlyRootFilesystem"] is True, name
            assert s["capabilities"] == {"drop": ["ALL"]} and not s.get("privileged"), name
            assert s.get("runAsUser", 1) > 0, name
            # every writable path is a volume of the pod's own, not the image's filesystem
            writable = [m for m in c.get("volumeMounts", []) if not m.get("readOnly")]
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            assert all("emptyDir" in volumes[m["name"]] for m in writable), name


def test_specrouter_containers_get_a_writable_tmp(overlay):
    """The image puts HOME and every cache under /tmp (Dockerfile)."""
    _, _, containers = overlay
    for c in containers:
        assert "emptyDir" in c.mount_of(Path("/tmp"))["volume"], c.name


def test_every_container_has_requests_and_a_memory_limit(overlay):
    _, objects, _ = overlay
    for name, d in by_kind(objects, "Deployment").items():
        for c in d["spec"]["template"]["spec"]["containers"]:
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), name
            assert "memory" in c["resources"]["limits"], name


def test_traces_go_to_a_collector_under_each_services_name(overlay):
    name, objects, containers = overlay
    names = set()
    for c in containers:
        env = container_env(c.spec, objects)
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == ("http://jaeger:4317" if name == "local" else
                                                      "http://otel-collector.observability.svc:4317"), c.name
        names.add(env["OTEL_SERVICE_NAME"])
        if c.command.service == "worker":
            assert env["OTEL_SERVICE_NAME"] == f"specrouter-worker-{c.command.settings.model_name}"
    assert names == {"specrouter-router", "specrouter-profiler", "specrouter-gateway"} | {
        f"specrouter-worker-{w.command.settings.model_name}" for w in of(containers, "worker")}
    if name == "local":   # the overlay's own Jaeger
        jaeger = by_kind(objects, "Service")["jaeger"]
        assert 4317 in {p["port"] for p in jaeger["spec"]["ports"]}


def test_routers_scale_and_survive_disruptions(overlay):
    _, objects, containers = overlay
    [router] = of(containers, "router")
    hpa = by_kind(objects, "HorizontalPodAutoscaler")["router"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": router.name}
    assert 1 <= hpa["minReplicas"] < hpa["maxReplicas"]
    assert router.spec["resources"]["requests"]["cpu"], "a CPU target needs a CPU request"
    budgets = by_kind(objects, "PodDisruptionBudget")
    selected = {n for n, d in by_kind(objects, "Deployment").items()
                if matches(budgets["router"]["spec"]["selector"], pod_labels(d))}
    assert selected == {router.name}


def test_a100_puts_each_worker_on_an_a100_of_its_own(rendered):
    objects = rendered["a100"]
    containers = specrouter_containers(objects)
    workers = of(containers, "worker")
    assert sorted(w.command.settings.model_name for w in workers) == ["llama-2-7b", "llama-68m", "tinyllama-1.1b"]
    for w in workers:
        settings = w.command.settings
        assert (settings.device, settings.dtype) == ("cuda", "float16"), w.name
        assert w.spec["resources"]["limits"]["nvidia.com/gpu"] == 1, w.name
        assert w.spec["image"].endswith("-cuda"), w.name
        terms = w.pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        for term in terms:   # whichever term a node meets, it is an A100
            [expression] = term["matchExpressions"]
            assert expression["operator"] == "In" and expression["values"], w.name
            assert all("a100" in v.lower() for v in expression["values"]), expression
        assert {t["key"] for t in terms for t in t["matchExpressions"]} == {"nvidia.com/gpu.product",
                                                                            "cloud.google.com/gke-accelerator"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in w.pod["tolerations"]
        # the checkpoint comes from the models volume, read only
        mount = w.mount_of(settings.model_dir)
        assert mount["readOnly"] is True and mount["volume"]["persistentVolumeClaim"]["claimName"] == "models"
    claim = by_kind(objects, "PersistentVolumeClaim")["models"]
    assert claim["spec"]["accessModes"] == ["ReadOnlyMany"]
    [router] = of(containers, "router")
    tokenizer = router.mount_of(router.command.settings.tokenizer_dir)
    assert tokenizer["volume"]["persistentVolumeClaim"]["claimName"] == "models"
    [gateway] = of(containers, "gateway")   # the target's chat template, from the same checkpoint
    assert gateway.command.settings.tokenizer_dir == router.command.settings.tokenizer_dir
    assert gateway.mount_of(gateway.command.settings.tokenizer_dir)["volume"]["persistentVolumeClaim"] == {
        "claimName": "models", "readOnly": True}
    for name, d in by_kind(objects, "Deployment").items():   # the rest runs on CPU nodes
        if component(d) != "worker":
            pod = d["spec"]["template"]["spec"]
            assert "tolerations" not in pod and "affinity" not in pod, name
            assert all("nvidia.com/gpu" not in c["resources"].get("limits", {}) for c in pod["containers"]), name
            assert all(not c["image"].endswith("-cuda") for c in pod["containers"]), name


def test_local_runs_the_demo_pool_on_the_cpu(rendered):
    objects = rendered["local"]
    containers = specrouter_containers(objects)
    for w in of(containers, "worker"):
        settings = w.command.settings
        assert settings.device == "cpu", w.name
        assert (repo_path_of_image_path(settings.model_dir) / "config.json").exists(), w.name
    for d in by_kind(objects, "Deployment").values():
        for c in d["spec"]["template"]["spec"]["containers"]:
            assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    # the image that `docker compose build` (or docker build -t) makes, loaded into kind or minikube
    compose = read_yaml(REPO_ROOT / "docker-compose.yml")
    assert {c.spec["image"] for c in containers} == {compose["services"]["router"]["image"]}
    # the base's pool ConfigMap carries the demo pool's similarity table as it is in models/demo-pool
    pool = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("pool-"))
    assert json.loads(pool["data"]["similarity.json"]) == json.loads((DEMO_POOL / "similarity.json").read_text())


def test_external_redis_component_replaces_the_clusters_redis(tmp_path):
    directory = relative_overlay(tmp_path, {"resources": ["{k8s}/overlays/local"],
                                            "components": ["{k8s}/components/external-redis"]})
    objects = render(directory)
    assert "redis" not in by_kind(objects, "Deployment") and "redis" not in by_kind(objects, "Service")
    assert "redis-from-profilers" not in by_kind(objects, "NetworkPolicy")
    [profiler] = of(specrouter_containers(objects), "profiler")
    url = (K8S / "components" / "external-redis" / "redis-url.txt").read_text().strip()
    assert profiler.command.settings.redis_url == url
    for o in objects:
        kubernetes_validate.validate(o, VERSIONS[0], strict=True)


def test_the_gateway_takes_clients_and_reaches_the_routers_alone(overlay):
    """Anyone may reach its HTTP port (and Prometheus its metrics port); its way out leads to the routers'
    gRPC port, the cluster's DNS and the trace collector, nothing else."""
    name, objects, containers = overlay
    deployments = by_kind(objects, "Deployment")
    [gateway], [router] = of(containers, "gateway"), of(containers, "router")
    rules, ports = allowed_sources(objects, gateway.deployment)
    assert ports == {gateway.command.settings.port, gateway.command.settings.metrics_port}
    open_to_all = [r for r in rules if "from" not in r]
    assert open_to_all == [{"ports": [{"protocol": "TCP", "port": gateway.command.settings.port}]}]

    egress = [p["spec"] for p in by_kind(objects, "NetworkPolicy").values() if "Egress" in p["spec"]["policyTypes"]
              and matches(p["spec"]["podSelector"], pod_labels(gateway.deployment))]
    assert len(egress) == 1, "one policy bounds the gateway's way out"
    [routers, dns, collector] = egress[0]["egress"]
    assert all(rule.get("to") for rule in egress[0]["egress"]), "a rule without `to` opens every destination"
    reached = {n for peer in routers["to"] for n, d in deployments.items() if set(peer) == {"podSelector"}
               and matches(peer["podSelector"], pod_labels(d))}
    assert reached == {router.name} and routers["ports"] == [{"protocol": "TCP", "port": router.command.settings.port}]
    assert host_of(gateway.command.settings.router) in by_kind(objects, "Service")   # a Service of the routers
    assert dns["to"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
    assert {p["port"] for p in dns["ports"]} == {53}
    endpoint = container_env(gateway.spec, objects)["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert collector["ports"] == [{"protocol": "TCP", "port": int(endpoint.rsplit(":", 1)[1])}]
    if name == "local":   # the overlay's own Jaeger, in the namespace
        [peer] = collector["to"]
        assert {n for n, d in deployments.items() if matches(peer["podSelector"], pod_labels(d))} == {"jaeger"}
    else:
        assert collector["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name":
                                                                          "observability"}}}]
