"""The notebooks import from the public surface only (README, "Layout"), and its lazy names resolve."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
SURFACE = {"tinyllama", "tinyllama.course", "tinyllama.config", "tinyllama.device", "tinyllama.timing",
           "tinyllama.models", "tinyllama.kernels", "tinyllama.training", "tinyllama.data", "tinyllama.generation",
           "tinyllama.costs", "tinyllama.profiling", "tinyllama.harness", "inference"}
FACADES = ["tinyllama.course", "tinyllama.costs", "tinyllama.profiling", "tinyllama.harness", "inference"]


def _project_imports() -> dict[str, set[tuple[str, str]]]:
    """Each project module the solution notebooks import from -> the (notebook, name) pairs imported."""
    found: dict[str, set[tuple[str, str]]] = {}
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            # IPython's magics and shell lines are not Python: read them as comments
            source = "\n".join("#" + line if line.lstrip().startswith(("%", "!")) else line
                               for line in cell.source.splitlines())
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("tinyllama", "inference"):
                    found.setdefault(node.module, set()).update((path.stem, a.name) for a in node.names)
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.split(".")[0] in ("tinyllama", "inference"):
                            found.setdefault(alias.name, set()).add((path.stem, ""))
    return found


def test_the_notebooks_import_from_the_public_surface_only():
    imported = _project_imports()
    outside = {module: sorted(users)[:3] for module, users in imported.items() if module not in SURFACE}
    assert not outside, f"notebooks import from modules outside the public surface (add the names to the package's _LAZY): {outside}"
    assert len(imported) <= 15


def test_every_name_a_notebook_imports_resolves():
    for module, users in _project_imports().items():
        package = importlib.import_module(module)
        for notebook, name in users:
            if name:
                assert hasattr(package, name) or importlib.util.find_spec(f"{module}.{name}"), f"{notebook}: {module}.{name}"


@pytest.mark.parametrize("package", FACADES)
def test_a_facades_lazy_names_resolve_and_are_listed(package):
    module = importlib.import_module(package)
    for name, target in module._LAZY.items():
        assert getattr(module, name) is getattr(importlib.import_module(target.partition(":")[0], package),
                                                target.partition(":")[2] or name)
        assert name in dir(module)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018


def test_a_function_named_like_its_module_comes_through_its_own_name():
    from tinyllama.harness import compare_versions
    from tinyllama.harness.compare import compare

    assert compare_versions is compare


def test_importing_a_facade_loads_none_of_its_lazy_modules():
    code = ("import sys, tinyllama.harness, tinyllama.costs; "
            "print(sorted(m for m in sys.modules if m.startswith(('tinyllama.harness.', 'tinyllama.costs.'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]", done.stdout


# The spine and the folders above it, in the order they may import each other (README, "Layout"): a module
# imports only from its own part and the parts before it.
LAYERS = ["config", "device", "timing", "correctness", "data", "kernels", "models", "training", "costs", "profiling",
          "generation", "harness", "course"]


def test_the_package_has_the_spine_and_its_folders_only():
    entries = sorted(p.name for p in (ROOT / "tinyllama").iterdir() if not p.name.startswith((".", "__pycache__")))
    assert len(entries) <= 14, entries


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1].removesuffix(".py") if parts[0] == "tinyllama" and len(parts) > 1 else None


def test_no_module_imports_from_a_part_above_its_own():
    upward = []
    for path in sorted((ROOT / "tinyllama").rglob("*.py")):
        here = _part(".".join(path.relative_to(ROOT).with_suffix("").parts))
        if here not in LAYERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                # ``from tinyllama import kernels`` imports the part it names
                names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "tinyllama" else [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                there = _part(name)
                if there in LAYERS and LAYERS.index(there) > LAYERS.index(here):
                    upward.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not upward, upward


def test_the_kernels_and_models_import_only_the_settings_the_device_and_the_checks():
    allowed = {"config", "device", "correctness", "kernels", "models"}
    for part in ("kernels", "models"):
        for path in sorted((ROOT / "tinyllama" / part).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tinyllama"):
                    names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "tinyllama" else [node.module]
                    assert all(_part(name) in allowed for name in names), f"{path.relative_to(ROOT)} imports {names}"
