"""A JupyterHub user's situation, built in a temporary folder for the tests: a shared installation the
admin made (a virtual environment that is not the one running the tests), and a user's HOME in which
``course.sh kernel`` registers the course's kernel and copies the notebooks."""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

from tinyllama.course.results import checkout_root

# Variables that would send Jupyter's files somewhere else than the user's HOME.
JUPYTER_VARIABLES = ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_PATH",
                     "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR", "IPYTHONDIR", "WORKSHOP_WORKSPACE",
                     "WORKSHOP_VENV", "WORKSHOP_RESULTS_DIR", "WORKSHOP_PROFILE", "WORKSHOP_STRICT", "WORKSHOP_RUN_ID")


def make_shared_venv(path: Path) -> Path:
    """A virtual environment at ``path`` that sees this Python's packages (as the admin's installation
    has them) and is marked installed, as ``course.sh setup`` leaves it; its own ``bin/python``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    # addsitedir (not a bare path) so that the .pth files there (editable installs) count as well.
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    Path(purelib, "workshop-packages.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs if os.path.isdir(d)))
    (path / ".installed").touch()
    return python


def hub_environment(home: Path, venv: Path | None = None) -> dict[str, str]:
    """The environment of a hub user whose HOME is ``home`` (the course installed in ``venv``)."""
    env = {key: value for key, value in os.environ.items() if key not in JUPYTER_VARIABLES}
    env["HOME"] = str(home)
    if venv is not None:
        env["WORKSHOP_VENV"] = str(venv)
    return env


def join_course(home: Path, venv: Path | None, timeout: float = 180,
                checkout: Path | None = None) -> subprocess.CompletedProcess:
    """What a participant runs once in a terminal of the hub: ``bash <checkout>/course.sh kernel``
    (from their HOME, not from the checkout); ``venv`` ``None``: without naming the installation."""
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["bash", str((checkout or checkout_root()) / "course.sh"), "kernel"], cwd=home,
                          env=hub_environment(home, venv), capture_output=True, text=True, timeout=timeout)
