"""The course as a participant meets it: JupyterLab in a real (headless) browser runs notebook 00
to its verdict and records the result in the participant's own results directory, and runs notebook
10 to its end as a participant who is stuck on every exercise would (``course.reveal`` in place of
each exercise cell).

Needs Debian's Chromium (`apt-get install -y chromium`) and Python Playwright (`pip install
playwright`; never `playwright install`); skipped with a message where either is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tinyllama.course.results import checkout_root

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(240)]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
NOTEBOOK = "00_environment_check.ipynb"
BASELINE = "10_tinyllama_baseline.ipynb"


def _missing() -> str | None:
    if not os.path.exists(CHROMIUM):
        return f"no browser at {CHROMIUM}: install Debian's Chromium with `apt-get install -y chromium`"
    if importlib.util.find_spec("playwright") is None:
        return "Python Playwright is not installed: `pip install playwright` (do not run `playwright install`)"
    if importlib.util.find_spec("jupyterlab") is None:
        return "JupyterLab is not installed: `pip install jupyterlab ipykernel ipywidgets`"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lab_command(port: int, token: str, root: Path) -> list[str]:
    """How a participant's JupyterLab is started, on loopback with a token."""
    return ([sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1", "--port", str(port),
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}"]
            + (["--allow-root"] if os.geteuid() == 0 else []))  # CI containers run as root


@pytest.fixture
def lab(tmp_path):
    """JupyterLab on loopback, serving a copy of the participant notebooks (so that autosave never
    touches the checkout), with Jupyter's own state and the results directory under ``tmp_path``."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "workspace"
    (root / "notebooks").mkdir(parents=True)
    shutil.copy(checkout_root() / "notebooks" / NOTEBOOK, root / "notebooks" / NOTEBOOK)
    _write_revealed(checkout_root() / "notebooks" / BASELINE, root / "notebooks" / BASELINE)
    env = {key: value for key, value in os.environ.items()
           if key not in ("WORKSHOP_PROFILE", "WORKSHOP_STRICT", "WORKSHOP_RUN_ID")}
    jupyter = tmp_path / "jupyter"
    env.update({
        "PYTHONPATH": os.pathsep.join(p for p in (str(checkout_root()), env.get("PYTHONPATH", "")) if p),
        "WORKSHOP_RESULTS_DIR": str(tmp_path / "results"),
        "JUPYTER_CONFIG_DIR": str(jupyter / "config"), "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(jupyter / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(jupyter / "workspaces"),
        "IPYTHONDIR": str(jupyter / "ipython"),
    })
    # No "official Jupyter news?" question over the notebook.
    news = jupyter / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True)
    news.write_text(json.dumps({"fetchNews": "false"}))
    port, token = _free_port(), secrets.token_hex(16)
    log = open(tmp_path / "jupyterlab.log", "w")
    server = subprocess.Popen(_lab_command(port, token, root), env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start:\n" + (tmp_path / "jupyterlab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield {"url": url, "token": token, "results": tmp_path / "results", "tmp": tmp_path, "root": root}
    finally:
        # SIGTERM makes the server shut its kernels down; SIGKILL to its process group (the server and
        # anything it started there) only if it does not stop in time.
        if server.poll() is None:
            server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def _write_revealed(source: Path, target: Path) -> list[str]:
    """Copy the participant notebook ``source`` to ``target`` with every exercise cell that would raise
    replaced by ``course.reveal("NN.k")``, as a participant who is stuck everywhere would run it.
    Exercises with a skeleton (predictions left as ``None``) stay as the participant gets them."""
    import nbformat

    nb = nbformat.read(source, as_version=4)
    revealed = []
    for cell in nb.cells:
        found = re.search(r'raise NotImplementedError\("exercise (\d\d\.\d+)', cell.source) if cell.cell_type == "code" else None
        if found:
            cell.source = f'course.reveal("{found.group(1)}")'
            revealed.append(found.group(1))
    nbformat.write(nb, target)
    return revealed


def _saved_outputs(path: Path, last: str, timeout: float = 60) -> str:
    """The text outputs of the notebook at ``path`` once its saved copy contains ``last``."""
    import nbformat

    deadline = time.monotonic() + timeout
    while True:
        nb = nbformat.read(path, as_version=4)
        text = "\n".join(str(output.get("text", "")) + str(output.get("data", {}).get("text/plain", ""))
                         + str(output.get("traceback", ""))
                         for cell in nb.cells if cell.cell_type == "code" for output in cell.outputs)
        if last in text or time.monotonic() > deadline:
            return text
        time.sleep(1)


def _open_and_run_all(page, lab, notebook: str) -> None:
    """Open the participant's ``notebook``, wait for its kernel, then Run > Run All Cells, answering a
    kernel question as a participant would."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.goto(f"{lab['url']}/lab/tree/notebooks/{notebook}?token={lab['token']}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    _wait_for_idle_kernel(lab, notebook=notebook)
    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    choose = page.locator(".jp-Dialog .jp-mod-accept")
    try:
        choose.wait_for(timeout=2_000)
        choose.click()
    except PlaywrightTimeout:
        pass


