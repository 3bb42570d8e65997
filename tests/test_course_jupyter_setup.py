"""The course in Jupyter: every notebook names the course's kernel and starts with the import guard;
``course.sh kernel`` gives a hub user that kernel (from the shared installation) and their own copies of
the notebooks; JupyterLab's news question is off in the course's settings."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from hub_user import hub_environment, join_course, make_shared_venv
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from tinyllama.course import jupyter_setup as js
from tinyllama.course import make_notebooks as mk
from tinyllama.course.results import checkout_root

ROOT = checkout_root()
ALL_NOTEBOOKS = sorted((ROOT / "solutions").glob("*.ipynb")) + sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_notebook_runs_in_the_course_kernel_behind_the_import_guard(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.kernelspec == js.KERNELSPEC, \
        f"{path.name} names the kernel {nb.metadata.kernelspec}: run python -m tinyllama.course.make_notebooks"
    first = next(cell for cell in nb.cells if cell.cell_type == "code")
    assert first.source.startswith(js.IMPORT_GUARD), f"{path.name}: run python -m tinyllama.course.make_notebooks"


def test_the_import_guard_says_what_to_do_on_a_hub_and_on_a_laptop():
    namespace: dict = {}
    real = sys.modules.get("tinyllama")
    sys.modules["tinyllama"] = None  # type: ignore[assignment]  # as in a kernel without the course
    try:
        with pytest.raises(ImportError) as raised:
            exec(compile(js.IMPORT_GUARD, "first cell", "exec"), namespace)
    finally:
        sys.modules["tinyllama"] = real  # type: ignore[assignment]
    message = str(raised.value)
    assert '"TinyLLaMA workshop"' in message and "Change Kernel" in message
    assert "JupyterHub, run `bash <course checkout>/course.sh kernel`" in message
    assert "your own computer, open the notebooks with `bash course.sh start`" in message


def test_the_generator_writes_the_kernel_and_replaces_any_guard():
    old_guard = ('try:\n    from tinyllama import course\nexcept ImportError as error:\n'
                 '    raise ImportError("start JupyterLab with "\n                      "course.sh start") from error\n'
                 '\nsession = course.start("99_x")')
    for source, rest in [(old_guard, 'session = course.start("99_x")'),
                         ('import math\nfrom tinyllama import course\nsession = course.start("99_x")',
                          'import math\nsession = course.start("99_x")')]:
        nb = new_notebook(cells=[new_markdown_cell("# 99"), new_code_cell(source)],
                          metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
        fixed = mk.with_course_kernel(nb)
        assert fixed.metadata.kernelspec == js.KERNELSPEC
        assert fixed.cells[1].source == js.IMPORT_GUARD + "\n" + rest
        assert mk.with_course_kernel(fixed).cells[1].source == fixed.cells[1].source  # once is enough
        participant = mk.participant_notebook(nb, "99_x.ipynb")
        assert participant.metadata.kernelspec == js.KERNELSPEC
        assert participant.cells[1].source.startswith(js.IMPORT_GUARD)


def test_a_solution_without_the_course_kernel_is_stale_and_fixed_with_its_outputs(tmp_path, capsys):
    solutions, notebooks = tmp_path / "solutions", tmp_path / "notebooks"
    solutions.mkdir()
    cell = new_code_cell("from tinyllama import course\nprint(1)", execution_count=1,
                         outputs=[nbformat.v4.new_output("stream", name="stdout", text="1\n")])
    nbformat.write(new_notebook(cells=[cell], metadata={"kernelspec": {"name": "python3", "display_name": "P",
                                                                       "language": "python"}}),
                   solutions / "99_x.ipynb")
    assert mk.main(["--solutions", str(solutions), "--notebooks", str(notebooks), "--check"]) == 1
    assert "out of date: solutions/99_x.ipynb: lacks the course's kernel or import guard" in capsys.readouterr().err
    assert mk.main(["--solutions", str(solutions), "--notebooks", str(notebooks)]) == 0
    fixed = nbformat.read(solutions / "99_x.ipynb", as_version=4)
    assert fixed.metadata.kernelspec == js.KERNELSPEC and fixed.cells[0].outputs[0].text == "1\n"
    assert mk.main(["--solutions", str(solutions), "--notebooks", str(notebooks), "--check"]) == 0


def test_course_sh_registers_the_kernel_every_notebook_names():
    script = (ROOT / "course.sh").read_text()
    assert re.search(r"^KERNEL_NAME=(\S+)", script, re.MULTILINE).group(1) == js.KERNEL_NAME
    assert re.search(r'^KERNEL_DISPLAY="([^"]+)"', script, re.MULTILINE).group(1) == js.KERNEL_DISPLAY_NAME
    assert "-m tinyllama.course.jupyter_setup lab-settings" in script  # set-up writes JupyterLab's settings


def test_lab_settings_turn_the_news_question_off_and_keep_other_settings(tmp_path):
    path = js.lab_settings_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"},
                                "@jupyterlab/apputils-extension:notification": {"doNotDisturbMode": True}}))
    assert js.main(["lab-settings", "--prefix", str(tmp_path)]) == 0
    written = json.loads(path.read_text())
    assert written["@jupyterlab/apputils-extension:themes"] == {"theme": "JupyterLab Dark"}
    assert written["@jupyterlab/apputils-extension:notification"] == {
        "doNotDisturbMode": True, "fetchNews": "false", "checkForUpdates": False}
    path.write_text("{not json")
    assert js.main(["lab-settings", "--prefix", str(tmp_path)]) == 1


def test_the_lab_settings_are_jupyterlabs_own():
    """The plugin and its values exist in the installed JupyterLab's schema ("false" is "Never")."""
    schemas = Path(sys.prefix, "share", "jupyter", "lab", "schemas")
    if not schemas.is_dir():
        pytest.skip(f"no JupyterLab schemas under {sys.prefix}")
    for plugin, values in js.LAB_SETTINGS.items():
        package, name = plugin.split(":")
        schema = json.loads((schemas / package / f"{name}.json").read_text())
        for key, value in values.items():
            field = schema["properties"][key]
            allowed = [choice["const"] for choice in field.get("oneOf", [])]
            assert value in allowed if allowed else isinstance(value, bool) == (field["type"] == "boolean")
    assert "false" in [c["const"] for c in schema["properties"]["fetchNews"]["oneOf"] if c["title"] == "Never"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_hub_user_gets_the_shared_kernel_and_own_notebooks_that_are_never_overwritten(tmp_path):
    venv_python = make_shared_venv(tmp_path / "shared-venv")
    home = tmp_path / "home"
    done = join_course(home, tmp_path / "shared-venv")
    assert done.returncode == 0, done.stdout + done.stderr
    spec = json.loads((home / ".local/share/jupyter/kernels" / js.KERNEL_NAME / "kernel.json").read_text())
    assert spec["argv"][0] == str(venv_python) and spec["display_name"] == js.KERNEL_DISPLAY_NAME
    copies = home / "tinyllama-workshop" / "notebooks"
    assert sorted(p.name for p in copies.glob("*.ipynb")) == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert "Kernel 'TinyLLaMA workshop' registered" in done.stdout
    # The participant's work survives the command run again (after a course update, say).
    mine = copies / "00_environment_check.ipynb"
    mine.write_text(mine.read_text().replace("Environment check", "My environment check"))
    again = join_course(home, tmp_path / "shared-venv")
    assert again.returncode == 0, again.stderr
    assert "My environment check" in mine.read_text() and "0 copied" in again.stdout
    assert not (ROOT / ".workshop-venv").exists() or (ROOT / ".workshop-venv").read_text().strip() != str(
        tmp_path / "shared-venv")  # a participant's command installs nothing and records nothing in the checkout


def test_a_hub_user_without_an_installation_is_told_who_installs_it(tmp_path):
    done = join_course(tmp_path / "home", tmp_path / "no-such-folder" / "venv", timeout=60)
    assert done.returncode == 1
    assert "the course is not installed in" in done.stderr and "course.sh setup" in done.stderr
    assert not (tmp_path / "home" / "tinyllama-workshop").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_admins_shared_installation_is_remembered_for_the_participants(tmp_path):
    """``WORKSHOP_VENV=... course.sh setup`` (a relative path, given from elsewhere) records the shared
    environment in the checkout; a participant's ``course.sh kernel`` then finds it without naming it."""
    checkout = tmp_path / "checkout"
    (checkout / "notebooks").mkdir(parents=True)
    for name in ("course.sh", "pyproject.toml"):
        shutil.copy(ROOT / name, checkout / name)
    shutil.copy(ROOT / "notebooks" / "00_environment_check.ipynb", checkout / "notebooks")
    venv_python = make_shared_venv(tmp_path / "opt" / "venv")  # installed after pyproject.toml: up to date
    admin = subprocess.run(["bash", str(checkout / "course.sh"), "setup"], cwd=tmp_path / "opt", capture_output=True,
                           text=True, timeout=120, env={**hub_environment(tmp_path / "admin"), "WORKSHOP_VENV": "venv"})
    assert admin.returncode == 0, admin.stdout + admin.stderr
    assert (checkout / ".workshop-venv").read_text().strip() == str(tmp_path / "opt" / "venv")
    home = tmp_path / "home"
    done = join_course(home, None, checkout=checkout)
    assert done.returncode == 0, done.stdout + done.stderr
    spec = json.loads((home / ".local/share/jupyter/kernels" / js.KERNEL_NAME / "kernel.json").read_text())
    assert spec["argv"][0] == str(venv_python)
    assert [p.name for p in (home / "tinyllama-workshop" / "notebooks").iterdir()] == ["00_environment_check.ipynb"]
