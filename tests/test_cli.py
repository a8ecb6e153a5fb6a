"""The CLI's argument checks: bad values are usage errors (exit 2, the flag named), not tracebacks."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from interlock.cli import build_parser
from interlock.parallel.process import child_env

DATASET = __file__          # --dataset must name a file that exists


@pytest.mark.parametrize("argv", [
    ["generate", "--speculative", "eagle", "hi"],
    ["generate", "--speculative", "ngram:0+forced", "hi"],
    ["bench", "--dataset", DATASET, "--speculative", "none,ngram:x"],
    ["bench", "--dataset", "/nonexistent/x.jsonl"],
    ["bench", "--dataset", "NoSuchSet"],
    ["bench", "--dataset", DATASET, "--limit", "0"],
    ["serve", "--port", "70000"],
    ["serve", "--max-queue", "-1"],
    ["serve", "--replicas", "0"],
    ["serve", "--cpus-per-replica", "0"],
    ["--log-level", "loud", "generate", "hi"],
    ["bench", "--dataset", DATASET, "--repeats", "0"],
    ["bench", "--dataset", DATASET, "--rounds", "0"],
    ["serve", "--speculative", "self-draft:x"],
    ["generate", "--draft-len", "0", "hi"],
    ["generate", "--draft-len", "17", "hi"],
    ["serve", "--draft-len", "17"],
    ["--kv-cache-dtype", "fp8", "generate", "hi"],
    ["generate", "hi", "--schema", "/nonexistent/schema.json"],
    ["generate", "hi", "--grammar", "/nonexistent/g.lark"],
    ["generate", "hi", "--law", "exact"],
])
def test_bad_values_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    flag = [a for a in argv if a.startswith("--")][-1]          # each case's bad value is its last flag
    assert f"argument {flag}" in capsys.readouterr().err


def test_law_reaches_the_sampling_params() -> None:
    from interlock.cli.commands import sampling_from_args

    args = build_parser().parse_args(["generate", "hi", "--law", "conditional", "--temperature", "1",
                                      "--max-attempts", "9"])
    sampling = sampling_from_args(args)
    assert (sampling.law, sampling.max_attempts) == ("conditional", 9)


def test_good_values_pass_through_unchanged() -> None:
    args = build_parser().parse_args(["bench", "--dataset", DATASET, "--speculative", "none,ngram:4+forced"])
    assert args.speculative == "none,ngram:4+forced" and args.rounds == 1


@pytest.mark.parametrize(("flag", "kv_dtype"), [([], None), (["--kv-cache-dtype", "auto"], None),
                                                (["--kv-cache-dtype", "float32"], "float32")])
def test_kv_cache_dtype_reaches_the_loader_as_kv_dtype(flag: list[str], kv_dtype: str | None) -> None:
    from interlock.cli.commands import kv_dtype as of

    assert of(build_parser().parse_args([*flag, "generate", "hi"])) == kv_dtype


def test_a_repeat_schema_row_that_is_not_there_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from bench_data import JSONSCHEMABENCH as DATASETS

    from interlock.cli import main

    with pytest.raises(SystemExit) as exit_info:        # before any model loads
        main(["bench", "--dataset", str(DATASETS / "JME.jsonl"), "--repeat-schema", "JME_nope"])
    assert exit_info.value.code == 2
    assert "argument --repeat-schema" in capsys.readouterr().err


def test_repeat_schema_benches_one_schema_with_varied_documents() -> None:
    from pathlib import Path

    from bench_data import JSONSCHEMABENCH as DATASETS

    from interlock.benchmarks.engine_bench import BenchConfig, bench_rows
    from interlock.benchmarks.workloads import REPEATED_ROW

    rows = bench_rows(BenchConfig(dataset=Path(DATASETS / "JME.jsonl"), limit=5, repeat_schema=REPEATED_ROW))
    assert len(rows) == 5 and len({repr(r.valid_instances[0].data) for r in rows}) == 5
    assert all(r.schema == rows[0].schema for r in rows)
    plain = bench_rows(BenchConfig(dataset=Path(DATASETS / "JME.jsonl"), limit=5))
    assert len({repr(r.schema) for r in plain}) > 1


class Built(Exception):
    """Stops a command once it has built what the test looks at (before any model loads)."""


def test_serve_and_serve_replicas_build_the_same_engine_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve` and `serve --replicas` hand the engine every option, the same ones (threads and
    prefill were once dropped on the replicas' path), and Ray's own CLI takes each of them too."""
    from interlock.cli import main
    from interlock.engine import Engine
    from interlock.server import ray_serve

    built: dict[str, tuple[str, dict]] = {}

    def from_pretrained(model: str, **options: object) -> None:
        built["serve"] = model, options
        raise Built

    def run_replicas(model: str, server: object, replicas: ray_serve.ReplicaConfig,
                     num_cpus: int | None = None, on_ready: object = None) -> None:
        built["replicas"] = model, replicas.engine_options
        raise Built

    def build_app(model: str, server: object, replicas: ray_serve.ReplicaConfig) -> None:
        built["ray"] = model, replicas.engine_options

    monkeypatch.setattr(Engine, "from_pretrained", from_pretrained)
    monkeypatch.setattr(ray_serve, "run_replicas", run_replicas)
    monkeypatch.setattr(ray_serve, "build_app", build_app)
    argv = ["--threads", "3", "--prefill", "dense", "--kv-cache-dtype", "float16", "--weights", "int4", "serve",
            "--model", "tiny",
            "--speculative", "suffix+forced", "--draft-len", "5", "--backend", "llguidance", "--max-batch-size", "4",
            "--tensor-parallel", "2", "--device", "cuda:1"]
    for extra in ([], ["--replicas", "2"]):
        with pytest.raises(Built):
            main(argv + extra)
    want = {"speculative": "suffix+forced", "draft_len": 5, "grammar_backend": "llguidance", "max_batch_size": 4,
            "tensor_parallel": 2, "threads": 3, "prefill": "dense", "kv_dtype": "float16", "device": "cuda:1",
            "weights": "int4"}
    assert built["serve"] == built["replicas"] == ("tiny", want)
    ray_serve.app_builder({"model": "tiny", **{k: str(v) for k, v in want.items()}})
    assert built["ray"] == ("tiny", want)
    assert set(ray_serve.ENGINE_OPTIONS) == set(want)