def _wait_for_idle_kernel(lab, timeout: float = 60, notebook: str = NOTEBOOK) -> None:
    """Until the notebook's kernel has started and is idle (the page's own indicator says "idle"
    before the kernel exists, so ask the server)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{lab['url']}/api/sessions?token={lab['token']}", timeout=5) as response:
            sessions = json.load(response)
        if any(s["path"].endswith(notebook) and s["kernel"]["execution_state"] == "idle" for s in sessions):
            return
        time.sleep(0.5)
    pytest.fail(f"the kernel of {notebook} did not become idle within {timeout:.0f} s")


def test_environment_check_runs_to_its_verdict_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    screenshot = lab["tmp"] / "00_environment_check.png"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            _open_and_run_all(page, lab, NOTEBOOK)
            verdict = page.locator(".jp-OutputArea-output", has_text="Environment verdict:").first
            verdict.wait_for(timeout=90_000)
            page.locator(".jp-OutputArea-output", has_text="Finished: deleted").first.wait_for(timeout=60_000)
            verdict.scroll_into_view_if_needed()
            text = verdict.inner_text()
            errors = page.locator(".jp-OutputArea-output", has_text="Traceback").count()
        finally:
            page.screenshot(path=str(screenshot))
            browser.close()
    print(f"screenshot: {screenshot}")
    assert "READY" in text and "NOT READY" not in text, text
    assert errors == 0
    # Run All recorded the figures in the participant's own results directory.
    records = [json.loads(line) for line in (lab["results"] / "results.jsonl").read_text().splitlines()]
    assert [r["notebook"] for r in records] == ["00_environment_check"]
    assert records[0]["profile"] == "ci" and records[0]["figures"]["matmul_fp32_tflops"] > 0


@pytest.mark.timeout(900)
def test_baseline_notebook_runs_to_its_end_with_revealed_answers(lab):
    """Notebook 10 as a stuck participant runs it: every exercise revealed, predictions left empty; it
    must reach its last cell with every check passing and no traceback."""
    from playwright.sync_api import sync_playwright

    screenshot = lab["tmp"] / "10_tinyllama_baseline.png"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            _open_and_run_all(page, lab, BASELINE)
            page.locator(".jp-OutputArea-output", has_text="Reference answer of exercise 10.1").first.wait_for(
                timeout=120_000)
            page.locator(".jp-OutputArea-output", has_text="PASS:").first.wait_for(timeout=120_000)
            finished = page.locator(".jp-OutputArea-output", has_text="Finished: deleted").first
            finished.wait_for(timeout=700_000)
            finished.scroll_into_view_if_needed()
            # JupyterLab renders only the cells in view: read the outputs from the saved notebook instead.
            page.locator(".jp-Notebook").first.click()
            page.keyboard.press("Control+s")
            text = _saved_outputs(lab["root"] / "notebooks" / BASELINE, "Finished: deleted")
        finally:
            page.screenshot(path=str(screenshot))
            browser.close()
    print(f"screenshot: {screenshot}")
    assert "Traceback" not in text, text[-3000:]
    assert "CHECK:" not in text, text
    assert text.count("PASS:") >= 8, text
    assert "no prediction was written" in text  # the participant's empty predictions are said so, not a crash
    records = [json.loads(line) for line in (lab["results"] / "results.jsonl").read_text().splitlines()]
    assert [r["notebook"] for r in records] == ["10_tinyllama_baseline"]
    assert records[0]["profile"] == "ci" and records[0]["figures"]["parameters"] == 102_720
