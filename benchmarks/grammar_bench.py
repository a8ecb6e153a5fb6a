"""Grammar backends on JSONSchemaBench: coverage, compliance, compile time, mask time.

    python -m interlock.benchmarks.grammar_bench --dataset JME      # a set name, or a path to its .jsonl

Each schema is compiled (compact whitespace) by xgrammar and by llguidance, with the real
SmolLM2 tokenizer (V = 49152). Every test instance is serialized compactly, tokenized as the
model's tokenizer would produce it and fed token by token; a valid instance counts as accepted
when every token and then EOS is accepted, an invalid one as refused when some token or EOS is
refused. The mask is filled before every token of valid instances (mask time per token).
`auto` is the real policy (grammars/auto.py): it compiles only grammars that enforce the schema
exactly and refuses the others with SchemaKeywordError; "keyword refusals" counts those schemas
(the details file names each keyword). The last line printed is a JSON object keyed by backend.
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
from urllib.parse import unquote

from interlock.benchmarks.prompts import dataset_arg
from interlock.grammars import make_backend
from interlock.grammars.auto import AutoBackend
from interlock.grammars.backends import AUTO_ORDER
from interlock.protocol.errors import GrammarError, SchemaKeywordError
from interlock.protocol.grammar import GrammarConfig, JsonSchema
from interlock.models.names import EMBEDDED

BACKENDS = ("xgrammar", "llguidance", "auto")


@dataclass
class SchemaResult:
    """One schema under one backend."""

    compiled: bool
    compile_ms: float
    error: str = ""
    keyword: str = ""                                     # auto: the keyword it refused the schema for
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


def order_like_schema(data: Any, schema: Any, root: Any = None, *, _validator: Any = None) -> Any:
    """`data` with object keys in the order the schema declares its properties (others after).

    Both backends emit properties in declaration order, as a constrained model writes them; the
    dataset's instances do not always list keys that way. Declarations are found where the
    backends find them: the object's own `properties`, through `$ref`, in every `allOf` branch,
    and in the first `anyOf`/`oneOf` branch the value is valid against; arrays follow
    `prefixItems` (or draft-04 array `items`) position by position, then `items`.
    """
    root = schema if root is None else root
    if _validator is None:
        _validator = _validator_for(root)
    views = _views(data, schema, root, _validator)
    if isinstance(data, dict):
        declared: dict[str, Any] = {}
        for view in views:
            props = view.get("properties")
            for key, sub in (props.items() if isinstance(props, dict) else ()):
                if key in data and key not in declared:
                    declared[key] = sub
        keys = [*declared, *(k for k in data if k not in declared)]
        return {k: order_like_schema(data[k], declared.get(k), root, _validator=_validator) for k in keys}
    if isinstance(data, list):
        return [order_like_schema(x, _item_schema(views, i), root, _validator=_validator) for i, x in enumerate(data)]
    return data


def _validator_for(root: Any) -> Any:
    import jsonschema

    try:
        return jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)(root)
    except Exception:                       # a malformed schema: order by own properties only
        return None


def _views(data: Any, schema: Any, root: Any, validator: Any, depth: int = 0) -> list[dict[str, Any]]:
    """The subschemas that apply to data: schema, what its $ref points to, allOf branches, and the
    first anyOf/oneOf branch data is valid against (recursively, bounded)."""
    if not isinstance(schema, dict) or depth > 32:
        return []
    out = [schema]
    ref = schema.get("$ref")
    if isinstance(ref, str):
        out += _views(data, _resolve(root, ref), root, validator, depth + 1)
    for branch in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
        out += _views(data, branch, root, validator, depth + 1)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key) if isinstance(schema.get(key), list) else []
        match = next((b for b in branches if _valid(validator, b, data)), None)
        out += _views(data, match, root, validator, depth + 1)
    return out


def _resolve(root: Any, ref: str) -> Any:
    """A local reference ("#/$defs/x"); None for anything else."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in filter(None, unquote(ref[1:]).split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _valid(validator: Any, schema: Any, data: Any) -> bool:
    if validator is None or not isinstance(schema, (dict, bool)):
        return False
    try:
        return validator.evolve(schema=schema).is_valid(data)
    except Exception:
        return False


def _item_schema(views: list[dict[str, Any]], i: int) -> Any:
    for view in views:
        prefix = view.get("prefixItems", view.get("items"))
        if isinstance(prefix, list) and i < len(prefix):
            return prefix[i]
    for view in views:
        if isinstance(view.get("items"), dict):
            return view["items"]
    return None


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
                         timeout_s: float) -> tuple[Any, float, str, str]:
    """(compiled or None, ms, error, keyword a SchemaKeywordError named)."""
    start = time.perf_counter()
    future = pool.submit(backend.compile, spec)
    try:
        compiled = future.result(timeout=timeout_s)
        return compiled, (time.perf_counter() - start) * 1e3, "", ""
    except concurrent.futures.TimeoutError:
        return None, timeout_s * 1e3, f"timeout after {timeout_s:g} s", ""
    except SchemaKeywordError as exc:
        return None, (time.perf_counter() - start) * 1e3, str(exc), exc.keyword
    except GrammarError as exc:
        return None, (time.perf_counter() - start) * 1e3, str(exc), ""


