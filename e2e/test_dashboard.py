"""End-to-end: `kubectl gr dashboard` in a real browser (Debian's chromium, driven through its chromedriver
by selenium) on the local cluster, with the controller releasing an app that answers real requests
through Traefik.

- The list shows a release as it appears; its page follows the batch and the weight as they advance (the
  page is never reloaded: a mark left in the window survives), with the gate's checks charted.
- Abort, clicked on the page, cuts the canary off: the release ends Aborted, the canary's pods leave the
  Service's endpoints, and no request is answered by a canary pod after that.
- A user whose kubeconfig may only read (a ServiceAccount token bound to a read-only Role) sees each
  action refused with the API server's own message (the one kubectl prints for the same write), and the
  object is unchanged.

GREYRELEASE_DASHBOARD_SCREENSHOT=docs/dashboard.png saves the release's page mid-way (the README's picture).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from e2e.harness.controller import ROOT, apply_release, endpoint_pods, gr, status, wait_for
from e2e.harness.controlplane import Cluster
from e2e.harness.dataplane import DataPlane, answering_app
from e2e.harness.load import Load, last
from e2e.harness.prometheus import PrometheusStack

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent  # where `pip install -e .` put the kubectl-gr console script
SCREENSHOT = os.environ.get("GREYRELEASE_DASHBOARD_SCREENSHOT", "")
RATE = 20.0  # requests/s through Traefik while the release runs
V1 = "registry.example/app:v1"
SELECTOR = 'namespace="{{namespace}}",app="{{app}}",track="{{track}}"'
ERROR_RATE = (
    f"sum(rate(http_request_errors_total{{{SELECTOR}}}[5s])) / sum(rate(http_requests_total{{{SELECTOR}}}[5s]))"
)


# --- the browser and the command ------------------------------------------------------------------------


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("chromium and chromedriver are not installed: `make system-deps` installs Debian's")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1360,1420",
    ):
        options.add_argument(arg)
    # The driver named, so selenium looks for nothing to download.
    chrome = webdriver.Chrome(options=options, service=Service(driver))
    try:
        yield chrome
    finally:
        chrome.quit()


class Dashboard:
    """`kubectl gr dashboard -n NS --port 0`, found by kubectl's plugin discovery, with a kubeconfig."""

    def __init__(self, cluster: Cluster, namespace: str, kubeconfig: Path | None = None) -> None:
        env = {**cluster.env, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        started = time.monotonic()
        self.proc = subprocess.Popen(
            [cluster.kubectl_path, "gr", "dashboard", "-n", namespace, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        assert first.startswith(f"GreyRelease dashboard (namespace {namespace}): http://127.0.0.1:"), (
            first,
            self.stop(),
        )
        self.url = first.split(": ", 1)[1].strip()
        self.started_in = time.monotonic() - started

    def stop(self) -> str:
        """SIGINT, as Ctrl-C; what it wrote to stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err


def text(browser: WebDriver, css: str) -> str:
    try:
        return str(browser.find_element(By.CSS_SELECTOR, css).text)
    except WebDriverException:
        return ""


def wait_text(browser: WebDriver, css: str, want: str, timeout: float, what: str) -> float:
    """Wait until the element's text starts with ``want``; when it did (time.time())."""
    wait_for(lambda: text(browser, css).startswith(want), timeout, f"{what} ({css} showing {want!r})", 0.1)
    return time.time()


def click(browser: WebDriver, action: str, *, confirm: bool = False) -> float:
    button = browser.find_element(By.CSS_SELECTOR, f'button[data-action="{action}"]')
    assert button.is_enabled(), f"the {action} button is disabled"
    at = time.time()
    button.click()
    if confirm:
        WebDriverWait(browser, 5).until(expected_conditions.alert_is_present()).accept()
    return at


def notice(browser: WebDriver, timeout: float = 15) -> tuple[str, str]:
    """The page's answer to the last action: its class (ok or error) and its text."""

    def shown() -> tuple[str, str] | None:
        node = browser.find_element(By.ID, "notice")
        cls = str(node.get_attribute("class") or "")
        return (cls, str(node.text)) if cls in ("ok", "error") else None

    return wait_for(shown, timeout, "the page's answer to the action", 0.1)


# --- the app -----------------------------------------------------------------------------------------------


def deploy(cluster: Cluster, dataplane: DataPlane, namespace: str, replicas: int) -> str:
    """The app behind an Ingress of class traefik (Service mode); the Host it answers to."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(answering_app("web", replicas, V1)))
    host = f"web.{namespace}.example"
    backend = {"service": {"name": "web", "port": {"number": 80}}}
    ingress = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": "web"},
        "spec": {
            "ingressClassName": "traefik",
            "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]}}],
        },
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(ingress))
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=60s")
    return host


def canary_pods(cluster: Cluster, namespace: str) -> set[str]:
    pods = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", "greyrelease.io/track=canary")["items"]
    return {p["metadata"]["name"] for p in pods}


# --- the tests ---------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("controller")
def test_the_page_follows_a_release_under_traffic_and_its_abort_cuts_the_canary(
    cluster: Cluster, namespace: str, dataplane: DataPlane, prometheus: PrometheusStack, browser: WebDriver
) -> None:
    began = time.monotonic()
    host = deploy(cluster, dataplane, namespace, 4)
    for track in ("stable", "canary"):
        prometheus.set_rates(namespace, "web", track, rps=20, error_ratio=0.01)
    query = ERROR_RATE.replace("{{namespace}}", namespace).replace("{{app}}", "web").replace("{{track}}", "canary")
    prometheus.wait_for_query(query, lambda v: v is not None, timeout=30)
    dashboard = Dashboard(cluster, namespace)
    try:
        browser.get(dashboard.url)
        wait_text(browser, "#live", "live", 15, "the event stream open")
        with Load(dataplane.gateway_url, RATE, host=host) as load:
            applied = time.time()
            apply_release(
                cluster,
                namespace,
                gr(
                    "web",
                    targetRef={"name": "web"},
                    targetVersion="v2",
                    batches=[{"replicas": 1, "pause": "3s"}, {"replicas": 2, "pause": "manual"}, {"replicas": 4}],
                    trafficRouting={"service": {"name": "web"}},
                    analysis={
                        "prometheus": {"address": prometheus.url, "timeout": "2s"},
                        "interval": "1s",
                        "metrics": [
                            {
                                "name": "error-rate",
                                "query": ERROR_RATE,
                                "thresholdRange": {"max": 0.05},
                                "compare": {"maxIncrease": 1.0, "floor": 0.005},
                            }
                        ],
                    },
                ),
            )
            # The list shows the release as it appears, running.
            row = f'tr[data-release="{namespace}/web"]'
            listed = wait_text(browser, f"{row} .phase", "Progressing", 30, "the release in the list")
            browser.find_element(By.CSS_SELECTOR, row).click()
            browser.execute_script("window.greyreleaseMark = 'the same page'")
            # Its page follows the batches: 1/3 at 25 %, then 2/3 at 50 % once the pause and the gate passed.
            first = wait_text(browser, "#r-batch", "1/3", 30, "batch 1")
            wait_text(browser, "#r-weight", "25%", 15, "batch 1's weight")
            second = wait_text(browser, "#r-batch", "2/3", 60, "batch 2")
            wait_text(browser, "#r-weight", "50%", 15, "batch 2's weight")
            wait_text(browser, "#r-phase", "Progressing · WaitingForApproval", 30, "batch 2 waiting for approval")
            assert browser.execute_script("return window.greyreleaseMark") == "the same page", "the page was reloaded"
            assert len(browser.find_elements(By.CSS_SELECTOR, '#batches tr[data-state="done"]')) == 1
            wait_for(
                lambda: browser.find_elements(By.CSS_SELECTOR, '[data-gate="error-rate"] canvas'),
                15,
                "the gate's chart",
            )
            assert "Pass" in text(browser, '[data-gate="error-rate"] .head')
            assert "BatchReady" in text(browser, "#events")
            if SCREENSHOT:
                time.sleep(8)  # more of the gate's checks on the chart (only when a picture is asked for)
                shot = Path(SCREENSHOT) if Path(SCREENSHOT).is_absolute() else ROOT / SCREENSHOT
                shot.parent.mkdir(parents=True, exist_ok=True)
                assert browser.save_screenshot(str(shot)), shot
                print(f"\nscreenshot of the release mid-way: {shot}")
            canaries = canary_pods(cluster, namespace)
            assert len(canaries) == 2, canaries
            wait_for(
                lambda: canaries <= set(endpoint_pods(cluster, namespace, "web")), 10, "the canary in the endpoints"
            )

            # Abort on the page: the annotation kubectl gr abort writes, as the user.
            clicked = click(browser, "abort", confirm=True)
            kind, said = notice(browser)
            assert kind == "ok" and said.startswith(
                "greyrelease.greyrelease.io/web annotated (greyrelease.io/abort=true@"
            )
            aborted = wait_text(browser, "#r-phase", "Aborted", 60, "the release Aborted on the page")
            assert status(cluster, namespace, "web")["phase"] == "Aborted"
            wait_for(
                lambda: not canaries & set(endpoint_pods(cluster, namespace, "web")),
                10,
                "the canary out of the endpoints",
            )
            assert browser.execute_script("return window.greyreleaseMark") == "the same page", "the page was reloaded"
            time.sleep(1.5)  # requests sent before the cut have been answered
            records = load.stop()
        canary = last(records, lambda r: r.image == "registry.example/app:v2")
        assert canary is not None, "no request was answered by the canary"
        late = [r for r in records if r.image == "registry.example/app:v2" and r.sent > aborted]
        assert not late, f"{len(late)} requests answered by the canary after the page showed Aborted"
        failed = [r for r in records if r.failed]
        print(
            f"\ndashboard: started in {dashboard.started_in:.2f}s; the release in the list "
            f"{listed - applied:.2f}s after kubectl apply; batch 1 shown after {first - applied:.2f}s, batch 2 "
            f"after {second - applied:.2f}s; Abort clicked: the last canary answer {canary.sent - clicked:.3f}s "
            f"after the click, Aborted on the page {aborted - clicked:.2f}s after it; {len(records)} requests "
            f"at {RATE:.0f}/s, {len(failed)} failed; {time.monotonic() - began:.1f}s in all"
        )
    finally:
        err = dashboard.stop()
    assert dashboard.proc.returncode == 0, err


def test_a_user_who_may_only_read_sees_the_actions_refused_with_the_api_servers_message(
    cluster: Cluster, namespace: str, crd: Path, browser: WebDriver, tmp_path: Path
) -> None:
    began = time.monotonic()
    reader: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "viewer"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "greyrelease-viewer"},
            "rules": [
                {"apiGroups": ["greyrelease.io"], "resources": ["greyreleases"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "greyrelease-viewer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "greyrelease-viewer"},
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": namespace}],
        },
    ]
    cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps({"kind": "List", "apiVersion": "v1", "items": reader})
    )
    # No controller: the object stays as written, so any change to it would be the dashboard's.
    apply_release(
        cluster, namespace, gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=[{"replicas": 1}])
    )
    before = cluster.kubectl_json("get", "gr", "web", "-n", namespace)
    kubeconfig = cluster.service_account_kubeconfig(namespace, "viewer", tmp_path / "viewer.kubeconfig")
    # What kubectl itself is told for the same write, as this user.
    refused = cluster.kubectl(
        "--kubeconfig",
        str(kubeconfig),
        "annotate",
        "gr",
        "web",
        "-n",
        namespace,
        "greyrelease.io/pause=true",
        check=False,
    )
    assert refused.returncode != 0 and refused.stderr.startswith("Error from server (Forbidden): "), refused.stderr
    expected = refused.stderr.strip()
    dashboard = Dashboard(cluster, namespace, kubeconfig)
    try:
        browser.get(f"{dashboard.url}#/{namespace}/web")
        wait_text(browser, "#r-phase", "Pending", 20, "the release's page, read with the viewer's token")
        for action, confirm in (("pause", False), ("abort", True)):
            click(browser, action, confirm=confirm)
            kind, said = notice(browser)
            assert kind == "error", said
            assert said == expected, (said, expected)
            browser.execute_script("document.getElementById('notice').className = ''")
        governance = text(browser, "#governance")
        assert "the GreyReleasePolicies could not be read (Forbidden: " in governance, governance
    finally:
        err = dashboard.stop()
    assert dashboard.proc.returncode == 0, err
    after = cluster.kubectl_json("get", "gr", "web", "-n", namespace)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert "annotations" not in after["metadata"] or not any(
        k.startswith("greyrelease.io/") for k in after["metadata"]["annotations"]
    )
    print(f"\nread-only dashboard: refused twice with kubectl's own message; {time.monotonic() - began:.1f}s in all")