def test_cli_choices_and_defaults_are_the_protocol_constants() -> None:
    from interlock.protocol.grammar import BACKENDS, DEFAULT_BACKEND
    from interlock.protocol.speculative import DEFAULT_DRAFT_LEN, DEFAULT_SPECULATIVE
    from interlock.protocol.types import DEFAULT_PREFILL, PREFILL_MODES

    parser = build_parser()
    for argv in (["generate", "hi"], ["serve"], ["run"], ["bench", "--dataset", DATASET]):
        args = parser.parse_args(argv)
        assert (args.backend, args.draft_len, args.speculative, args.prefill) == \
               (DEFAULT_BACKEND, DEFAULT_DRAFT_LEN, DEFAULT_SPECULATIVE, DEFAULT_PREFILL), argv
    for backend in BACKENDS:
        assert parser.parse_args(["serve", "--backend", backend]).backend == backend
    for mode in PREFILL_MODES:
        assert parser.parse_args(["--prefill", mode, "run"]).prefill == mode


@pytest.mark.slow
def test_the_demo_gets_every_field_of_its_text_right() -> None:
    """`make run` (`interlock run`): the first thing a user sees is the embedded model's JSON for
    DEMO_TEXT, and each field must say what the text says."""
    import json
    import subprocess
    import sys

    from interlock.cli.commands import DEMO_SCHEMA, DEMO_TEXT
    from interlock.parallel.process import child_env

    done = subprocess.run([sys.executable, "-m", "interlock.cli", "run"], env=child_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.splitlines()[0])
    assert set(answer) == set(DEMO_SCHEMA["properties"])
    assert answer["start_year"] == 2019 and str(answer["start_year"]) in DEMO_TEXT
    assert answer["languages"] == ["Rust", "Python"]
    assert {k: answer[k] for k in ("name", "company", "city")} == {"name": "Maria Chen", "company": "Northwind Labs",
                                                                  "city": "Lisbon"}
    assert answer["role"].lower() == "staff engineer"
    assert "speedup" in done.stdout          # the stats line follows the answer


def test_device_is_a_global_option_and_a_serve_option_and_is_checked() -> None:
    parser = build_parser()
    assert parser.parse_args(["generate", "hi"]).device == "cpu"
    assert parser.parse_args(["--device", "cuda", "generate", "hi"]).device == "cuda"
    assert parser.parse_args(["--device", "auto", "serve"]).device == "auto"
    assert parser.parse_args(["serve", "--device", "cuda:0"]).device == "cuda:0"
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--device", "gpu", "generate", "hi"])
    assert exc.value.code == 2


def test_cuda_without_a_gpu_is_a_clear_error_not_a_traceback(capsys, monkeypatch) -> None:
    import torch

    from interlock.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--device", "cuda", "generate", "--model", "tiny", "hi"]) == 2
    last = capsys.readouterr().err.splitlines()[-1]         # after "loading tiny ...", which said it started
    assert last.startswith("interlock generate: error: argument --device: ") and "no CUDA device" in last