def bench_schema(backend: Any, pool: concurrent.futures.Executor, row: dict[str, Any], tokenizer: Any,
                 timeout_s: float) -> SchemaResult:
    try:
        spec = JsonSchema(row["schema"], strict=False)   # compliance is judged by JSON Schema itself
    except GrammarError as exc:
        return SchemaResult(False, 0.0, str(exc))
    compiled, ms, error, keyword = compile_with_timeout(pool, backend, spec, timeout_s)
    if compiled is None:
        return SchemaResult(False, ms, error, keyword)
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
        "total": len(results), "compiled": len(done), "keyword_refusals": sum(bool(r.keyword) for r in results),
        "valid_total": sum(r.valid_total for r in done), "valid_accepted": sum(r.valid_accepted for r in done),
        "invalid_total": sum(r.invalid_total for r in done),
        "invalid_refused": sum(r.invalid_refused for r in done),
        "compile_ms_p50": round(percentile(compile_ms, 0.5), 3), "compile_ms_p99": round(percentile(compile_ms, 0.99), 3),
        "mask_us_p50": round(percentile(mask_us, 0.5), 1), "mask_us_p99": round(percentile(mask_us, 0.99), 1),
        "mask_us_p999": round(percentile(mask_us, 0.999), 1), "mask_samples": len(mask_us),
    }


def print_table(summary: dict[str, dict[str, Any]], out: Any) -> None:
    cols = ["compiled", "valid_accepted", "invalid_refused", "compile_ms_p50", "compile_ms_p99",
            "mask_us_p50", "mask_us_p99", "mask_us_p999"]
    print("| backend | coverage | keyword refusals | valid accepted | invalid refused | compile ms p50 | p99 "
          "| mask µs p50 | p99 | p99.9 |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|", file=out)
    for name, s in summary.items():
        print(f"| {name} | {s['compiled']}/{s['total']} | {s['keyword_refusals']} | "
              f"{s['valid_accepted']}/{s['valid_total']} | {s['invalid_refused']}/{s['invalid_total']} | "
              + " | ".join(str(s[c]) for c in cols[3:]) + " |", file=out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=dataset_arg, required=True, help="a JSONSchemaBench set (name or .jsonl path)")
    parser.add_argument("--limit", type=int, default=None, help="first N schemas only")
    parser.add_argument("--timeout", type=float, default=GrammarConfig().compile_timeout_s)
    parser.add_argument("--tokenizer", default=EMBEDDED)
    parser.add_argument("--details", type=Path, default=None, help="write per-schema failures as JSON")
    args = parser.parse_args(argv)

    from rich.progress import Progress
    from interlock.logs import configure_logging
    from interlock.models.loader import load_tokenizer

    configure_logging(level="error")      # backend warnings are per schema in --details, not on stdout

    tokenizer = load_tokenizer(args.tokenizer)
    rows = load_rows(args.dataset, args.limit)
    backends = {n: make_backend(n, tokenizer, tokenizer.vocab_size) for n in BACKENDS[:2]}  # type: ignore[arg-type]
    backends["auto"] = AutoBackend([backends[n] for n in AUTO_ORDER])    # the same policy, shared tables
    per: dict[str, list[SchemaResult]] = {n: [] for n in BACKENDS}
    # Threads are abandoned on timeout (native compiles cannot be interrupted); keep spares.
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool, Progress(console=None, transient=False) as bar:
        task = bar.add_task(args.dataset.name, total=len(rows) * len(BACKENDS))
        for row in rows:
            for name, backend in backends.items():
                per[name].append(bench_schema(backend, pool, row, tokenizer, args.timeout))
                bar.advance(task)
        pool.shutdown(wait=False, cancel_futures=True)
    summary = {name: summarize(results) for name, results in per.items()}
    if args.details:
        failures = {name: [
            {"id": row["id"], "error": r.error, "keyword": r.keyword, "lenient": r.lenient, "strict": r.strict}
            for row, r in zip(rows, results) if r.error or r.lenient or r.strict] for name, results in per.items()}
        args.details.write_text(json.dumps({"dataset": args.dataset.name, "rows": len(rows), "summary": summary,
                                            "failures": failures}, indent=1))
    print_table(summary, sys.stdout)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
