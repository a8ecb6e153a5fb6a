"""The README's quick example (examples/quick_example.py), run as a user runs it: its answer is right."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import interlock.examples
from interlock.parallel.process import child_env


@pytest.mark.slow
def test_the_quick_example_prints_the_right_answer() -> None:
    script = Path(interlock.examples.__file__).parent / "quick_example.py"
    done = subprocess.run([sys.executable, str(script)], env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # the text says "Ada Lovelace died at the age of 36"; the README quotes this line
    assert json.loads(done.stdout) == {"name": "Ada Lovelace", "age": 36}
    assert done.stdout == '{"name":"Ada Lovelace","age":36}\n'