def test_the_readme_and_usage_cli_commands_parse_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `interlock ...` line of the README's and docs/usage.md's shell blocks is a valid command
    from the root of a clone: its files exist (examples/user.json) and its dataset is found."""
    import re
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    commands = []
    for page in ("README.md", "docs/usage.md"):
        for block in re.findall(r"```sh\n(.*?)```", (root / page).read_text(), re.S):
            commands += [line.split("  #")[0] for line in block.splitlines() if line.startswith("interlock ")]
    assert len(commands) >= 8
    for command in commands:
        argv = shlex.split(command)[1:]
        if any(part.startswith("[") or part in ("PROMPT", "...") for part in argv):
            continue                                     # a usage synopsis, not a command
        build_parser().parse_args(argv)                  # a usage error exits 2: the test fails


NOT_SCHEMA = str(Path(__file__).parent / "data" / "not_schema.json")    # {"type": "string", "not": ...}
UNDEFINED_RULE = str(Path(__file__).parent / "data" / "undefined_rule.gbnf")


@pytest.mark.parametrize("argv,flag,said", [
    (["generate", "hi", "--max-tokens", "0"], "--max-tokens", "got 0"),
    (["generate", "hi", "--temperature", "-1"], "--temperature", "got -1.0"),
    (["generate", "hi", "--negative-prompt", "x"], "--negative-prompt", "set --guidance-scale"),
    (["generate", "hi", "--regex", "ab\\"], "--regex", "does not compile in Python"),
    (["generate", "hi", "--schema", NOT_SCHEMA], "--schema", "no backend enforces JSON schema keyword 'not' at /"),
    (["generate", "hi", "--schema", NOT_SCHEMA, "--backend", "llguidance"], "--schema", 'Unimplemented keys: ["not"]'),
    (["generate", "hi", "--grammar", UNDEFINED_RULE, "--backend", "llguidance"], "--grammar", "Rule 'foo' not found"),
    (["generate", "hi", "--regex", "a{2,1}", "--backend", "llguidance"], "--regex", "does not compile"),
    (["generate", "hi", "--model", "no-such-model"], "--model", "no model named 'no-such-model'"),
    (["serve", "--model", "missing.gguf"], "--model", "no model named 'missing.gguf'"),
])
def test_usage_and_grammar_errors_fail_at_once_in_argparse_style(argv, flag, said) -> None:
    """Checked by the library's own rules (a grammar: by grammars/precheck.py, without a tokenizer)
    before anything heavy is imported: the message names flags, not Python fields or error types,
    and neither torch nor the engine nor a grammar backend was imported to say it."""
    done = probe(argv)
    assert done.stdout.split() == ["2", "False", "False", "False"], done.stderr
    assert done.stderr.startswith(f"interlock {argv[0]}: error: argument {flag}: "), done.stderr
    assert said in done.stderr and "Error:" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_help_imports_neither_torch_nor_the_engine() -> None:
    done = probe(["generate", "--help"])
    assert done.stdout.split()[-4:] == ["0", "False", "False", "False"], done.stderr
    assert "--guidance-scale" in done.stdout


def probe(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """main(argv) in a fresh process; then its exit status and whether torch, the engine's builder
    and a grammar backend were imported, on stdout's last line."""
    code = ("import sys\nfrom interlock.cli import main\ntry:\n    rc = main(sys.argv[1:])\n"
            "except SystemExit as exc:\n    rc = exc.code\n"
            "print(rc, 'torch' in sys.modules, 'interlock.engine.build' in sys.modules, "
            "'interlock.grammars.llguidance_backend' in sys.modules)")
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                          env=child_env())


def test_progress_shows_before_torch_is_imported() -> None:
    """The first progress line comes before the seconds of importing torch, which it counts."""
    code = ("import sys, importlib.abc\n"
            "class Mark(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch':\n            print('<torch>', file=sys.stderr, flush=True)\n"
            "            sys.meta_path.remove(self)\n"
            "sys.meta_path.insert(0, Mark())\n"
            "from interlock.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "generate", "hi", "--model", "tiny", "--max-tokens", "2",
                           "--choice", "a", "b"], capture_output=True, text=True, timeout=540, env=child_env())
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert lines[0] == "loading tiny ..." and "<torch>" in lines[1:], lines
    assert any(line.startswith("loading tiny: ") for line in lines[lines.index("<torch>"):])


def test_the_help_and_usage_md_agree_on_the_auto_defaults() -> None:
    """--prefill and --kv-cache-dtype: the choices usage.md lists are the parser's, and both say which
    CPUs "auto" means with protocol.types.SIMD_CPUS, which names every SIMD kernel there is."""
    import argparse
    import re
    from pathlib import Path

    from interlock.kernels.native import SIMD_KERNELS
    from interlock.protocol.types import SIMD_CPUS

    names = {"amx": "AMX", "vnni": "AVX512-VNNI", "avx2": "AVX2"}
    assert sorted(names[k] for k in SIMD_KERNELS) == sorted(re.split(r", | or ", SIMD_CPUS))
    usage = " ".join((Path(__file__).parents[1] / "docs" / "usage.md").read_text().split())
    actions = {a.option_strings[0]: a for a in build_parser()._actions if isinstance(a, argparse.Action)
               and a.option_strings}
    for flag in ("--prefill", "--kv-cache-dtype"):
        listed = re.search(rf"`{flag} ([a-z0-9|]+)`", usage)
        assert listed and set(listed.group(1).split("|")) == set(actions[flag].choices), flag
        assert SIMD_CPUS in " ".join(actions[flag].help.split()), flag
    assert usage.count(f"({SIMD_CPUS})") + usage.count(f"({SIMD_CPUS};") == 2     # each flag's paragraph
