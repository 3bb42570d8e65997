"""The course as a participant meets it: JupyterLab in a real (headless) browser runs notebook 00
to its verdict and records the result in the participant's own results directory, as on a laptop and
as a JupyterHub user (the course's kernel registered by ``course.sh kernel`` from a shared installation,
the notebooks in their own folder); and runs notebook 10 to its end. A failed or unanswered exercise
stops "Run All" at its check, so both run as a participant who is stuck on every exercise would
(``course.reveal`` in place of each exercise cell).

Needs Debian's Chromium (`apt-get install -y chromium`) and Python Playwright (`pip install
playwright`; never `playwright install`); skipped with a message where either is missing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from hub_user import hub_environment, join_course, make_shared_venv

from tinyllama.course.jupyter_setup import KERNEL_DISPLAY_NAME, KERNEL_NAME, write_lab_settings
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


def _course_lab_settings(tmp_path: Path) -> Path:
    """A JupyterLab settings folder holding the course's settings, as set-up writes them into the
    JupyterLab it installs (and a hub's admin into the hub's): no news question over the notebook."""
    return write_lab_settings(tmp_path / "lab-prefix").parent


@contextlib.contextmanager
def _jupyterlab(root: Path, env: dict[str, str], tmp_path: Path) -> Iterator[dict]:
    """JupyterLab on loopback with a token, serving ``root``, with the course's JupyterLab settings; stopped
    (with its kernels) on exit."""
    port, token = _free_port(), secrets.token_hex(16)
    log_path = tmp_path / "jupyterlab.log"
    log = open(log_path, "w")
    command = _lab_command(port, token, root) + [f"--LabApp.app_settings_dir={_course_lab_settings(tmp_path)}"]
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start:\n" + log_path.read_text()[-3000:])
                time.sleep(0.5)
        yield {"url": url, "token": token, "tmp": tmp_path, "root": root}
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


def _register_course_kernel(data_dir: Path) -> None:
    """The course's kernel, running this Python, in the Jupyter data folder ``data_dir`` (as set-up registers
    it in the environment it installs)."""
    kernel = data_dir / "kernels" / KERNEL_NAME
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": KERNEL_DISPLAY_NAME, "language": "python"}))


@pytest.fixture
def lab(tmp_path):
    """JupyterLab on loopback, as ``course.sh start`` opens it on a laptop: serving a copy of the participant
    notebooks (so that autosave never touches the checkout), with Jupyter's own state, the course's kernel
    and the results directory under ``tmp_path``."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "workspace"
    (root / "notebooks").mkdir(parents=True)
    _write_revealed(checkout_root() / "notebooks" / NOTEBOOK, root / "notebooks" / NOTEBOOK, skeletons=True)
    _write_revealed(checkout_root() / "notebooks" / BASELINE, root / "notebooks" / BASELINE)
    env = {key: value for key, value in os.environ.items()
           if key not in ("WORKSHOP_PROFILE", "WORKSHOP_STRICT", "WORKSHOP_RUN_ID")}
    jupyter = tmp_path / "jupyter"
    _register_course_kernel(jupyter / "data")
    env.update({
        "PYTHONPATH": os.pathsep.join(p for p in (str(checkout_root()), env.get("PYTHONPATH", "")) if p),
        "WORKSHOP_RESULTS_DIR": str(tmp_path / "results"),
        "JUPYTER_CONFIG_DIR": str(jupyter / "config"), "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime"),
        "JUPYTER_DATA_DIR": str(jupyter / "data"),
        "JUPYTERLAB_SETTINGS_DIR": str(jupyter / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(jupyter / "workspaces"),
        "IPYTHONDIR": str(jupyter / "ipython"),
    })
    with _jupyterlab(root, env, tmp_path) as server:
        yield {**server, "results": tmp_path / "results", "folder": "notebooks"}


