"""ARCHITECTURE's dividing lines, checked on the source.

Sync/async: `protocol/` is inert data; `kernels/`, `models/`, `parallel/`, `grammars/`, `drafters/` and
`output/` (but its per-request stream) are synchronous compute a plain pytest can call; only `streams/`,
`actors/`, `output/stream.py` (and the entry points built on them: engine, server, cli, testing) contain
`async def`.

Import direction: each folder imports only folders of lower layers (LAYERS) and never the package
root, so the folder tree reads bottom-up; inside a folder no modules import each other in a circle
(lazy imports counted); the entry points above the layers (benchmarks, examples, testing, cli) may
import anything."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYNC_FOLDERS = ["protocol", "kernels", "models", "parallel", "grammars", "drafters", "output"]
ASYNC_FILES = {"output/stream.py"}          # OutputStream: the consumer's `async for`
LAYERS = [                                   # lowest first; a folder imports only from layers below it
    ["protocol", "logs"],
    ["kernels", "streams"],
    ["models"],
    ["grammars", "drafters", "parallel"],
    ["output"],
    ["actors"],
    ["engine"],
    ["server"],
]
LAYER = {name: n for n, names in enumerate(LAYERS) for name in names}


def async_code(path: Path) -> list[str]:
    """`async def`, `async with`, `async for` and `await` in one file, as 'line kind' strings."""
    kinds = {ast.AsyncFunctionDef: "async def", ast.AsyncWith: "async with", ast.AsyncFor: "async for",
             ast.Await: "await"}
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.name}:{node.lineno} {kinds[type(node)]}" for node in ast.walk(tree) if type(node) in kinds]


def upward_imports(path: Path, folder: str) -> list[str]:
    """Imports in one file of `folder` that reach an interlock folder of its own layer or above."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] != "interlock" or (len(parts) > 1 and parts[1] == folder):
                continue
            if len(parts) == 1:             # the package root re-exports the top layer: above every folder
                found.append(f"{path.name}:{node.lineno} imports the package root")
            elif LAYER.get(parts[1], len(LAYERS)) >= LAYER[folder]:
                found.append(f"{path.name}:{node.lineno} imports {module}")
    return found


def module_imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules one file imports, wherever the import statement is (a function's too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                      for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found & modules


def import_cycles(files: dict[str, Path]) -> list[list[str]]:
    """Groups of modules (name -> file) that import each other in a circle (Tarjan's strongly
    connected components with more than one module), imports inside functions counted: a lazy
    import hides a cycle from Python's loader, not from a reader."""
    graph = {m: module_imports(p, set(files)) - {m} for m, p in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in graph:
        if module not in index:
            visit(module)
    return cycles


def layered_modules() -> dict[str, Path]:
    files = {}
    for folder in (name for names in LAYERS for name in names if name != "logs"):
        for f in (ROOT / folder).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            names = parts[:-1] if parts[-1] == "__init__" else parts
            files[".".join(("interlock", *names))] = f
    return files


@pytest.mark.parametrize("folder", SYNC_FOLDERS)
def test_sync_folders_hold_no_async_code(folder: str) -> None:
    files = [f for f in sorted((ROOT / folder).rglob("*.py")) if f.relative_to(ROOT).as_posix() not in ASYNC_FILES]
    assert files, f"{folder}/ has no Python files: the rule checks nothing"
    found = [hit for f in files for hit in async_code(f)]
    assert not found, f"async code in a synchronous folder {folder}/: {found}"


@pytest.mark.parametrize("folder", [name for names in LAYERS for name in names if name != "logs"])
def test_folders_import_only_lower_layers(folder: str) -> None:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"{folder}/ has no Python files: the rule checks nothing"
    found = [hit for f in files for hit in upward_imports(f, folder)]
    assert not found, f"{folder}/ imports a folder of its own layer or above: {found}"


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert import_cycles(layered_modules()) == []


def test_the_check_finds_a_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from interlock.x.b import B\n")
    (tmp_path / "b.py").write_text("def f():\n    from interlock.x.a import A\n")
    (tmp_path / "c.py").write_text("from interlock.x.a import A\n")
    files = {f"interlock.x.{n}": tmp_path / f"{n}.py" for n in "abc"}
    assert import_cycles(files) == [["interlock.x.a", "interlock.x.b"]]


def test_every_folder_has_a_place() -> None:
    """A new top-level package must be put in a layer (or named an entry point) to be checked."""
    entry = {"benchmarks", "cli", "examples", "testing", "tests"}
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages - entry - set(LAYER) == set()


def test_the_check_finds_async_code(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("async def f():\n    async with g() as h:\n        await h\n")
    assert [hit.split()[-1] for hit in async_code(planted)] == ["def", "with", "await"]


def test_the_check_finds_an_upward_import(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("from interlock.actors.framework.base import Actor\nimport interlock.models.llama\n"
                       "from interlock.protocol.types import TokenId\nimport interlock\n")
    assert upward_imports(planted, "grammars") == ["planted.py:1 imports interlock.actors.framework.base",
                                                   "planted.py:4 imports the package root"]
    assert upward_imports(planted, "protocol") == ["planted.py:1 imports interlock.actors.framework.base",
                                                   "planted.py:2 imports interlock.models.llama",
                                                   "planted.py:4 imports the package root"]


def test_every_package_ships_in_the_wheel() -> None:
    """setuptools lists packages by hand (the repository root is the package): a folder with an
    `__init__.py` left off the list imports from a checkout but is missing from an installed wheel."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tops = [p for p in ROOT.iterdir() if (p / "__init__.py").exists() and p.name != "tests"]
    found = {"interlock"} | {".".join(("interlock", *f.parent.relative_to(ROOT).parts))
                             for top in tops for f in top.rglob("__init__.py")}
    assert found - listed == set(), f"packages missing from pyproject.toml's [tool.setuptools] packages: {found - listed}"
