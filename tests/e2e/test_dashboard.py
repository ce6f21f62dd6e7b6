"""The dashboard in a real browser, as a namespace user (docs/dashboard.md).

``kubectl koord-queue dashboard`` runs as the real kubectl plugin with a tenant's own kubeconfig
(a client certificate for ``alice``, bound in her namespace to the built-in ``edit`` role, into
which the install's user role aggregates), against the full local control plane with the
visibility API registered. Headless Chromium (Debian's package, testenv/browser.py), driven by
Playwright, opens the printed URL and reads the page as a person would. Checked:

* she sees her namespace's units and no one else's; another namespace's page is refused (403)
  with the plugin's message naming the missing permission;
* the positions on the page are those the visibility API serves her, the reasons those of
  ``kubectl koord-queue list``, and a unit's "Why" that of ``kubectl koord-queue explain``;
* a user with only the ``view`` role who presses Hold is refused, and the page says why;
* a new job and a priority change show on the page within 2 s of reaching the API server;
* the keyboard reaches the table and its actions;
* while every unit is still being read, the early page (docs/dashboard.md#the-first-page) is the
  visibility API's positions with list's rows, read as her, and refuses another namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from playwright.async_api import Browser, Page, async_playwright

from koord_queue.cli.client import CliError, Reader
from koord_queue.dashboard import queuepage
from koord_queue.shared import kube as shared_kube
from koord_queue.shared.api import names
from testenv import binaries, browser, system
from testenv.cluster import LocalCluster
from tests import kube, tenancy
from tests.e2e.test_tenant_roles import aggregated
from tests.integration.test_visibility import GROUP_VERSION, available, registered, serving_visibility

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SCREENSHOT = ROOT / "docs" / "dashboard.png"
#: docs/dashboard.md#what-it-shows: a change shows within this many seconds.
UPDATE_WITHIN = 2.0


def job(name: str, quota: str, *, cpu: str, priority: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {names.QUOTA_NAME_LABEL: quota},
            "annotations": {names.PRIORITY_ANNOTATION: str(priority)},
        },
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}
                    ],
                }
            }
        },
    }


def bind(cluster: LocalCluster, namespace: str, user: str, role: str) -> None:
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{user}-{role}", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    kube.kubectl(cluster, "apply", "-f", "-", input_text=json.dumps(binding))


def plugin(kubeconfig: Path, *args: str) -> dict[str, Any]:
    """``kubectl koord-queue ARGS -o json`` with a user's own kubeconfig."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    done = subprocess.run(
        [str(binaries.kubectl()), "koord-queue", f"--kubeconfig={kubeconfig}", *args, "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


@contextlib.asynccontextmanager
async def dashboard(kubeconfig: Path, namespace: str, *flags: str) -> AsyncIterator[str]:
    """``kubectl koord-queue dashboard --no-browser`` as the kubeconfig's user; yields the printed URL."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    process = await asyncio.create_subprocess_exec(
        str(binaries.kubectl()),
        "koord-queue",
        f"--kubeconfig={kubeconfig}",
        "-n",
        namespace,
        "dashboard",
        "--no-browser",
        *flags,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), timeout=30)).decode()
        assert " at http://127.0.0.1:" in line, line
        yield line.split(" at ", 1)[1].strip()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), timeout=10)
        assert code == 0, (await process.stderr.read()).decode() if process.stderr else code


@contextlib.asynccontextmanager
async def evil_page(target: str) -> AsyncIterator[str]:
    """A web page on another port of 127.0.0.1 (same site, other origin) that tries to make the
    dashboard write: a JSON fetch with credentials, and a form it submits when asked."""
    page = f"""<!doctype html><title>waiting</title>
<form id="attack" method="POST" action="{target}" enctype="text/plain">
<input name='{{"x":"' value='"}}'></form>
<script>
fetch("{target}", {{method: "POST", credentials: "include",
  headers: {{"Content-Type": "application/json"}}, body: "{{}}"}})
  .then(r => {{ document.title = "fetch:" + r.status; }})
  .catch(() => {{ document.title = "fetch-failed"; }});
</script>"""

    async def serve(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    app = web.Application()
    app.add_routes([web.get("/", serve)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        await runner.cleanup()


@pytest.fixture
async def chromium() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        launched = await p.chromium.launch(executable_path=str(browser.chromium()), headless=True)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def stage(
    e2e_cluster: LocalCluster, system_e2e: system.Processes, namespace_in: str
) -> AsyncIterator[str]:
    """Alice's namespace with the visibility API registered and her roles in force."""
    vis = await serving_visibility(e2e_cluster, system_e2e)
    await kube.eventually(lambda: aggregated(e2e_cluster), what="our rules aggregated into view, edit, admin")
    tenancy.grant(e2e_cluster, namespace_in, tenancy.ALICE)
    with registered(e2e_cluster, port=vis.port):
        await available(e2e_cluster)
        yield namespace_in


async def rows(page: Page) -> dict[str, dict[str, str]]:
    """The queue table as the page shows it: unit key -> cells."""
    found: dict[str, dict[str, str]] = await page.eval_on_selector_all(
        "tr[data-unit]",
        """rows => Object.fromEntries(rows.map(r => [r.dataset.unit, {
            position: r.querySelector('.position').textContent,
            priority: r.querySelector('.priority-value').textContent,
            why: r.querySelector('.reason').textContent,
            reason: r.querySelector('.reason').title,
        }]))""",
    )
    return found


async def shown_within(page: Page, probe: Any, what: str) -> float:
    """Seconds until ``probe(rows)`` holds on the page; polled every 50 ms (the page's own polling
    is what is measured)."""
    start = time.monotonic()

    async def check() -> bool:
        return bool(probe(await rows(page)))

    await kube.eventually(check, timeout=15, interval=0.05, what=what)
    return time.monotonic() - start


async def test_a_tenant_sees_her_queue_as_the_plugin_explains_it_and_nothing_else(
    e2e_cluster: LocalCluster, stage: str, chromium: Browser, tmp_path: Path
) -> None:
    ns = stage
    quota = f"{ns}-dash"
    roomy = f"{ns}-roomy"
    for name, cpu in ((quota, "1"), (roomy, "4")):
        kube.kubectl(
            e2e_cluster,
            "apply",
            "-f",
            "-",
            input_text=json.dumps(
                {
                    "apiVersion": f"{names.QUOTA_GROUP}/{names.QUOTA_VERSION}",
                    "kind": "ElasticQuota",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"min": {"cpu": cpu}, "max": {"cpu": cpu}},
                }
            ),
        )
    await tenancy.create_as(e2e_cluster, ns, job("quick", roomy, cpu="1", priority=1))
    for name, priority in (("train-low", 1), ("train-mid", 3), ("train-high", 5)):
        await tenancy.create_as(e2e_cluster, ns, job(name, quota, cpu="2", priority=priority))
    kubeconfig = e2e_cluster.kubeconfig_for("alice", user=tenancy.ALICE)

    async def parked() -> list[dict[str, Any]] | None:
        everything = plugin(kubeconfig, "-n", ns, "list")["items"]
        items: list[dict[str, Any]] = [i for i in everything if i["queue"] == quota]
        ready = len(items) == 3 and all(i["position"] is not None and i["phase"] == "Enqueued" for i in items)
        admitted = any(i["name"] == "quick" and not i["waiting"] for i in everything)
        return items if ready and admitted else None

    listed = {i["name"]: i for i in await kube.eventually(parked, timeout=60, what="three parked units")}

    async with dashboard(kubeconfig, ns) as url:
        page = await chromium.new_page(viewport={"width": 1400, "height": 800})
        requested: list[str] = []
        page.on("request", lambda r: requested.append(r.url))
        await page.goto(url)
        assert "token=" not in page.url  # exchanged for the cookie, dropped from the address

        # Her namespace only, in the visibility API's order, with list's reasons.
        await shown_within(page, lambda r: len(r) == 4, "four rows")
        shown = await rows(page)
        assert set(shown) == {f"{ns}/{name}" for name in [*listed, "quick"]}
        assert shown[f"{ns}/quick"]["position"] == "-"
        shown = {k: v for k, v in shown.items() if k != f"{ns}/quick"}
        served = json.loads(
            tenancy.as_user(
                e2e_cluster,
                tenancy.ALICE,
                "get",
                "--raw",
                f"/apis/{GROUP_VERSION}/namespaces/{ns}/queueunits",
            ).stdout
        )
        positions = {
            f"{i['metadata']['namespace']}/{i['metadata']['name']}": i["position"] for i in served["items"]
        }
        assert {k: int(v["position"]) for k, v in shown.items()} == positions
        assert [k.split("/")[1] for k, _ in sorted(positions.items(), key=lambda kv: kv[1])] == [
            "train-high",
            "train-mid",
            "train-low",
        ]
        for name, item in listed.items():
            # the Why column is explain's own answer for each unit; list's short reason is its title
            explained = plugin(kubeconfig, "-n", ns, "explain", name)
            assert shown[f"{ns}/{name}"]["why"] == explained["summary"], name
            assert shown[f"{ns}/{name}"]["reason"] == item["reason"] == f"no room in quota {quota} for cpu"

        # A poll of an unchanged page is a 304 with no body (docs/dashboard.md#what-it-costs).
        base = url.split("/ns/")[0]
        etags: list[str] = []

        async def unchanged() -> bool:
            sent = {"If-None-Match": etags[-1]} if etags else {}
            answer = await page.request.get(f"{base}/api/ns/{ns}/units?limit=50", headers=sent)
            if answer.status == 304:
                return await answer.body() == b""
            assert answer.status == 200
            etags.append(answer.headers["etag"])
            return False

        await kube.eventually(unchanged, timeout=15, interval=0.2, what="a 304 for an unchanged page")
        assert await page.locator("section[data-queue]").count() == 2
        assert "acting as alice" in await page.inner_text("#who")

        # The keyboard reaches the table's links and its actions.
        focused: list[str] = []
        for _ in range(12):
            await page.keyboard.press("Tab")
            focused.append(
                await page.evaluate("document.activeElement.dataset.key || document.activeElement.id || ''")
            )
        assert any(k.endswith(":link") for k in focused) and any(k.endswith(":hold") for k in focused), (
            focused
        )

        with contextlib.suppress(FileNotFoundError):
            (tmp_path / "dashboard.png").unlink()
        await page.evaluate("document.activeElement.blur()")
        await page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
        if os.environ.get("UPDATE_SCREENSHOT"):
            shutil.copy(tmp_path / "dashboard.png", SCREENSHOT)

        # One unit's story: explain's "Why" and next steps.
        await page.click(f"tr[data-unit='{ns}/train-low'] a")
        await page.wait_for_selector("#unit-why")
        explained = plugin(kubeconfig, "-n", ns, "explain", "train-low")
        assert await page.inner_text("#unit-why") == explained["summary"]
        assert await page.inner_text("#unit-position") == str(explained["position"])
        steps = await page.locator("#next-steps li").all_inner_texts()
        assert steps == explained["next_steps"]
        assert "Events:" in await page.inner_text("#describe")
        await page.go_back()
        await shown_within(page, lambda r: len(r) == 4, "the queue again")

        # The quota tree and the history, from what the cluster records.
        await page.click("#nav-quotas")
        await page.wait_for_selector(f"#quotas tr[data-quota='{quota}']")
        cells = await page.locator(f"#quotas tr[data-quota='{quota}'] td").all_inner_texts()
        assert cells[:4] == [quota, ns, "cpu=1", "cpu=1"] and cells[-1].startswith("3 ")
        await page.click("#nav-history")
        await page.wait_for_selector("#waits")
        waits = await page.locator("#waits tbody tr").all_inner_texts()
        assert any(w.startswith(f"{roomy}\tall days\t1\t") for w in waits), waits
        await page.click("#nav-queues")
        await shown_within(page, lambda r: len(r) == 4, "the queues again")

        # A change shows within 2 s of reaching the API server: a new job, then a priority.
        await tenancy.create_as(e2e_cluster, ns, job("train-new", quota, cpu="2", priority=2))
        seen_at = await unit_seen(e2e_cluster, ns, "train-new", lambda u: True)
        await shown_within(page, lambda r: f"{ns}/train-new" in r, "the new unit on the page")
        lag = time.monotonic() - seen_at
        assert lag <= UPDATE_WITHIN, f"the new unit showed {lag:.2f}s after the API server served it"
        kube.kubectl(
            e2e_cluster,
            "annotate",
            "--overwrite",
            "job",
            "train-low",
            "-n",
            ns,
            f"{names.PRIORITY_ANNOTATION}=9",
        )
        seen_at = await unit_seen(e2e_cluster, ns, "train-low", lambda u: u["spec"].get("priority") == 9)
        await shown_within(page, lambda r: r[f"{ns}/train-low"]["priority"] == "9", "priority 9 on the page")
        lag = time.monotonic() - seen_at
        assert lag <= UPDATE_WITHIN, f"the new priority showed {lag:.2f}s after the API server served it"

        # Hold, release and priority from the page, with her rights: the plugin's own answers.
        row = f"tr[data-unit='{ns}/train-mid']"
        await page.click(f"{row} button[data-action='hold']")
        await said(page, "job/train-mid held: it keeps its place")
        await shown_within(page, lambda r: r[f"{ns}/train-mid"]["reason"].startswith("inactive"), "held")
        await page.click(f"{row} button[data-action='release']")
        await said(page, "job/train-mid released")
        await shown_within(
            page, lambda r: not r[f"{ns}/train-mid"]["reason"].startswith("inactive"), "released"
        )
        await page.fill(f"{row} input.priority", "7")
        await page.press(f"{row} input.priority", "Enter")
        await said(page, "job/train-mid priority set to 7")
        await shown_within(
            page, lambda r: r[f"{ns}/train-mid"]["priority"] == "7", "priority 7 from the page"
        )
        got = kube.kubectl(e2e_cluster, "get", "job", "train-mid", "-n", ns, "-o", "json")
        annotations = json.loads(got.stdout)["metadata"]["annotations"]
        assert (
            annotations[names.PRIORITY_ANNOTATION] == "7" and annotations[names.ACTIVE_ANNOTATION] == "true"
        )

        # Another namespace's page is refused, naming the permission.
        response = await page.goto(url.split("/ns/")[0] + "/ns/kube-system")
        assert response is not None and response.status == 403  # refused, and the page says why
        await page.wait_for_selector("#refused")
        assert await page.get_attribute("#refused", "data-status") == "403"
        text = await page.inner_text("#refused-message")
        assert 'you may not list "queueunits.scheduling.x-k8s.io" in namespace "kube-system"' in text
        base = url.split("/ns/")[0]
        api = await page.request.get(base + "/api/ns/kube-system/units")
        assert api.status == 403
        # A write there, sent as the page would send it, is refused by the API server too.
        write = await page.request.post(
            base + "/api/ns/kube-system/units/coredns/hold",
            data="{}",
            headers={"Content-Type": "application/json", "Origin": base},
        )
        assert write.status == 403
        assert 'in namespace "kube-system"' in (await write.json())["error"]
        # Nothing the pages asked for came from anywhere but the dashboard.
        assert requested and all(u.startswith(base + "/") for u in requested), requested

        # A hostile page on another local port, in the same browser: its fetch and its form are
        # refused (preflight without the cookie; Origin not the dashboard's), nothing is held.
        async with evil_page(f"{base}/api/ns/{ns}/units/train-high/hold") as evil:
            await page.goto(evil)
            await page.wait_for_function("document.title.startsWith('fetch')", timeout=15000)
            assert await page.title() == "fetch-failed"
            async with page.expect_navigation() as navigation:
                await page.evaluate("document.getElementById('attack').submit()")
            answer = await navigation.value
            assert answer is not None and answer.status in (403, 415), answer.status if answer else None
        got = kube.kubectl(e2e_cluster, "get", "job", "train-high", "-n", ns, "-o", "json")
        assert names.ACTIVE_ANNOTATION not in (json.loads(got.stdout)["metadata"].get("annotations") or {})


