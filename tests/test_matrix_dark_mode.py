"""The matrix page follows Airflow's theme, in headless Chromium on a real api-server.

Airflow 3.3.2 switches its color mode from the user menu ("Dark Mode" / "Light Mode") and
keeps it with next-themes (``class="dark"`` on the document element, the choice in
localStorage ``theme``). The view (static/matrix-view.js) mirrors it onto the shadow root's
host, and the page's CSS (ui/theme.py) turns dark with it, also while the page is shown. The
page opened on its own follows the browser's ``prefers-color-scheme``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_matrix_page_server import (  # noqa: F401 - `site` is a fixture used below
    COLOURS,
    Site,
    _browser,
    _login,
    _shadow,
    _wait,
    site,
)

pytestmark = pytest.mark.integration

DARK_CELLS = {
    "passed": "rgba(28, 69, 50, 1)",
    "failed": "rgba(130, 39, 39, 1)",
    "infra": "rgba(123, 52, 30, 1)",
    "quarantined": "rgba(68, 51, 122, 1)",
    "flaky": "rgba(116, 66, 16, 1)",
    "excluded": "rgba(45, 55, 72, 1)",
}
DARK_PAGE = "rgba(26, 32, 44, 1)"
LIGHT_PAGE = "rgba(255, 255, 255, 1)"


def _colours(root) -> dict[str, str]:  # noqa: ANN001
    from selenium.webdriver.common.by import By

    return {
        td.get_attribute("data-kind"): td.value_of_css_property("background-color")
        for td in root.find_elements(By.CSS_SELECTOR, "td.cell[data-cell-id]")
    }


def _emulate_dark_system(driver) -> None:  # noqa: ANN001
    driver.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": "dark"}]},
    )


def test_matrix_follows_airflows_theme(site: Site, tmp_path: Path) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    driver = _browser(tmp_path)
    try:
        _login(driver, site)
        # Airflow set to light explicitly, on a system that prefers dark: the view is light
        # (only Airflow's choice counts inside Airflow).
        _emulate_dark_system(driver)
        driver.execute_script("localStorage.setItem('theme', 'light')")
        driver.get(f"{site.base}/plugin/accelmatrix/suites/demo")
        _wait(lambda: len(_shadow(driver).find_elements(By.CSS_SELECTOR, "td.cell")) == 6)
        host = driver.find_element(By.ID, "accelmatrix-view")
        assert host.get_attribute("data-theme") == "light"
        assert host.value_of_css_property("background-color") == LIGHT_PAGE
        light = _colours(_shadow(driver))
        assert light == {k: COLOURS[k] for k in light}

        # The user switches Airflow to dark mode from its user menu: the page follows at once.
        user = "//button[normalize-space()='User' or .//*[normalize-space()='User']]"
        _wait(lambda: driver.find_element(By.XPATH, user)).click()
        _wait(
            lambda: driver.find_element(
                By.XPATH, "//*[@role='menuitem'][contains(., 'Appearance')]"
            )
        ).click()
        try:
            item = _wait(
                lambda: driver.find_element(
                    By.XPATH, "//*[starts-with(@role, 'menuitem')][contains(., 'Dark')]"
                )
            )
        except TimeoutError:
            (tmp_path / "menu.html").write_text(driver.page_source)
            raise
        item.click()
        _wait(lambda: "dark" in driver.find_element(By.TAG_NAME, "html").get_attribute("class"))
        _wait(lambda: host.get_attribute("data-theme") == "dark")
        root = _shadow(driver)
        assert host.value_of_css_property("background-color") == DARK_PAGE
        assert _colours(root) == {k: DARK_CELLS[k] for k in light}
        why = root.find_element(By.CSS_SELECTOR, "td[data-cell-id='model=a,config=y'] .why")
        assert why.value_of_css_property("color") == "rgba(226, 232, 240, 1)"
        th = root.find_element(By.CSS_SELECTOR, "table.grid th.col")
        assert th.value_of_css_property("background-color") == "rgba(45, 55, 72, 1)"
        driver.save_screenshot(str(tmp_path / "matrix-dark.png"))

        # Kept across pages and reloads (Airflow stores the choice), and back to light.
        driver.get(f"{site.base}/plugin/accelmatrix/suites/demo")
        _wait(lambda: len(_shadow(driver).find_elements(By.CSS_SELECTOR, "td.cell")) == 6)
        host = driver.find_element(By.ID, "accelmatrix-view")
        _wait(lambda: host.get_attribute("data-theme") == "dark")
        assert _colours(_shadow(driver))["failed"] == DARK_CELLS["failed"]
        driver.execute_script(
            "document.documentElement.classList.replace('dark', 'light')"
        )  # what next-themes does when the user picks light
        _wait(lambda: host.get_attribute("data-theme") == "light")
        assert _colours(_shadow(driver))["failed"] == COLOURS["failed"]

        # The page on its own follows the system's preference.
        driver.get(f"{site.base}/accelmatrix/suites/demo")
        body = _wait(lambda: driver.find_element(By.TAG_NAME, "body"))
        assert body.value_of_css_property("background-color") == DARK_PAGE
        td = driver.find_element(By.CSS_SELECTOR, "td[data-kind=passed]")
        assert td.value_of_css_property("background-color") == DARK_CELLS["passed"]
        driver.execute_cdp_cmd(
            "Emulation.setEmulatedMedia",
            {"features": [{"name": "prefers-color-scheme", "value": "light"}]},
        )
        td = driver.find_element(By.CSS_SELECTOR, "td[data-kind=passed]")
        assert td.value_of_css_property("background-color") == COLOURS["passed"]
    finally:
        driver.quit()
