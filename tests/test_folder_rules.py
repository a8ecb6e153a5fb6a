"""ARCHITECTURE's dividing lines, checked on the source.

Sync/async: `protocol/` is inert data; `kernels/`, `models/`, `parallel/`, `grammars/`, `drafters/` and
`output/` (but its per-request stream) are synchronous compute a plain pytest can call; only `streams/`,
`actors/`, `output/stream.py` (and the entry points built on them: engine, server, cli, testing) contain
`async def`.

Import direction: each folder imports only folders of lower layers (LAYERS), so the folder tree reads
bottom-up and nothing has a cycle; the entry points above the layers (benchmarks, examples, testing,
cli) may import anything."""
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
            if parts[0] != "interlock" or len(parts) < 2 or parts[1] == folder:
                continue
            if LAYER.get(parts[1], len(LAYERS)) >= LAYER[folder]:
                found.append(f"{path.name}:{node.lineno} imports {module}")
    return found


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


def test_every_folder_has_a_place() -> None:
    """A new top-level package must be put in a layer (or named an entry point) to be checked."""
    entry = {"benchmarks", "examples", "testing", "tests"}
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages - entry - set(LAYER) == set()


def test_the_check_finds_async_code(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("async def f():\n    async with g() as h:\n        await h\n")
    assert [hit.split()[-1] for hit in async_code(planted)] == ["def", "with", "await"]


def test_the_check_finds_an_upward_import(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("from interlock.actors.base import Actor\nimport interlock.models.llama\n"
                       "from interlock.protocol.types import TokenId\n")
    assert upward_imports(planted, "grammars") == ["planted.py:1 imports interlock.actors.base"]
    assert upward_imports(planted, "protocol") == ["planted.py:1 imports interlock.actors.base",
                                                   "planted.py:2 imports interlock.models.llama"]