async def said(page: Page, text: str) -> None:
    """Wait until the page's message box says ``text`` (not as an error)."""

    async def check() -> bool:
        box = page.locator("#message")
        return text in await box.inner_text() and "error" not in (await box.get_attribute("class") or "")

    await kube.eventually(check, timeout=15, what=f"the message {text!r}")


async def unit_seen(cluster: LocalCluster, ns: str, name: str, probe: Any) -> float:
    """The moment (monotonic) the API server first serves unit ``name`` satisfying ``probe``."""

    async def check() -> float | None:
        done = kube.kubectl(cluster, "get", "queueunit", name, "-n", ns, "-o", "json", check=False)
        if done.returncode != 0:
            return None
        return time.monotonic() if probe(json.loads(done.stdout)) else None

    seen: float = await kube.eventually(check, timeout=30, interval=0.05, what=f"{name} in the API server")
    return seen


async def test_a_view_only_user_pressing_hold_is_refused_with_the_missing_permission(
    e2e_cluster: LocalCluster, stage: str, chromium: Browser
) -> None:
    ns = stage
    quota = f"{ns}-view"
    kube.kubectl(
        e2e_cluster,
        "apply",
        "-f",
        "-",
        input_text=json.dumps(
            {
                "apiVersion": f"{names.QUOTA_GROUP}/{names.QUOTA_VERSION}",
                "kind": "ElasticQuota",
                "metadata": {"name": quota, "namespace": ns},
                "spec": {"min": {"cpu": "1"}, "max": {"cpu": "1"}},
            }
        ),
    )
    await tenancy.create_as(e2e_cluster, ns, job("waits", quota, cpu="2", priority=1))
    bob = "bob"
    bind(e2e_cluster, ns, bob, "view")
    kubeconfig = e2e_cluster.kubeconfig_for(bob, user=bob)

    async def listed() -> bool:
        return len(plugin(kubeconfig, "-n", ns, "list")["items"]) == 1

    await kube.eventually(listed, timeout=60, what="bob reads the unit")
    async with dashboard(kubeconfig, ns) as url:
        page = await chromium.new_page()
        await page.goto(url)
        await shown_within(page, lambda r: f"{ns}/waits" in r, "bob's row")
        await page.click(f"tr[data-unit='{ns}/waits'] button[data-action='hold']")
        await page.wait_for_selector("#message.error")
        text = await page.inner_text("#message")
        assert text.startswith('permission denied: you may not patch "jobs.batch"'), text
        assert f'in namespace "{ns}"' in text
    got = kube.kubectl(e2e_cluster, "get", "job", "waits", "-n", ns, "-o", "json")
    assert names.ACTIVE_ANNOTATION not in (json.loads(got.stdout)["metadata"].get("annotations") or {})


