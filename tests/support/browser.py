"""Headless Chromium (Debian's `chromium` and `chromium-driver`) driven by Selenium, for the console.

    browser = start_browser(certs)   # trusts exactly the serving key of `certs`, nothing else
    page = await Page.open(browser, "https://localhost:8443/ui/")
    ...
    browser.quit()

Selenium's calls block, so `Page` runs each of them on a thread: the server under test shares the
test's event loop. `missing_browser()` says why the browser tests cannot run here (they skip).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from cryptography.hazmat.primitives import serialization
from cryptography.x509 import load_pem_x509_certificate

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
T = TypeVar("T")
NAVIGATION_TIMEOUT_S = 30  # generous: the machine is shared and the server runs in the test's loop


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.exists():
            return f"{path} is missing (apt-get install chromium chromium-driver; .ci/run installs them)"
    return None


def spki_hash(cert_pem: bytes) -> str:
    """base64(SHA-256(SubjectPublicKeyInfo)): what Chromium's --ignore-certificate-errors-spki-list takes."""
    key = load_pem_x509_certificate(cert_pem).public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


@dataclass
class Browser:
    driver: Any
    profile: Path

    def quit(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)


def start_browser(serving_cert_pem: bytes, *, width: int = 1280, height: int = 1000) -> Browser:
    """A fresh profile that accepts the one serving certificate's key (no CA is installed)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = Path(tempfile.mkdtemp(prefix="console-browser-"))
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--ignore-certificate-errors-spki-list={spki_hash(serving_cert_pem)}")
    options.add_argument(f"--window-size={width},{height}")
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    return Browser(driver, profile)


class Page:
    """The browser's current page, read through Selenium on a worker thread."""

    def __init__(self, browser: Browser, base_url: str) -> None:
        self.browser = browser
        self.base_url = base_url.rstrip("/")

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(call, *args)

    async def open(self, path: str) -> None:
        await self.run(self.browser.driver.get, self.base_url + path)

    async def title(self) -> str:
        return await self.run(lambda: self.browser.driver.title)

    async def path(self) -> str:
        from urllib.parse import urlsplit

        url = await self.run(lambda: self.browser.driver.current_url)
        parts = urlsplit(url)
        return parts.path + (f"?{parts.query}" if parts.query else "")

    async def texts(self, css: str) -> list[str]:
        from selenium.webdriver.common.by import By

        return await self.run(lambda: [e.text for e in self.browser.driver.find_elements(By.CSS_SELECTOR, css)])

    async def text(self, css: str) -> str:
        found = await self.texts(css)
        assert len(found) == 1, (css, found)
        return found[0]

    async def attributes(self, css: str, name: str) -> list[str | None]:
        from selenium.webdriver.common.by import By

        return await self.run(
            lambda: [e.get_attribute(name) for e in self.browser.driver.find_elements(By.CSS_SELECTOR, css)]
        )

    async def fill(self, css: str, value: str) -> None:
        from selenium.webdriver.common.by import By

        def fill() -> None:
            element = self.browser.driver.find_element(By.CSS_SELECTOR, css)
            element.clear()
            element.send_keys(value)

        await self.run(fill)

    def _following(self, act: Callable[[], None]) -> None:
        """Do `act`, which loads another page, and return once that page has loaded: a click may
        return before the old page is gone, and reading it then reads the old one."""
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        driver = self.browser.driver
        old = driver.find_element(By.TAG_NAME, "html")
        act()

        def old_page_gone(_: Any) -> bool:
            try:
                old.is_enabled()
            except WebDriverException:
                # Stale, or (chromedriver, mid-navigation) "node does not belong to the document".
                return True
            return False

        # Mid-navigation a script may fail to run; that is "not loaded yet", not an error.
        wait = WebDriverWait(driver, NAVIGATION_TIMEOUT_S, ignored_exceptions=(WebDriverException,))
        wait.until(old_page_gone)
        wait.until(lambda d: d.execute_script("return document.readyState") == "complete")

    async def click(self, css: str) -> None:
        """Click a link or a submit button and wait for the page it loads."""
        from selenium.webdriver.common.by import By

        await self.run(self._following, lambda: self.browser.driver.find_element(By.CSS_SELECTOR, css).click())

    async def keys(self, *keys: str, navigates: bool = False) -> None:
        """Type into whatever has the focus (`navigates`: the keys load another page; wait for it)."""
        from selenium.webdriver.common.action_chains import ActionChains

        def press() -> None:
            ActionChains(self.browser.driver).send_keys(*keys).perform()

        await self.run(self._following, press) if navigates else await self.run(press)

    async def focused(self) -> dict[str, str | None]:
        def read() -> dict[str, str | None]:
            element = self.browser.driver.switch_to.active_element
            return {name: element.get_attribute(name) for name in ("id", "name", "type", "href")} | {
                "tag": element.tag_name,
                "text": element.text,
            }

        return await self.run(read)

    async def screenshot(self, out: Path, *, width: int = 1280) -> None:
        def shoot() -> None:
            driver = self.browser.driver
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(width, min(max(int(height) + 40, 600), 3000))
            driver.save_screenshot(str(out))
            driver.set_window_size(1280, 1000)

        await self.run(shoot)
