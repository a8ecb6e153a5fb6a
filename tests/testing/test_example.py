"""examples/test_my_grammar.py (not collected by the project run) passes as a user would run it."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "test_my_grammar.py"


def test_the_copyable_example_passes_with_both_backends():
    run = subprocess.run([sys.executable, "-m", "pytest", str(EXAMPLE), "-q", "-p", "no:cacheprovider", "-rA"],
                         capture_output=True, text=True, timeout=240, cwd=EXAMPLE.parent.parent)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    for backend in ("xgrammar", "llguidance"):
        for grammar in ("json", "ebnf"):
            assert f"test_rollback_is_exact[{grammar}-{backend}]" in run.stdout
    assert not re.search(r"\d+ (failed|error)", run.stdout.splitlines()[-1]), run.stdout[-2000:]