async def test_an_admin_sees_every_namespace_with_dash_a(
    e2e_cluster: LocalCluster, stage: str, chromium: Browser
) -> None:
    ns = stage
    quota = f"{ns}-all"
    kube.kubectl(
        e2e_cluster,
        "apply",
        "-f",
        "-",
        input_text=json.dumps(
            {
                "apiVersion": f"{names.QUOTA_GROUP}/{names.QUOTA_VERSION}",
                "kind": "ElasticQuota",
                "metadata": {"name": quota, "namespace": ns},
                "spec": {"min": {"cpu": "1"}, "max": {"cpu": "1"}},
            }
        ),
    )
    await tenancy.create_as(e2e_cluster, ns, job("somewhere", quota, cpu="2", priority=1))
    async with dashboard(e2e_cluster.kubeconfig, ns, "-A") as url:
        assert "/all?token=" in url
        page = await chromium.new_page()
        await page.goto(url)
        await shown_within(page, lambda r: f"{ns}/somewhere" in r, "the unit of the tenant's namespace")
        row = page.locator(f"tr[data-unit='{ns}/somewhere'] td")
        assert ns in await row.all_inner_texts()  # the namespace column
        assert "every namespace" in await page.inner_text("#who")


class _FullHeldBack(queuepage.QueuePages):
    """The dashboard's queue pages with the full page held back, as while 50,000 units are still
    being listed (docs/dashboard.md#the-first-page)."""

    def __init__(self, reader: Reader) -> None:
        super().__init__(reader)
        self.release = asyncio.Event()

    async def _full(self, namespace: str | None, limit: int) -> queuepage.Built:
        await self.release.wait()
        return await super()._full(namespace, limit)


