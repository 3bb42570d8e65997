"""The project's set-up files agree with each other and with the README."""

import re
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
