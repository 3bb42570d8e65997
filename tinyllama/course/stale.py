"""Which stored solutions may no longer show what their code prints.

A solution's outputs come from one run, at the commit its records name (``metadata.tinyllama.records``,
written by :mod:`tinyllama.course.reference`). A code cell edited since, or a module of the course that the
notebook reaches by import and that changed since, can make the stored outputs differ from what the notebook
prints now: such a notebook needs running again before its outputs are trusted.

    python -m tinyllama.course.run_solutions --stale [--notebooks 22 ...]

The imports are read from the source (``ast``), not by running it: ``import`` and ``from ... import`` lines,
the names a package hands out on first use (its ``_LAZY`` table, :func:`tinyllama.lazy_exports`) and
attributes of an imported package (``course.check_x``), followed through the modules they reach.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from tinyllama.course import reference

PACKAGES = ("tinyllama", "inference")  # the course's own code; changes elsewhere are not followed


@dataclass(frozen=True)
class Staleness:
    """What changed since a stored solution ran: its code cells (ids) and the course files it imports."""

    notebook: str
    commit: str | None
    cells: list[str] = field(default_factory=list)
    files: dict[str, list[str]] = field(default_factory=dict)  # imported file -> its top-level names changed
    problem: str | None = None  # why it could not be told (no commit recorded, one git does not know)

    @property
    def stale(self) -> bool:
        """Its outputs are known not to come from its code as it is: a code cell changed, or it can't be told."""
        return bool(self.cells or self.problem)

    def describe(self) -> str:
        head = f"{self.notebook:<28} ran at {self.commit or '?':<12}"
        if self.problem:
            return f"{head} cannot tell: {self.problem}"
        lines = [f"{head} {'cells changed: ' + ', '.join(self.cells) if self.cells else 'cells as they ran'}"]
        lines += [f"{'':<41} changed since in {file}: {', '.join(names)}" for file, names in self.files.items()]
        return "\n".join(lines)


def _git(root: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *arguments], cwd=root, capture_output=True, text=True, timeout=60)


def recorded_commit(records: list[dict]) -> tuple[str | None, str | None]:
    """The commit a stored notebook ran at, from its records (:func:`reference.notebook_records`), and a
    problem where there is no single one."""
    commits = {record.get("commit") for record in records}
    if not records or commits == {None}:
        return None, "its records name no commit (a run outside a git checkout without $WORKSHOP_COMMIT?)"
    if len(commits) > 1:
        return None, f"its records name several commits ({', '.join(sorted(map(str, commits)))})"
    commit = commits.pop()
    if commit.endswith("-dirty"):
        return commit, "it ran from a checkout with uncommitted changes: its code is in no commit"
    return commit, None


def _code_cells(notebook: nbformat.NotebookNode) -> dict[str, str]:
    return {cell.get("id", f"#{index}"): cell.source for index, cell in enumerate(notebook.cells)
            if cell.cell_type == "code"}


def changed_cells(now: nbformat.NotebookNode, then: nbformat.NotebookNode) -> list[str]:
    """Ids of the code cells whose source differs, that were added, or that were removed (``-id``)."""
    current, earlier = _code_cells(now), _code_cells(then)
    changed = [cell for cell, source in current.items() if earlier.get(cell) != source]
    return changed + [f"-{cell}" for cell in earlier if cell not in current]


# ----------------------------------------------------------------------------------------------------------
# The course files a notebook reaches by import.