async def test_the_early_page_is_the_visibility_apis_first_units_read_as_the_user(
    e2e_cluster: LocalCluster, stage: str
) -> None:
    ns = stage
    quota = f"{ns}-early"
    kube.kubectl(
        e2e_cluster,
        "apply",
        "-f",
        "-",
        input_text=json.dumps(
            {
                "apiVersion": f"{names.QUOTA_GROUP}/{names.QUOTA_VERSION}",
                "kind": "ElasticQuota",
                "metadata": {"name": quota, "namespace": ns},
                "spec": {"min": {"cpu": "1"}, "max": {"cpu": "1"}},
            }
        ),
    )
    for name, priority in (("early-low", 1), ("early-high", 5)):
        await tenancy.create_as(e2e_cluster, ns, job(name, quota, cpu="2", priority=priority))
    kubeconfig = e2e_cluster.kubeconfig_for("alice", user=tenancy.ALICE)

    async def parked() -> list[dict[str, Any]] | None:
        items = [i for i in plugin(kubeconfig, "-n", ns, "list")["items"] if i["queue"] == quota]
        return items if len(items) == 2 and all(i["position"] is not None for i in items) else None

    listed = {i["name"]: i for i in await kube.eventually(parked, timeout=60, what="two parked units")}
    client = await shared_kube.Kube.connect(kubeconfig=str(kubeconfig))
    pages = _FullHeldBack(Reader(client, "koord-queue-system"))
    try:
        body = orjson.loads((await pages.answer(ns, 50)).body)
        assert body["loading"] is True and body["positionsKnown"] is True
        (group,) = body["queues"]
        assert group["queue"] == quota
        assert [(r["name"], r["position"]) for r in group["units"]] == sorted(
            ((n, i["position"]) for n, i in listed.items()), key=lambda nr: nr[1]
        )
        for row in group["units"]:  # list's own row, its short reason marked as the "why"
            assert row["whyFrom"] == "list" and row["why"] == row["reason"] == listed[row["name"]]["reason"]
            assert row["job"] == listed[row["name"]]["job"]
        # another namespace's early page is refused as its full page is, and reads nothing there
        with pytest.raises(CliError) as refused:
            await pages.answer("kube-system", 50)
        assert "alice" in str(refused.value)
        pages.release.set()

        async def full() -> dict[str, Any] | None:
            answer = orjson.loads((await pages.answer(ns, 50)).body)
            return None if answer.get("loading") else dict(answer)

        whole = await kube.eventually(full, timeout=30, what="the full page")
        rows_by_name = {r["name"]: r for g in whole["queues"] for r in g["units"]}
        assert (
            rows_by_name["early-high"]["why"]
            == plugin(kubeconfig, "-n", ns, "explain", "early-high")["summary"]
        )
    finally:
        pages.release.set()
        await pages.close()
        await client.close()
