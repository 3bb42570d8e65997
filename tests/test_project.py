"""The project's set-up files agree with each other and with the README."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["dependencies"]) | set(project["optional-dependencies"]["test"])


def _environment_requirements() -> set[str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    pip_lines = [line.strip()[2:].strip() for line in lines[start + 1:] if line.strip().startswith("- ")]
    return {line for line in pip_lines if not line.startswith("-e")}


def test_environment_yml_lists_exactly_pyprojects_dependencies():
    assert _environment_requirements() == _pyproject_requirements()


def test_the_design_cards_packages_are_dependencies():
    names = {re.split(r"[<>=;\[ ]", r, maxsplit=1)[0] for r in _pyproject_requirements()}
    assert {"torch", "torchvision", "triton", "deepspeed", "jupyterlab", "ipywidgets", "matplotlib",
            "pandas", "nbval", "tqdm", "pytest"} <= names


def test_torch_is_a_range_so_an_installed_rocm_build_is_kept():
    torch_spec = next(r for r in _pyproject_requirements() if r.startswith("torch>") or r.startswith("torch="))
    assert torch_spec.startswith("torch>="), "a pin would make pip replace a site's ROCm PyTorch"


def test_ci_runs_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "bash course.sh test" in readme and "bash course.sh start" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec bash course\.sh test$", ci, flags=re.M)


def test_the_design_cards_layout_exists():
    for name in ("notebooks", "tinyllama", "inference", "solutions", "tests", "environment.yml", "README.md"):
        assert (ROOT / name).exists(), name


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_lock_pins_every_dependency_to_one_version_that_meets_pyprojects_range():
    """constraints.txt holds the tested version of every package set-up installs: each an exact pin,
    each of pyproject's dependencies among them, and each pin inside pyproject's range."""
    from packaging.requirements import Requirement

    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version and re.fullmatch(r"[A-Za-z0-9_.\-]+", name), f"not an exact pin: {line!r}"
            pins[_key(name)] = version
    for requirement in map(Requirement, _pyproject_requirements()):
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        assert _key(requirement.name) in pins, f"{requirement.name} is not in constraints.txt"
        assert requirement.specifier.contains(pins[_key(requirement.name)]), (requirement, pins[_key(requirement.name)])
    assert {"pytest", "pip", "jupyterlab", "nbval"} <= set(pins)


def test_set_up_installs_with_the_lock_and_keeps_what_the_site_has():
    script = (ROOT / "course.sh").read_text()
    assert '-c "$ROOT/constraints.txt" pip' in script and '-c "$constraints" -e ".[test]"' in script
    assert '[ constraints.txt -nt "$stamp" ]' in script  # a new lock re-installs


def test_set_up_on_a_disk_without_room_for_pytorch_stops_before_pip_and_says_what_to_do(tmp_path):
    """pip on a full disk stops half-way with an OSError and leaves a broken environment behind."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("course.sh", "pyproject.toml", "constraints.txt"):
        shutil.copy(ROOT / name, checkout / name)
    venv = tmp_path / "venv"  # a Python without PyTorch: set-up would install it
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    environment = {**os.environ, "WORKSHOP_VENV": str(venv), "WORKSHOP_SETUP_GIB": "1000000"}
    done = subprocess.run(["bash", str(checkout / "course.sh"), "setup"], capture_output=True, text=True,
                          timeout=60, env=environment)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "needs about 1000000 GiB free there" in done.stderr and "WORKSHOP_VENV=" in done.stderr
    assert "Installing" not in done.stdout and not (venv / ".installed").exists()
