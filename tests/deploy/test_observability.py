"""deploy/'s Prometheus configs and Grafana dashboard against a live dyn stack.

The stack is what the Kubernetes manifests run, on loopback: `dyn serve` (mocker workers, a
frontend in kv mode routing through the dyn router), `dyn router --system-port` and `dyn
indexer`. The metric names dyn exports are read from their /metrics after real requests, never
from a list: every query of the dashboard must name only those. The probes of the manifests
are asked of the same processes. Where a Prometheus binary is installed (Debian's `prometheus`
package), it scrapes the stack with deploy/prometheus/prometheus.yml as shipped and answers every
dashboard query.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dyn.core.transport.sockets import free_ports
from tests.deploy.promql import dashboard_queries, metric_names
from tests.deploy.stacks import DEPLOY, dyn_containers, parse_dyn, render_stack, workloads
from tests.integration.conftest import DynProcess, serve_ready_url
from tests.waiting import poll_until

pytestmark = pytest.mark.integration

DASHBOARD = DEPLOY / "grafana" / "dyn.json"
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}
PROMPT = "Summarise the history of the printing press in three sentences. " * 12


class LiveStack:
    """The processes and the HTTP addresses (``host:port``) of each component."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {
            **os.environ,
            "DYN_DISCOVERY_DIR": str(root / "discovery"),
            "DYN_NAMESPACE": f"deploy{os.getpid()}",
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.procs: list[DynProcess] = []
        self.http: dict[str, str] = {}

    def start(self, name: str, *args: str) -> DynProcess:
        proc = DynProcess(list(args), self.root / f"{name}.log", self.env)
        self.procs.append(proc)
        return proc

    def wait_line(self, proc: DynProcess, prefix: str, timeout: float = 60) -> str:
        def found() -> str | None:
            for line in proc.log().splitlines():
                if line.startswith(prefix):
                    return line[len(prefix) :].strip()
            if proc.proc.poll() is not None:
                raise AssertionError(f"exited:\n{proc.log()}")
            return None

        return poll_until(found, timeout, f"{prefix!r} in {proc.log_path.name}")

    def close(self) -> None:
        for proc in reversed(self.procs):
            try:
                proc.terminate(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def hostport(url: str) -> str:
    return httpx.URL(url).netloc.decode()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    stack = LiveStack(tmp_path_factory.mktemp("live"))
    try:
        router = stack.start("router", "router", "--port", "0", "--system-port", "0")
        metrics_url = stack.wait_line(router, "dyn router metrics: ")
        stack.http["router"] = hostport(metrics_url)
        serve = stack.start(
            "serve",
            "serve",
            "--workers",
            "2",
            "--http-port",
            "0",
            "--router-mode",
            "kv",
            "--router-address",
            "auto",
            "--block-size",
            "16",
            "--speedup-ratio",
            "100",
        )
        stack.http["frontend"] = hostport(serve_ready_url(serve))
        indexer = stack.start("indexer", "indexer", "--http-port", "0", "--zmq-port", "0")
        ready = stack.wait_line(indexer, "dyn indexer ready: ")
        stack.http["indexer"] = hostport(ready.split()[0].removeprefix("http="))
        base = f"http://{stack.http['frontend']}"
        for stream in (True, True, True, False):
            body = {
                "model": "dyn-tiny",
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 8,
                "stream": stream,
            }
            with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=60) as reply:
                assert reply.status_code == 200, reply.read()
                reply.read()
        yield stack
    finally:
        stack.close()


