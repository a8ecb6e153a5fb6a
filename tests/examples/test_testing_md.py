"""docs/testing.md's property-test snippet, pasted into a file and run with pytest as a user would:
it must pass as written (its schema defined, no health check tripped)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from interlock.parallel.process import child_env

PAGE = Path(__file__).parents[2] / "docs" / "testing.md"


def test_the_testing_page_snippet_passes_as_pasted(tmp_path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    (snippet,) = [b for b in blocks if "interlock.testing import" in b]
    (tmp_path / "test_snippet.py").write_text(snippet)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_snippet.py"],
                          cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(r"\b3 passed\b", done.stdout), done.stdout[-1000:]
