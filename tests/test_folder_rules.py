"""ARCHITECTURE's dividing line, checked on the source: `protocol/` is inert data; `kernels/`, `models/`,
`grammars/` and `drafters/` are synchronous compute a plain pytest can call; only `streams/` and
`actors/` (and the entry points built on them: engine, server, cli, testing) contain `async def`."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYNC_FOLDERS = ["protocol", "kernels", "models", "grammars", "drafters"]


def async_code(path: Path) -> list[str]:
    """`async def`, `async with`, `async for` and `await` in one file, as 'line kind' strings."""
    kinds = {ast.AsyncFunctionDef: "async def", ast.AsyncWith: "async with", ast.AsyncFor: "async for",
             ast.Await: "await"}
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.name}:{node.lineno} {kinds[type(node)]}" for node in ast.walk(tree) if type(node) in kinds]


@pytest.mark.parametrize("folder", SYNC_FOLDERS)
def test_sync_folders_hold_no_async_code(folder: str) -> None:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"{folder}/ has no Python files: the rule checks nothing"
    found = [hit for f in files for hit in async_code(f)]
    assert not found, f"async code in a synchronous folder {folder}/: {found}"


def test_the_check_finds_async_code(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("async def f():\n    async with g() as h:\n        await h\n")
    assert [hit.split()[-1] for hit in async_code(planted)] == ["def", "with", "await"]