def exported_names(text: str, *, sampled_only: bool = False) -> set[str]:
    """Every series name a /metrics page can hold: its samples' and, unless ``sampled_only``,
    for a family with no sample yet (a labelled metric nobody observed, such as migrations),
    the names its type gives it."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        if not sampled_only:
            names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def scrape(live: LiveStack, *, sampled_only: bool = False) -> set[str]:
    names: set[str] = set()
    for component, address in live.http.items():
        reply = httpx.get(f"http://{address}/metrics", timeout=10)
        assert reply.status_code == 200, component
        names |= exported_names(reply.text, sampled_only=sampled_only)
    return names


@pytest.fixture(scope="module")
def exported(live):
    return scrape(live)


def test_metric_names_are_read_from_promql():
    assert metric_names(
        'histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket{model=~"$model"}[$__rate_interval])))'
    ) == {"a_seconds_bucket"}
    assert metric_names("sum(rate(x_sum[5m])) / sum without (pod) (rate(x_count[5m])) > bool 0") == {
        "x_sum",
        "x_count",
    }
    assert metric_names('max by (worker_id) (g{a="by (b)"}) or on (c) vector(0)') == {"g"}
    assert metric_names("label_values(dynamo_frontend_requests_total, model)") == {
        "dynamo_frontend_requests_total"
    }


@pytest.mark.long
def test_every_dashboard_query_names_only_metrics_dyn_exports(exported):
    dashboard = json.loads(DASHBOARD.read_text())
    queries = list(dashboard_queries(dashboard))
    assert len(queries) > 20
    for where, query in queries:
        names = metric_names(query)
        assert names, f"{where}: no metric in {query!r}"
        missing = names - exported
        assert not missing, f"{where}: dyn exports no {sorted(missing)} ({query})"


def test_the_dashboard_shows_what_the_issue_asks_for():
    used = set().union(*(metric_names(q) for _, q in dashboard_queries(json.loads(DASHBOARD.read_text()))))
    wanted = {
        "TTFT": "dynamo_frontend_time_to_first_token_seconds_bucket",
        "ITL": "dynamo_frontend_inter_token_latency_seconds_bucket",
        "requests/s": "dynamo_frontend_requests_total",
        "queue depth": "dynamo_frontend_router_queue_pending_requests",
        "KV hit rate": "dynamo_component_router_kv_hit_rate_sum",
        "per-worker load": "dynamo_frontend_worker_active_decode_blocks",
        "router overhead": "dynamo_router_overhead_total_ms_bucket",
    }
    absent = {what: name for what, name in wanted.items() if name not in used}
    assert not absent, f"the dashboard does not show {absent}"


def test_the_probes_of_the_manifests_answer_on_live_processes(live, tmp_path):
    """Each HTTP probe path of the base stack, asked of the live process of the same command."""
    probed = 0
    for c in dyn_containers(render_stack(tmp_path, "base")):
        command = parse_dyn(c.argv, c.env)[-1].command.name
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = c.container.get(kind)
            if probe is None:
                continue
            path = probe["httpGet"]["path"]
            reply = httpx.get(f"http://{live.http[command]}{path}", timeout=10)
            assert reply.status_code == 200, f"{c.name} {kind} {path}: {reply.status_code} {reply.text}"
            probed += 1
    assert probed >= 6


@pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="no prometheus binary on PATH (Debian's prometheus package); the shipped scrape config "
    "is not run against a live stack here",
)
def test_prometheus_scrapes_the_live_stack_with_the_shipped_config(live, tmp_path):
    promtool = shutil.which("promtool")
    config = tmp_path / "prometheus.yml"
    shutil.copy(DEPLOY / "prometheus" / "prometheus.yml", config)
    if promtool:
        subprocess.run(
            [promtool, "check", "config", str(config)], check=True, timeout=60, capture_output=True
        )
    (tmp_path / "targets").mkdir()
    for component, address in live.http.items():
        (tmp_path / "targets" / f"{component}.json").write_text(
            json.dumps([{"targets": [address], "labels": {"component": component}}])
        )
    (port,) = free_ports("127.0.0.1", 1)
    log = open(tmp_path / "prometheus.log", "wb")
    server = subprocess.Popen(
        [
            shutil.which("prometheus") or "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    api = f"http://127.0.0.1:{port}/api/v1"

    def query(promql: str) -> list:
        reply = httpx.get(f"{api}/query", params={"query": promql}, timeout=10).json()
        assert reply["status"] == "success", (promql, reply)
        return reply["data"]["result"]

    def all_up() -> bool:
        try:
            targets = httpx.get(f"{api}/targets", timeout=5).json()["data"]["activeTargets"]
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        return len(targets) == len(live.http) and all(t["health"] == "up" for t in targets)

    try:
        poll_until(all_up, 60, "Prometheus to scrape every component", interval=0.5)
        up = {r["metric"]["component"]: r["value"][1] for r in query("up")}
        assert up == {component: "1" for component in live.http}
        stored = {r["metric"]["__name__"] for r in query('count by (__name__) ({job="dyn"})')}
        sampled = scrape(live, sampled_only=True)
        dashboard = json.loads(DASHBOARD.read_text())
        for where, promql in dashboard_queries(dashboard):
            if promql.startswith("label_values("):
                continue
            query(promql.replace("$__rate_interval", "1m").replace("$model", ".*"))
            missing = (metric_names(promql) & sampled) - stored
            assert not missing, f"{where}: dyn exports {sorted(missing)} but Prometheus stored none"
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)
        log.close()


def relabel(labels: dict[str, str], configs: list[dict]) -> dict[str, str] | None:
    """Prometheus's relabelling (the ``keep`` and ``replace`` actions, its defaults: separator
    ``;``, regex ``(.*)`` matched whole, replacement ``$1``) of one target's labels; None when
    dropped."""
    labels = dict(labels)
    for config in configs:
        value = config.get("separator", ";").join(labels.get(name, "") for name in config["source_labels"])
        match = re.fullmatch(config.get("regex", "(.*)"), value)
        action = config.get("action", "replace")
        if action == "keep":
            if match is None:
                return None
        elif action == "replace":
            if match is not None:
                replacement = re.sub(r"\$\{?(\d+)\}?", r"\\\1", config.get("replacement", "$1"))
                labels[config["target_label"]] = match.expand(replacement)
        else:
            raise AssertionError(f"relabel action {action} not simulated here")
    return labels


def test_the_kubernetes_scrape_config_finds_the_pods_that_serve_metrics(tmp_path):
    """Prometheus's pod discovery (``__meta_kubernetes_pod_*`` labels, names sanitised as it does)
    over the base stack's pods, through deploy/prometheus/kubernetes.yml's relabelling: the
    frontend, router and indexer are scraped at their metrics ports, nothing else is."""
    (job,) = yaml.safe_load((DEPLOY / "prometheus" / "kubernetes.yml").read_text())["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]

    def meta(kind: str, mapping: dict[str, str]) -> dict[str, str]:
        return {
            f"__meta_kubernetes_pod_{kind}_{re.sub(r'[^a-zA-Z0-9_]', '_', k)}": v for k, v in mapping.items()
        }

    scraped = {}
    for workload in workloads(render_stack(tmp_path, "base")):
        template = workload["spec"]["template"]
        labels = {
            "__address__": "10.42.0.7",
            "__metrics_path__": "/metrics",
            "__meta_kubernetes_pod_ip": "10.42.0.7",
            "__meta_kubernetes_pod_name": f"{workload['metadata']['name']}-0",
            "__meta_kubernetes_namespace": "llm",
            **meta("label", template["metadata"].get("labels", {})),
            **meta("annotation", template["metadata"].get("annotations", {})),
        }
        target = relabel(labels, job["relabel_configs"])
        if target is not None:
            scraped[target["component"]] = (target["__address__"], target["__metrics_path__"], target["pod"])
    assert scraped == {
        "frontend": ("10.42.0.7:8000", "/metrics", "dyn-frontend-0"),
        "router": ("10.42.0.7:8081", "/metrics", "dyn-router-0"),
        "indexer": ("10.42.0.7:8090", "/metrics", "dyn-indexer-0"),
    }


def test_the_dashboard_is_well_formed():
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        box = panel["gridPos"]
        assert 0 <= box["x"] and box["x"] + box["w"] <= 24, panel["title"]
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "model"}
