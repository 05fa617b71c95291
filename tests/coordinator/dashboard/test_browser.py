"""The dashboard in a real headless Chromium (Debian's, installed by ``.ci/run``) against a
running service on real places: the map renders, a searched query shows its kNN, a new object
appears without a reload, and the page asks no host but the app's. Screenshots go to a temporary
directory, or to ``$KNNMON_SCREENSHOTS`` (``KNNMON_SCREENSHOTS=docs`` refreshes the README's)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="needs Debian's chromium: the test command installs it as root")


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    """Where the screenshots go: never into the checkout unless ``$KNNMON_SCREENSHOTS`` asks."""
    return Path(os.environ.get("KNNMON_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))


@pytest.fixture(scope="module")
def page(served):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        pg = browser.new_page(viewport={"width": 1280, "height": 800})
        pg.requests = []
        pg.on("request", lambda req: pg.requests.append(req.url))
        pg.errors = []
        pg.on("pageerror", lambda ex: pg.errors.append(str(ex)))
        pg.goto(served.http + "/", wait_until="networkidle")
        yield pg
        browser.close()


def _painted(page) -> int:
    """Distinct colours over the map's canvases (1 = blank)."""
    return page.evaluate("""() => {
        const seen = new Set();
        for (const c of document.querySelectorAll('#map canvas')) {
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            for (let i = 0; i < d.length; i += 4 * 97) seen.add(d[i] << 24 | d[i + 1] << 16 | d[i + 2] << 8 | d[i + 3]);
        }
        return seen.size;
    }""")


def test_the_map_renders_outlines_queries_and_worker_heat(page, served):
    page.wait_for_function("window.knnmon.queriesShown > 0", timeout=30_000)
    assert _painted(page) > 5
    assert "queries in view shown" in page.inner_text("#view")
    page.wait_for_selector("#workers tbody tr", timeout=30_000)  # the first status event
    assert page.locator("#workers tbody tr").count() == 2
    assert not page.errors


def test_searching_a_query_shows_its_knn_markers_and_table(page, served, shots):
    rows = served.queries.to_pylist()
    q = max(rows[:100], key=lambda r: (len(served.oracle().knn(r["lon"], r["lat"], r["keywords"], r["k"])), r["k"]))
    want = served.oracle().knn(q["lon"], q["lat"], q["keywords"], q["k"])
    assert len(want) >= 2
    page.fill("#search-box", q["id"])
    page.press("#search-box", "Enter")
    page.wait_for_function(f"document.querySelectorAll('.knn-result').length === {len(want)}", timeout=30_000)
    assert page.inner_text("#q-id") == q["id"]
    table = page.locator("#q-result tbody tr")
    assert table.count() == len(want)
    assert [table.nth(i).locator("td").nth(1).inner_text() for i in range(len(want))] == [o for o, _ in want]
    time.sleep(1.0)  # tiles of outline and markers settle
    page.screenshot(path=str(shots / "dashboard.png"))


def test_an_unknown_query_is_an_error_message_not_a_crash(page):
    page.fill("#search-box", "no-such-query")
    page.press("#search-box", "Enter")
    page.wait_for_selector("#error:not([hidden])", timeout=10_000)
    assert "no query" in page.inner_text("#error")


def test_a_newly_published_object_appears_without_a_reload(page, served, shots):
    obj = {"id": "browser-live-object", "lon": served.queries.column("lon")[1].as_py(),
           "lat": served.queries.column("lat")[1].as_py(), "t": int(time.time() * 1000), "keywords": ["zzqx"]}
    served.publish(obj)
    page.wait_for_function("[...document.querySelectorAll('#objects li')].some(li => li.textContent === "
                           "'browser-live-object')", timeout=30_000)
    page.screenshot(path=str(shots / "dashboard-live.png"))


def test_the_page_requests_no_other_host(page, served):
    app = urlparse(served.http).netloc
    hosts = {urlparse(u).netloc for u in page.requests if not u.startswith(("data:", "blob:"))}
    assert hosts == {app}, hosts
    assert len(page.requests) >= 8  # the page, its script and style, leaflet, outlines, the API
