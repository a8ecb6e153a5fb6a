"""The CLI as a user meets it: results on stdout (JSON only when asked), progress on stderr, what
can fail without the model failing before it loads (one line, no traceback), and the README's
`bench --dataset JME.jsonl` working from any folder of a fresh clone."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from interlock.cli import main
from interlock.parallel.process import child_env


class Loaded(Exception):
    """Raised where a model would load: what a test must not reach."""


@pytest.fixture
def no_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    from interlock.engine import load

    def refuse(*args: object, **kw: object) -> None:
        raise Loaded
    monkeypatch.setattr(load, "load_model", refuse)
    monkeypatch.setattr(load, "load_tensor_parallel", refuse)


@pytest.mark.parametrize("flags, said", [
    (["--regex", "ab\\"], "does not compile in Python"),
    (["--regex", "a(b"], "a(b"),
])
def test_a_bad_grammar_fails_before_the_model_loads(flags, said, no_loading, capsys) -> None:
    assert main(["generate", "hi", "--model", "tiny", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"interlock generate: error: argument {flags[0]}: ") and said in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_schema_typo_fails_before_the_model_loads_without_python_advice(no_loading, tmp_path, capsys) -> None:
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "objekt"}')
    assert main(["generate", "hi", "--model", "tiny", "--schema", str(schema)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("interlock generate: error: argument --schema: ")
    assert "not a valid schema at /type" in err and "lenient" not in err
    schema.write_text('{"type": "string", "not": {"const": "a"}}')   # no backend enforces it
    assert main(["generate", "hi", "--model", "tiny", "--schema", str(schema)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("interlock generate: error: argument --schema: no backend enforces JSON schema keyword")
    assert "'not'" in err and "lenient" not in err


def test_a_tensor_parallel_size_the_model_does_not_divide_fails_before_it_loads(no_loading, capsys) -> None:
    assert main(["generate", "hi", "--model", "tiny", "--tensor-parallel", "3"]) == 2
    err = capsys.readouterr().err
    assert "tensor_parallel=3 does not divide" in err and "Traceback" not in err


def rows_file(tmp_path) -> str:
    row = {"id": "r", "schema": {"type": "object", "properties": {"a": {"enum": [1, 22]}}, "required": ["a"]},
           "tests": [{"valid": True, "data": {"a": 1}}]}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return str(path)


def test_bench_prints_tables_and_keeps_json_for_json_and_out(tmp_path, capsys) -> None:
    argv = ["bench", "--model", "tiny", "--dataset", rows_file(tmp_path), "--max-tokens", "8",
            "--speculative", "none,ngram+forced"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "interlock bench" in out and "{" not in out                    # the tables, no JSON unasked
    assert "loading tiny:" in err and "ngram+forced: 1 requests" in err    # progress on stderr
    saved = tmp_path / "results.json"
    assert main([*argv[:-1], "none", "--json", "--out", str(saved)]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)                                              # stdout is the JSON alone
    assert result["mode"] == "none" and result["outputs"][0]["token_ids"]
    assert json.loads(saved.read_text()) == result and "interlock bench" in err


def test_the_readme_bench_command_finds_jme_from_any_folder(tmp_path) -> None:
    from interlock.cli import build_parser
    from interlock.benchmarks.prompts import VENDORED

    args = build_parser().parse_args(["bench", "--dataset", "JME.jsonl"])
    assert args.dataset == VENDORED / "JME.jsonl" and args.dataset.is_file()
    done = subprocess.run([sys.executable, "-m", "interlock.cli", "bench", "--dataset", "JME", "--repeat-schema",
                           "JME_nope"], cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "argument --repeat-schema" in done.stderr     # the set was found; the row not


def test_log_level_info_says_what_loaded_started_and_finished() -> None:
    done = subprocess.run([sys.executable, "-m", "interlock.cli", "--log-level", "info", "generate", "Hi",
                           "--model", "tiny", "--max-tokens", "4", "--speculative", "none"],
                          env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    for event, fields in (("model_loaded", ("source=tiny", "seconds=", "device=cpu", "dtype=")),
                          ("engine_started", ("max_batch_size=1", "speculative=none", "grammar_backend=auto")),
                          ("request_finished", ("output_tokens=", "reason=length"))):
        line = next((line for line in done.stderr.splitlines() if event in line), "")
        assert all(f in line for f in fields), (event, done.stderr)
    assert done.stdout.endswith("\n") and "[info" not in done.stdout     # stdout: the text alone


def test_serve_replicas_prints_its_banner_once_the_replicas_run(monkeypatch, capsys) -> None:
    from interlock.server import ray_serve

    seen: list[str] = []

    def run_replicas(model, server, replicas, num_cpus=None, on_ready=None) -> None:
        seen.append(capsys.readouterr().err)        # before the replicas run: no banner yet
        on_ready()
    monkeypatch.setattr(ray_serve, "run_replicas", run_replicas)
    assert main(["serve", "--model", "tiny", "--replicas", "2", "--port", "8123"]) == 0
    assert "http://127.0.0.1:8123/v1" not in seen[0]
    assert "interlock serve: tiny on http://127.0.0.1:8123/v1" in capsys.readouterr().err


def test_run_replicas_says_ready_only_after_serve_run_returned(monkeypatch) -> None:
    """serve.run waits until every replica is RUNNING; the banner's callback comes after it."""
    import types

    from interlock.server import ServerConfig, ray_serve

    calls: list[str] = []

    class Stop(Exception):
        pass

    def ready() -> None:
        calls.append("ready")
        raise Stop                                   # instead of waiting for a signal

    serve = types.SimpleNamespace(start=lambda **kw: calls.append("start"), shutdown=lambda: calls.append("down"),
                                  run=lambda *a, **kw: calls.append("run"))
    ray = types.SimpleNamespace(init=lambda **kw: calls.append("init"), shutdown=lambda: None, serve=serve)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.serve", serve)
    monkeypatch.setattr(ray_serve, "build_app", lambda *a: None)
    with pytest.raises(Stop):
        ray_serve.run_replicas("tiny", ServerConfig(model_name="tiny"), ray_serve.ReplicaConfig(), on_ready=ready)
    assert calls == ["init", "start", "run", "ready", "down"]
