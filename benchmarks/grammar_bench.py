"""Grammar backends on JSONSchemaBench: coverage, compliance, compile time, mask time.

    .venv/bin/python -m interlock.benchmarks.grammar_bench --dataset /work/shared/data/jsonschemabench/JME.jsonl

Each schema is compiled (compact whitespace) by xgrammar and by llguidance, with the real
SmolLM2 tokenizer (V = 49152). Every test instance is serialized compactly, tokenized as the
model's tokenizer would produce it and fed token by token; a valid instance counts as accepted
when every token and then EOS is accepted, an invalid one as refused when some token or EOS is
refused. The mask is filled before every token of valid instances (mask time per token).
`auto` is derived: llguidance's result where it compiled, else xgrammar's (grammars/auto.py).
The last line printed is a JSON object keyed by backend.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interlock.grammars import make_backend
from interlock.protocol.errors import GrammarError
from interlock.protocol.grammar import GrammarConfig, JsonSchema

BACKENDS = ("xgrammar", "llguidance")


@dataclass
class SchemaResult:
    """One schema under one backend."""

    compiled: bool
    compile_ms: float
    error: str = ""
    valid_total: int = 0
    valid_accepted: int = 0
    invalid_total: int = 0
    invalid_refused: int = 0
    mask_us: list[float] = field(default_factory=list)
    lenient: list[int] = field(default_factory=list)      # indices of invalid instances accepted
    strict: list[int] = field(default_factory=list)       # indices of valid instances refused


def load_rows(path: Path, limit: int | None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows[:limit] if limit else rows


def order_like_schema(data: Any, schema: Any) -> Any:
    """`data` with object keys in the order the schema declares its properties (others after).

    Both backends emit properties in declaration order, as a constrained model writes them;
    the dataset's instances do not always list keys that way.
    """
    if not isinstance(schema, dict):
        return data
    if isinstance(data, dict):
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        keys = [k for k in props if k in data] + [k for k in data if k not in props]
        return {k: order_like_schema(data[k], props.get(k)) for k in keys}
    if isinstance(data, list) and isinstance(schema.get("items"), dict):
        return [order_like_schema(x, schema["items"]) for x in data]
    return data


def instance_text(data: Any, indent: int | None = None, schema: Any = None) -> str:
    """The instance as a constrained model would write it (keys in schema order)."""
    separators = (",", ":") if indent is None else (",", ": ")
    return json.dumps(order_like_schema(data, schema), indent=indent, separators=separators, ensure_ascii=False)


def run_instance(matcher: Any, ids: list[int], eos: int, mask: Any, timings: list[float] | None) -> bool:
    """Feed ids one by one then EOS; True when all were accepted. Resets the matcher after."""
    try:
        for t in ids + [eos]:
            if timings is not None:
                start = time.perf_counter()
                matcher.fill_mask(mask, 0)
                timings.append((time.perf_counter() - start) * 1e6)
            if not matcher.accept([t]):
                return False
        return True
    finally:
        matcher.reset()


def compile_with_timeout(pool: concurrent.futures.Executor, backend: Any, spec: JsonSchema,
                         timeout_s: float) -> tuple[Any, float, str]:
    start = time.perf_counter()
    future = pool.submit(backend.compile, spec)
    try:
        compiled = future.result(timeout=timeout_s)
        return compiled, (time.perf_counter() - start) * 1e3, ""
    except concurrent.futures.TimeoutError:
        return None, timeout_s * 1e3, f"timeout after {timeout_s:g} s"
    except GrammarError as exc:
        return None, (time.perf_counter() - start) * 1e3, str(exc)


def bench_schema(backend: Any, pool: concurrent.futures.Executor, row: dict[str, Any], tokenizer: Any,
                 timeout_s: float) -> SchemaResult:
    try:
        spec = JsonSchema(row["schema"], strict=False)   # compliance is judged by JSON Schema itself
    except GrammarError as exc:
        return SchemaResult(False, 0.0, str(exc))
    compiled, ms, error = compile_with_timeout(pool, backend, spec, timeout_s)
    if compiled is None:
        return SchemaResult(False, ms, error)
    res = SchemaResult(True, ms)
    matcher = backend.matcher(compiled)
    mask = backend.allocate_bitmask(1)
    eos = tokenizer.eos_token_ids[0]
    for i, test in enumerate(row.get("tests", [])):
        ids = tokenizer.encode(instance_text(test["data"], schema=row["schema"]))
        ok = run_instance(matcher, ids, eos, mask, res.mask_us if test["valid"] else None)
        if test["valid"]:
            res.valid_total += 1
            res.valid_accepted += ok
            if not ok:
                res.strict.append(i)
        else:
            res.invalid_total += 1
            res.invalid_refused += not ok
            if ok:
                res.lenient.append(i)
    return res


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[min(998, max(0, round(q * 1000) - 1))]


def summarize(results: list[SchemaResult]) -> dict[str, Any]:
    done = [r for r in results if r.compiled]
    compile_ms = [r.compile_ms for r in done]
    mask_us = [t for r in done for t in r.mask_us]
    return {
        "total": len(results), "compiled": len(done),
        "valid_total": sum(r.valid_total for r in done), "valid_accepted": sum(r.valid_accepted for r in done),
        "invalid_total": sum(r.invalid_total for r in done),
        "invalid_refused": sum(r.invalid_refused for r in done),
        "compile_ms_p50": round(percentile(compile_ms, 0.5), 3), "compile_ms_p99": round(percentile(compile_ms, 0.99), 3),
        "mask_us_p50": round(percentile(mask_us, 0.5), 1), "mask_us_p99": round(percentile(mask_us, 0.99), 1),
        "mask_us_p999": round(percentile(mask_us, 0.999), 1), "mask_samples": len(mask_us),
    }


def auto_results(per: dict[str, list[SchemaResult]]) -> list[SchemaResult]:
    out = []
    for llg, xgr in zip(per["llguidance"], per["xgrammar"]):
        if llg.compiled or not xgr.compiled:
            out.append(llg)
        else:   # fallback: the time llguidance spent failing counts too
            out.append(SchemaResult(**{**xgr.__dict__, "compile_ms": xgr.compile_ms + llg.compile_ms}))
    return out


def print_table(summary: dict[str, dict[str, Any]], out: Any) -> None:
    cols = ["compiled", "valid_accepted", "invalid_refused", "compile_ms_p50", "compile_ms_p99",
            "mask_us_p50", "mask_us_p99", "mask_us_p999"]
    print("| backend | coverage | valid accepted | invalid refused | compile ms p50 | p99 | mask µs p50 | p99 | p99.9 |",
          file=out)
    print("|---|---|---|---|---|---|---|---|---|", file=out)
    for name, s in summary.items():
        print(f"| {name} | {s['compiled']}/{s['total']} | {s['valid_accepted']}/{s['valid_total']} | "
              f"{s['invalid_refused']}/{s['invalid_total']} | " + " | ".join(str(s[c]) for c in cols[3:]) + " |",
              file=out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=None, help="first N schemas only")
    parser.add_argument("--timeout", type=float, default=GrammarConfig().compile_timeout_s)
    parser.add_argument("--tokenizer", default="smollm2-135m-instruct")
    parser.add_argument("--details", type=Path, default=None, help="write per-schema failures as JSON")
    args = parser.parse_args(argv)

    from rich.progress import Progress
    from interlock.models.loader import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    rows = load_rows(args.dataset, args.limit)
    backends = {n: make_backend(n, tokenizer, tokenizer.vocab_size) for n in BACKENDS}  # type: ignore[arg-type]
    per: dict[str, list[SchemaResult]] = {n: [] for n in BACKENDS}
    # Threads are abandoned on timeout (native compiles cannot be interrupted); keep spares.
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool, Progress(console=None, transient=False) as bar:
        task = bar.add_task(args.dataset.name, total=len(rows) * len(BACKENDS))
        for row in rows:
            for name, backend in backends.items():
                per[name].append(bench_schema(backend, pool, row, tokenizer, args.timeout))
                bar.advance(task)
        pool.shutdown(wait=False, cancel_futures=True)
    per["auto"] = auto_results(per)
    summary = {name: summarize(results) for name, results in per.items()}
    if args.details:
        args.details.write_text(json.dumps({name: [
            {"id": row["id"], "error": r.error, "lenient": r.lenient, "strict": r.strict}
            for row, r in zip(rows, results) if r.error or r.lenient or r.strict] for name, results in per.items()},
            indent=1))
    print_table(summary, sys.stdout)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