@functools.lru_cache(maxsize=None)
def module_file(root: Path, module: str) -> Path | None:
    """The file of ``module`` in the checkout at ``root`` (a package's ``__init__.py``), or None."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=None)
def _lazy_table(root: Path, package: str) -> dict[str, str]:
    """A package's ``_LAZY`` table (name -> absolute module), read from its ``__init__.py``."""
    path = module_file(root, package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.walk(ast.parse(path.read_text())):
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "_LAZY" and isinstance(node.value, ast.Dict):
            table = {}
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                    module = value.value.partition(":")[0]
                    table[key.value] = package + module if module.startswith(".") else module
            return table
    return {}


def _resolve(module: str | None, level: int, package: str) -> str:
    if level == 0:
        return module or ""
    base = package.split(".")[: len(package.split(".")) - level + 1]
    return ".".join(base + ([module] if module else []))


def _ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def imported_modules(tree: ast.AST, root: Path, package: str = "") -> set[str]:
    """The course modules one parsed source imports (``package``: the package it lives in, for relative
    imports): its import statements, the names they take from a package's ``_LAZY`` table, and the attributes
    it reads of a package it imported (``course.fusion_effects``)."""
    found: set[str] = set()
    packages: dict[str, str] = {}  # local name -> the package it is bound to

    def take(module: str, name: str | None = None) -> str | None:
        """Add ``module.name`` where it is a module or a lazy name of ``module``; the module found."""
        if name is None:
            found.add(module)
            return module
        if module_file(root, f"{module}.{name}") is not None:
            found.add(f"{module}.{name}")
            return f"{module}.{name}"
        lazy = _lazy_table(root, module).get(name)
        if lazy is not None:
            found.add(lazy)
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _ours(alias.name):
                    take(alias.name)
                    packages[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                        alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node.module, node.level, package)
            if not _ours(module):
                continue
            found.add(module)
            for alias in node.names:
                submodule = take(module, alias.name)
                if submodule is not None:
                    packages[alias.asname or alias.name] = submodule
    for node in ast.walk(tree):  # attributes of an imported package: course.check_x, tinyllama.timing
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in packages:
            take(packages[node.value.id], node.attr)
    return found


def notebook_sources(notebook: nbformat.NotebookNode) -> list[ast.Module]:
    """A notebook's code cells, parsed, without IPython's magic and shell lines."""
    trees = []
    for cell, source in _code_cells(notebook).items():
        lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
        try:
            trees.append(ast.parse("\n".join(lines)))
        except SyntaxError as error:
            raise ValueError(f"cell {cell} is not Python ({error.msg}, line {error.lineno})") from error
    return trees


@functools.lru_cache(maxsize=None)
def _file_imports(root: Path, path: Path, package: str) -> frozenset[str]:
    return frozenset(imported_modules(ast.parse(path.read_text()), root, package))


def reached_files(notebook: nbformat.NotebookNode, root: Path) -> set[str]:
    """The course files (relative to ``root``) that running ``notebook`` imports, directly or through them;
    a module's packages count, since importing it runs their ``__init__.py``."""
    pending = set().union(*(imported_modules(tree, root) for tree in notebook_sources(notebook)))
    seen: set[str] = set()
    files: set[str] = set()
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        pending |= {".".join(parts[:end]) for end in range(1, len(parts))} - seen
        path = module_file(root, module)
        if path is None:
            continue
        files.add(path.relative_to(root).as_posix())
        package = module if path.name == "__init__.py" else ".".join(parts[:-1])
        pending |= _file_imports(root, path, package) - seen
    return files


def _top_level_spans(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, last line) of each top-level function, class and assigned name of a source, and of
    its docstring (``(docstring)``: words only)."""
    spans = []
    for index, node in enumerate(ast.parse(source).body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [target.id for target in targets if isinstance(target, ast.Name)]
        elif index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            names = ["(docstring)"]
        else:
            continue
        first = min([node.lineno, *(decorator.lineno for decorator in getattr(node, "decorator_list", []))])
        spans += [(name, first, node.end_lineno or node.lineno) for name in names]
    return spans


def changed_names(root: Path, commit: str, file: str) -> list[str]:
    """The top-level functions, classes and assigned names of ``file`` whose lines differ between ``commit``
    and the working tree, from the lines ``git diff`` names on either side (a name removed since counts);
    ``(module level)`` for changed code outside them (not blank lines or comments), ``(new file)`` for a file
    ``commit`` lacks."""
    diff = _git(root, "diff", "-U0", commit, "--", file).stdout
    if not diff:
        return []
    if "--- /dev/null" in diff:
        return ["(new file)"]
    old, new = set(), set()
    for header in re.finditer(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", diff, re.MULTILINE):
        for lines, start, count in ((old, header.group(1), header.group(2)), (new, header.group(3), header.group(4))):
            lines |= set(range(int(start), int(start) + int(count or 1)))  # a count of 0: nothing on that side
    changed: list[str] = []
    outside = False
    for lines, source in ((old, _git(root, "show", f"{commit}:{file}").stdout), (new, (root / file).read_text())):
        spans = _top_level_spans(source)
        changed += [name for name, first, last in spans if any(first <= line <= last for line in lines)]
        text = source.splitlines()
        code = {line for line in lines if line <= len(text) and text[line - 1].strip()[:1] not in ("", "#")}
        outside |= any(not any(first <= line <= last for _, first, last in spans) for line in code)
    return list(dict.fromkeys(changed)) + (["(module level)"] if outside else [])


# ----------------------------------------------------------------------------------------------------------

def checkout_of(path: Path) -> Path:
    """The root of the git checkout that holds ``path``."""
    done = _git(path.resolve().parent, "rev-parse", "--show-toplevel")
    if done.returncode != 0:
        raise ValueError(f"{path} is not in a git checkout: the commit its outputs ran at cannot be read")
    return Path(done.stdout.strip())


def _forget_files() -> None:
    """Drop what was read of the checkout's files: they may have changed since (one report reads them once)."""
    for cached in (module_file, _lazy_table, _file_imports):
        cached.cache_clear()


def staleness(path: Path, root: Path | None = None) -> Staleness:
    """What changed, in the checkout that holds it (``root``; its working tree), since the stored solution
    ``path`` ran."""
    _forget_files()
    return _staleness(path, root)


def _staleness(path: Path, root: Path | None) -> Staleness:
    root = checkout_of(path) if root is None else root
    commit, problem = recorded_commit(reference.notebook_records(path))
    name = path.stem
    if problem is not None:
        return Staleness(name, commit, problem=problem)
    if _git(root, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").returncode != 0:
        return Staleness(name, commit, problem=f"git does not know commit {commit} here (a shallow clone? "
                                               "`git fetch --unshallow` brings the history)")
    relative = path.resolve().relative_to(root.resolve()).as_posix()
    shown = _git(root, "show", f"{commit}:{relative}")
    if shown.returncode != 0:
        return Staleness(name, commit, problem=f"{relative} did not exist at {commit}")
    now = nbformat.read(path, as_version=4)
    cells = changed_cells(now, nbformat.reads(shown.stdout, as_version=4))
    reached = reached_files(now, root)
    diff = _git(root, "diff", "--name-only", commit, "--", *PACKAGES)
    files = {file: changed_names(root, commit, file) for file in sorted(reached & set(diff.stdout.split()))}
    return Staleness(name, commit, cells, {file: names for file, names in files.items() if names})


def report(paths: list[Path], root: Path | None = None) -> int:
    """Print what changed since each stored solution ran; 1 where a solution's code cells changed since (or
    it can't be told), else 0. A changed imported name is listed for the reader to judge: whether it shapes
    what the notebook prints, reading its diff tells."""
    _forget_files()
    found = [_staleness(path, root) for path in paths]  # each in its own checkout where root is None
    for item in found:
        print(item.describe())
    stale = [item.notebook for item in found if item.stale]
    print()
    if stale:
        print(f"{len(stale)} solution(s) hold code that did not run as it is: run them again "
              f"(--notebooks {' '.join(name[:2] for name in stale)}) and store the run.")
    else:
        print("Every solution's code cells are the ones that ran.")
    if any(item.files for item in found):
        print("Names changed since in the course files they import are listed under each: re-run a notebook "
              "whose printed lines one of them shapes (`git diff <commit> -- <file>` shows how it changed).")
    return 1 if stale else 0
