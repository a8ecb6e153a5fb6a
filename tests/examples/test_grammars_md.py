"""docs/grammars.md's Python snippets run as pasted (each in a fresh namespace: every name it uses is
defined in it or imported), and build the specs they say they build."""
from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "grammars.md"


def test_every_python_snippet_of_grammars_md_runs_as_pasted() -> None:
    from interlock import Reasoning, StructuralTag

    snippets = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert snippets
    for code in snippets:
        namespace: dict[str, object] = {}
        exec(compile(code, str(PAGE), "exec"), namespace)       # a NameError here: a name the page left out
    assert isinstance(namespace["think_then_json"], Reasoning) and isinstance(namespace["tools"], StructuralTag)
