"""The console and the API docs in a real headless Chromium against a real server (MiniLM).

Needs Debian's ``chromium`` and ``chromium-driver`` (``make test`` installs them as root). One browser
and one server are shared by the module. With ``CONSOLE_SCREENSHOTS=1`` the test also writes
the README's screenshots to ``docs/img/console/``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.server import Server, Servers

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
SHOTS = ROOT / "docs" / "img" / "console"
TOKEN = "console-s3cret"
WAIT_SECONDS = 30


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, minilm_cache: Path) -> Iterator[Server]:
    servers = Servers(tmp_path_factory.mktemp("console"), minilm_cache)
    try:
        # explore_share 0: the depths shown are the policy's own, so the margins match k
        # async_write_min_texts 10: the 18-tool upload is answered 202 with a job to poll
        yield servers.start(
            admin_token=TOKEN, prune_min_calls="2", explore_share="0", async_write_min_texts="10"
        )
    finally:
        servers.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    assert chromium and driver_path, "install Debian's chromium and chromium-driver (make test does as root)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1440,1000", "--force-device-scale-factor=1", "--lang=en-US"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver: webdriver.Chrome, condition: Callable[[Any], Any], what: str) -> Any:
    return WebDriverWait(driver, WAIT_SECONDS).until(condition, message=f"waiting for {what}")


class Network:
    """What the browser requested and got back, from Chrome's performance log (read on demand;
    Chrome hands each entry out once)."""

    def __init__(self, driver: webdriver.Chrome) -> None:
        self.driver = driver
        self.urls: list[str] = []
        self.responses: list[tuple[str, int]] = []

    def read(self) -> Network:
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                self.urls.append(message["params"]["request"]["url"])
            elif message["method"] == "Network.responseReceived":
                response = message["params"]["response"]
                self.responses.append((response["url"], int(response["status"])))
        return self


def assert_all_local(urls: list[str], server: Server) -> None:
    outside = [u for u in urls if not u.startswith((server.url, "data:", "blob:", "about:"))]
    assert urls and not outside, f"requests leaving the service: {outside}"


def shot(driver: webdriver.Chrome, name: str, height: int = 1000) -> None:
    if os.environ.get("CONSOLE_SCREENSHOTS") != "1":
        return
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.set_window_size(1440, height)
    driver.save_screenshot(str(SHOTS / f"{name}.png"))
    driver.set_window_size(1440, 1000)


def css(driver: webdriver.Chrome, selector: str) -> list[WebElement]:
    return driver.find_elements(By.CSS_SELECTOR, selector)


def texts(driver: webdriver.Chrome, selector: str) -> list[str]:
    """The visible text of every match, read in one script: the page re-renders lists, and an
    element found in one call may be replaced before the next."""
    return list(driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText.trim());",
        selector,
    ))


def text_of(driver: webdriver.Chrome, selector: str) -> str:
    found = texts(driver, selector)
    return found[0] if found else ""


def paste(driver: webdriver.Chrome, payload: Any, *, name: str, mode: str = "put") -> None:
    """Fill the upload form with ``payload`` pasted as JSON and submit it."""
    field = driver.find_element(By.ID, "upload-name")
    field.clear()
    field.send_keys(name)
    Select(driver.find_element(By.ID, "upload-mode")).select_by_value(mode)
    # set through JS: typing 2 KB of JSON key by key is slow and adds nothing
    box = driver.find_element(By.ID, "upload-json")
    driver.execute_script("arguments[0].value = arguments[1];", box, json.dumps(payload, indent=1))
    driver.find_element(By.CSS_SELECTOR, "#upload-form button[type=submit]").click()


def registry_row(driver: webdriver.Chrome, name: str) -> list[str]:
    return texts(driver, f'#registry-rows tr[data-registry="{name}"] td')


def click(driver: webdriver.Chrome, selector: str) -> bool:
    """Click the first match; False (to be retried) while it is missing or re-rendered away."""
    try:
        found = css(driver, selector)
        if found:
            found[0].click()
        return bool(found)
    except StaleElementReferenceException:
        return False


def tab(driver: webdriver.Chrome, name: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'.tabs button[data-tab="{name}"]').click()


@pytest.mark.parametrize(
    ("path", "rendered"),
    [
        ("/docs", ".opblock"),  # Swagger UI: one block per operation
        ("/redoc", '[id^="operation/"]'),  # ReDoc: one section per operation
    ],
)
def test_api_docs_render_offline(browser, server, path, rendered):
    Network(browser).read()  # drop what earlier pages asked for
    browser.get(server.url + path)
    operations = wait_for(browser, lambda d: len(css(d, rendered)) >= 10 and css(d, rendered), "operations")
    assert any("/shortlist" in op.get_attribute("textContent") for op in operations)
    assert_all_local(Network(browser).read().urls, server)
    if path == "/docs":
        shot(browser, "docs")


def test_console_upload_query_delete_report(browser, server):
    network = Network(browser).read()
    network.urls.clear()
    browser.get(server.url + "/")
    wait_for(browser, lambda d: d.current_url == server.url + "/console", "the redirect to /console")

    # Without the token the API refuses, and the page says what to do.
    flash = wait_for(browser, lambda d: d.find_element(By.ID, "flash").is_displayed() and d.find_element(By.ID, "flash"), "the 401")
    assert "token" in flash.text
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "#token-form button").click()
    wait_for(browser, lambda d: d.find_element(By.ID, "registries-empty").is_displayed(), "the empty list")
    assert browser.execute_script("return sessionStorage.getItem('tool-shortlist.token')") == TOKEN

    # A bad upload: the 422 names the bad tools, shown against each of them.
    good = {"name": "send_email", "description": "Send an email to a recipient."}
    paste(browser, [good, {"name": "", "description": 3}, {"function": 5}], name="office")
    bad_rows = wait_for(browser, lambda d: css(d, "#upload-result tr.bad"), "per-tool errors")
    assert [r.get_attribute("data-index") for r in bad_rows] == ["1", "2"]
    assert "must be a non-empty string" in bad_rows[0].text
    assert "function" in bad_rows[1].text
    assert "ok" in text_of(browser, '#upload-result tr[data-index="0"] .tool-error')
    assert "422" in text_of(browser, "#upload-result p.error")
    shot(browser, "upload-error", height=1150)

    # Upload by file, then add a tool and an equivalence group by paste (POST).
    browser.find_element(By.ID, "upload-file").send_keys(str(FIXTURES / "eval_office" / "tools.json"))
    wait_for(browser, lambda d: '"send_email"' in d.find_element(By.ID, "upload-json").get_attribute("value"), "the file")
    browser.find_element(By.CSS_SELECTOR, "#upload-form button[type=submit]").click()
    wait_for(browser, lambda d: registry_row(d, "office")[1:3] == ["1", "18"], "version 1 of office")
    # 18 new texts > SHORTLIST_ASYNC_WRITE_MIN_TEXTS: answered 202, the page polled the job
    network.read()
    assert (f"{server.url}/registries/office", 202) in network.responses
    assert any("/registries/office/jobs/" in url for url, status in network.responses if status == 200)
    extra = {
        "tools": [{"name": "send_mail_v2", "description": "Send an email message through the v2 mail API."}],
        "equivalents": [["send_email", "send_mail_v2"]],
    }
    paste(browser, extra, name="office", mode="post")
    wait_for(browser, lambda d: registry_row(d, "office")[1:3] == ["2", "19"], "version 2 of office")
    assert registry_row(browser, "office")[3].endswith("UTC")  # last write
    wait_for(browser, lambda d: "send_email ≡ send_mail_v2" in text_of(d, "#equivalents"), "the equivalents")
    assert len(texts(browser, "#tool-rows tr")) == 19
    shot(browser, "tools", height=1100)

    # The playground: the policy's list with k, p_rand, BoR ceiling and margins; fixed K beside it.
    tab(browser, "playground")
    browser.find_element(By.ID, "query").send_keys("email the quarterly report to bob@example.com")
    browser.find_element(By.CSS_SELECTOR, "#query-form button[type=submit]").click()
    wait_for(browser, lambda d: css(d, '#result-stats dd[data-stat="k"]'), "the shortlist")
    k = int(text_of(browser, '#result-stats dd[data-stat="k"]'))
    names = browser.execute_script(
        "return [...document.querySelectorAll('#result-tools li')].map((li) => li.dataset.tool);"
    )
    assert len(names) == k >= 1 and names[0] in ("send_email", "send_mail_v2")
    # the declared equivalent is folded into the same slot, not shown as a second tool
    other = "send_mail_v2" if names[0] == "send_email" else "send_email"
    assert other not in names and other in text_of(browser, "#result-tools li")
    assert float(text_of(browser, '#result-stats dd[data-stat="p_rand"]')) == pytest.approx(k / 19, abs=1e-4)
    assert text_of(browser, '#result-stats dd[data-stat="BoR ceiling"]').endswith("bits")
    margins = css(browser, "#margin-rows tr")
    chosen = css(browser, "#margin-rows tr.chosen")
    assert len(margins) == 9 and len(chosen) == 1  # 9 = half of 19: the deepest a policy may go
    assert chosen[0].get_attribute("data-depth") == str(k) and "chosen" in chosen[0].text
    assert len(texts(browser, "#fixed-tools li")) == 5
    assert text_of(browser, '#fixed-stats dd[data-stat="policy"]') == "fixed"
    shot(browser, "playground")
    # A higher depth_bias asks for more evidence before stopping: never a shorter list.
    bias = browser.find_element(By.ID, "depth-bias")
    bias.clear()
    bias.send_keys("3")
    browser.find_element(By.CSS_SELECTOR, "#query-form button[type=submit]").click()
    wait_for(browser, lambda d: text_of(d, '#result-stats dd[data-stat="depth_bias"]') == "3", "the biased list")
    assert int(text_of(browser, '#result-stats dd[data-stat="k"]')) >= k

    # Agents' feedback (through the API, as agents send it) feeds the report and the live window.
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for used, useful in (("translate_text", False), ("translate_text", False), ("send_email", True)):
        query = {"translate_text": "translate this into French", "send_email": "email bob"}[used]
        listed = httpx.post(f"{server.url}/shortlist", json={"registry": "office", "query": query, "k": 3}, headers=auth)
        sent = httpx.post(f"{server.url}/feedback", headers=auth, json={
            "shortlist_id": listed.json()["shortlist_id"], "used": [used],
            "calls": [{"tool": used, "useful": useful}],
        })
        assert sent.status_code == 200, sent.text

    # Delete a tool from the tools tab (after a confirmation).
    tab(browser, "tools")
    browser.find_element(By.CSS_SELECTOR, '#tool-rows tr[data-tool="start_video_call"] button').click()
    wait_for(browser, lambda d: d.switch_to.alert, "the confirmation").accept()
    wait_for(browser, lambda d: not css(d, '#tool-rows tr[data-tool="start_video_call"]'), "the deletion")
    wait_for(browser, lambda d: registry_row(d, "office")[1:3] == ["3", "18"], "version 3 of office")

    # The efficiency report with its prune candidates, and the live window.
    tab(browser, "report")
    wait_for(browser, lambda d: "translate_text" in text_of(d, "#prune"), "the prune candidates")
    assert "prune" in css(browser, '#report-rows tr[data-tool="translate_text"]')[0].get_attribute("class")
    assert "3 feedback events" in text_of(browser, "#report-meta")
    live = texts(browser, '#live-rows tr[data-match="exact"] td')
    assert live[1] == "3"  # events in the window
    assert int(live[2]) <= 3 and live[3] != "–"  # presented, and a rate
    shot(browser, "report")

    assert_all_local(network.read().urls, server)
    # the 401 and 422 the test provoked are logged by Chrome as failed loads; nothing else may be
    errors = [
        e for e in browser.get_log("browser")
        if e["level"] == "SEVERE" and not any(f"status of {s}" in e["message"] for s in (401, 422))
    ]
    assert not errors, errors


def test_deleting_a_tool_never_deletes_another_registry(browser, tmp_path_factory, minilm_cache):
    """Issue 23: a registry stored before names like ``../../victim2`` were refused at upload.
    Clicking delete on that tool used to send ``DELETE /registries/victim2`` (the browser
    resolves the dot segments) and delete registry ``victim2``."""
    from registry.store.base import RegistryRecord
    from registry.store.local import LocalStore
    from tests.conftest import weather_tools

    base = tmp_path_factory.mktemp("console-legacy")
    bad = ["../../victim2", "..", "%2e%2e/%2e%2e/victim2"]
    store = LocalStore(base / "data")
    store.save(RegistryRecord("legacy", 1, [*weather_tools(), *({"name": n} for n in bad)]))
    store.save(RegistryRecord("victim2", 1, weather_tools()))
    servers = Servers(base, minilm_cache)
    try:
        legacy = servers.start(admin_token=TOKEN)
        browser.get(legacy.url + "/console")
        wait_for(browser, lambda d: d.find_element(By.ID, "flash").is_displayed(), "the 401")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        browser.find_element(By.CSS_SELECTOR, "#token-form button").click()
        wait_for(browser, lambda d: registry_row(d, "victim2"), "the registries")
        browser.find_element(By.CSS_SELECTOR, '#registry-rows tr[data-registry="legacy"] a').click()
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for version, name in enumerate(bad, start=2):
            row = f'#tool-rows tr[data-tool="{name}"]'
            wait_for(browser, lambda d, row=row: click(d, row + " button"), f"a click on the row of {name}")
            wait_for(browser, lambda d: d.switch_to.alert, "the confirmation").accept()
            wait_for(browser, lambda d, v=version: registry_row(d, "legacy")[1:2] == [str(v)], f"version {version}")
            assert f"Deleted {name} from legacy." in text_of(browser, "#flash")
            listed = httpx.get(f"{legacy.url}/registries", headers=auth).json()["registries"]
            assert {r["registry"]: r["version"] for r in listed} == {"legacy": version, "victim2": 1}
        assert not css(browser, "#tool-rows tr[data-tool^='.']")
        assert len(css(browser, "#tool-rows tr")) == len(weather_tools())

        # The console's CSP is in force: markup that got onto the page could not run a script.
        ran = browser.execute_script(
            "const s = document.createElement('script'); s.textContent = 'window.__injected = 1';"
            "document.body.append(s); return window.__injected === 1;"
        )
        assert ran is False
        head = httpx.head(f"{legacy.url}/console")
        assert head.status_code == 200 and head.content == b""
        assert head.headers["x-frame-options"] == "DENY"
    finally:
        servers.close()