@pytest.fixture
def hub_lab(tmp_path):
    """JupyterLab as a JupyterHub user has it: the hub's JupyterLab (this Python) with the course's settings
    from the admin, serving the user's HOME; the course installed in a shared environment of its own; the
    user has run ``course.sh kernel``, which registered the course's kernel in their HOME and copied the
    notebooks to ~/tinyllama-workshop/notebooks. Nothing else is set for them."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    venv = tmp_path / "shared-venv"
    venv_python = make_shared_venv(venv)
    home = tmp_path / "home"
    joined = join_course(home, venv)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    copied = home / "tinyllama-workshop" / "notebooks" / NOTEBOOK  # the user's copy, as course.sh kernel made it
    _write_revealed(copied, copied, skeletons=True)
    env = hub_environment(home)
    # A hub's JupyterLab runs from an environment of its own, without the course's kernel; the JupyterLab
    # of these tests runs from the course's environment, where set-up registered that kernel too, and
    # Jupyter prefers an environment's kernels to the user's. Prefer the user's, as the hub's finds them.
    env["JUPYTER_PREFER_ENV_PATH"] = "0"
    # The checkout's code, not an older installed copy, in the kernels the server starts.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(checkout_root()), env.get("PYTHONPATH", "")) if p)
    with _jupyterlab(home, env, tmp_path) as server:
        yield {**server, "results": home / "tinyllama-workshop-results", "folder": "tinyllama-workshop/notebooks",
               "venv_python": venv_python}


def _write_revealed(source: Path, target: Path, skeletons: bool = False) -> list[str]:
    """Copy the participant notebook ``source`` to ``target`` with every exercise cell that would raise
    (``raise course.unanswered("NN.k")``) replaced by ``course.reveal("NN.k")``, as a participant who is
    stuck everywhere would run it. Exercises with a skeleton (``return None``, predictions left as
    ``None``) stay as the participant gets them, unless ``skeletons``: then every exercise of the
    solution notebook is revealed (their checks would stop "Run All")."""
    import nbformat

    from tinyllama.course.make_notebooks import exercises

    nb = nbformat.read(source, as_version=4)
    at: dict[int, str] = {}
    if skeletons:
        solution = checkout_root() / "solutions" / source.name
        at = {cell: exercise for exercise, (cell, _) in exercises(nbformat.read(solution, as_version=4),
                                                                  solution.stem).items()}
    revealed = []
    for index, cell in enumerate(nb.cells):
        found = re.search(r'raise course\.unanswered\("(\d\d\.\d+)"\)', cell.source) if cell.cell_type == "code" else None
        exercise = found.group(1) if found else at.get(index)
        if exercise is not None:
            cell.source = f'course.reveal("{exercise}")'
            revealed.append(exercise)
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

    page.goto(f"{lab['url']}/lab/tree/{lab['folder']}/{notebook}?token={lab['token']}")
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


NEWS_QUESTION = "official Jupyter news"


def _run_environment_check(lab) -> dict:
    """Notebook 00 run in the browser to its verdict: the verdict's text, the tracebacks shown, the kernel
    the notebook's toolbar names, and whether JupyterLab asked its news question meanwhile."""
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
            seen = {"verdict": verdict.inner_text(),
                    "tracebacks": page.locator(".jp-OutputArea-output", has_text="Traceback").count(),
                    "kernel": page.locator(".jp-NotebookPanel-toolbar .jp-KernelName").first.inner_text().strip(),
                    "news question": page.get_by_text(NEWS_QUESTION).count()}
        finally:
            page.screenshot(path=str(screenshot))
            browser.close()
    print(f"screenshot: {screenshot}")
    return seen


def _recorded(lab) -> list[dict]:
    return [json.loads(line) for line in (lab["results"] / "results.jsonl").read_text().splitlines()]


def _api(lab, path: str):
    with urllib.request.urlopen(f"{lab['url']}{path}?token={lab['token']}", timeout=10) as response:
        return json.load(response)


def test_environment_check_runs_to_its_verdict_in_jupyterlab(lab):
    seen = _run_environment_check(lab)
    assert "READY" in seen["verdict"] and "NOT READY" not in seen["verdict"], seen
    assert seen["tracebacks"] == 0 and seen["kernel"] == KERNEL_DISPLAY_NAME and seen["news question"] == 0, seen
    # Run All recorded the figures in the participant's own results directory.
    records = _recorded(lab)
    assert [r["notebook"] for r in records] == ["00_environment_check"]
    assert records[0]["profile"] == "ci" and records[0]["figures"]["matmul_fp32_tflops"] > 0


def test_a_hub_user_runs_the_environment_check_in_the_course_kernel(hub_lab):
    """The hub path: the notebook opened from the user's own folder starts the course's kernel (which runs
    the shared installation's Python, not the server's), runs to its verdict, and records in the user's
    HOME; the course's JupyterLab settings kept the news question away."""
    seen = _run_environment_check(hub_lab)
    assert seen["kernel"] == KERNEL_DISPLAY_NAME, seen  # not "Python 3 (ipykernel)"
    sessions = _api(hub_lab, "/api/sessions")
    assert [s["kernel"]["name"] for s in sessions if s["path"].endswith(NOTEBOOK)] == [KERNEL_NAME]
    assert sessions[0]["path"] == f"tinyllama-workshop/notebooks/{NOTEBOOK}"
    spec = _api(hub_lab, "/api/kernelspecs")["kernelspecs"][KERNEL_NAME]["spec"]
    assert spec["argv"][0] == str(hub_lab["venv_python"]) != sys.executable
    assert "READY" in seen["verdict"] and "NOT READY" not in seen["verdict"], seen
    assert seen["tracebacks"] == 0, seen
    assert seen["news question"] == 0, seen
    news = _api(hub_lab, "/lab/api/settings/@jupyterlab/apputils-extension:notification")
    # The course's settings made "Never" the default; the user set nothing.
    assert news["schema"]["properties"]["fetchNews"]["default"] == "false" and "fetchNews" not in news["settings"]
    assert [r["notebook"] for r in _recorded(hub_lab)] == ["00_environment_check"]


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
            text = _saved_outputs(lab["root"] / lab["folder"] / BASELINE, "Finished: deleted")
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
