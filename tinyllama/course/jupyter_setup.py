"""The course's place in Jupyter: its kernel, the import guard of every notebook, JupyterLab's settings.

Every notebook names the course's kernel (:data:`KERNELSPEC`), never ``python3``: on a JupyterHub the
hub's own Python has none of the course's packages. ``bash course.sh kernel`` registers that kernel
for a user (from the shared installation on a hub), and ``python -m tinyllama.course.make_notebooks``
writes it into every notebook, together with the first cell's import guard (:data:`IMPORT_GUARD`),
whose message says what to do where the notebook opened in another kernel.

    python -m tinyllama.course.jupyter_setup lab-settings [--prefix PREFIX]

writes the course's JupyterLab settings (no "official Jupyter news?" question over the notebooks) as
defaults of the JupyterLab installed under ``PREFIX`` (default: this Python's), merged into its
``share/jupyter/lab/settings/overrides.json``. A participant's own settings still take precedence.
This module needs nothing but the standard library.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

KERNEL_NAME = "tinyllama-workshop"
KERNEL_DISPLAY_NAME = "TinyLLaMA workshop"
KERNELSPEC: dict[str, str] = {"name": KERNEL_NAME, "display_name": KERNEL_DISPLAY_NAME, "language": "python"}

# "Never" fetch news: without it JupyterLab asks every new user whether to fetch Jupyter news, in a
# pop-up over the first notebook. checkForUpdates only acts when news are fetched; off for clarity.
LAB_SETTINGS: dict[str, dict[str, Any]] = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}

# The first lines of every notebook's first code cell. A notebook opened in a kernel without the course's
# packages (a hub's default "Python 3") stops here with what to do, on a hub and on a laptop.
IMPORT_GUARD = '''\
try:
    from tinyllama import course
except ImportError as error:
    raise ImportError(
        "This notebook runs in a kernel without the course's packages. Choose the kernel "
        "\\"TinyLLaMA workshop\\" (Kernel > Change Kernel...). Not in the list? On a JupyterHub, run "
        "`bash <course checkout>/course.sh kernel` once in a terminal (your instructor gives the path), then "
        "reload this page; on your own computer, open the notebooks with `bash course.sh start` in the "
        "course checkout.") from error
'''


def lab_settings_file(prefix: str | Path) -> Path:
    """Where the JupyterLab installed under ``prefix`` reads its default settings (overrides.json)."""
    return Path(prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"


def write_lab_settings(prefix: str | Path = sys.prefix) -> Path:
    """Merge :data:`LAB_SETTINGS` into the overrides of the JupyterLab under ``prefix``; other settings
    in that file are kept. Returns the file's path."""
    path = lab_settings_file(prefix)
    settings: dict[str, Any] = {}
    if path.exists():
        try:
            settings = json.loads(path.read_text(encoding="utf-8") or "{}")
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON ({error}): fix or remove it, then run this again") from None
    for plugin, values in LAB_SETTINGS.items():
        settings.setdefault(plugin, {}).update(values)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return path


def registered_kernels() -> set[str]:
    """The names of the Jupyter kernels this Python's Jupyter finds (user, environment and system)."""
    from jupyter_client.kernelspec import KernelSpecManager

    return set(KernelSpecManager().find_kernel_specs())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinyllama.course.jupyter_setup",
                                     description="Write the course's JupyterLab settings.")
    commands = parser.add_subparsers(dest="command", required=True)
    lab = commands.add_parser("lab-settings", help="turn JupyterLab's news question off, for every user of "
                                                   "the JupyterLab under --prefix")
    lab.add_argument("--prefix", default=sys.prefix,
                     help="the environment JupyterLab runs from (default: this Python's, %(default)s)")
    args = parser.parse_args(argv)
    try:
        path = write_lab_settings(args.prefix)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"JupyterLab settings of the course written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
