"""Speculation on a mixed free/constrained workload: free text that switches into a JSON tool call.

    python -m interlock.benchmarks.switch_bench [--model smollm2-135m-instruct] [--native] [--out FILE]

Few-shot prompts show answers of the form `<sentence> CALL:{json}\\n`; the grammar is a
StructuralTag whose trigger is `CALL:` (the JSON must satisfy the tool's schema, `\\n` closes it,
then the output ends). So each output is free text, the switch, a constrained call: n-gram drafts
from the examples cross the marker, forced drafts resume right after it. Every speculative mode runs
on the same prompts and model in one process (greedy, so every mode emits the same tokens, which
the script checks); tokens/s is shown as a ratio to "none". Prints a table, then one JSON line
with every mode's result and every output's token ids (saved by --out). --native runs every mode
a second time with the same grammar compiled natively (`native=True`: the backend's structural tag
or Lark grammar, rows written instead of skipped), rows marked "native", ratios still to the first.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import anyio

from interlock.benchmarks.common import load_average, print_json_last, print_table
from interlock.engine import Engine, EngineConfig
from interlock.grammars.validate import validate_output
from interlock.models.loader import LoadedModel, load_model
from interlock.protocol.grammar import GrammarConfig, JsonSchema, StructuralTag, Tag
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import SpeculativeConfig
from interlock.models.names import EMBEDDED

MODES = ["none", "ngram", "forced", "ngram+forced", "self-draft+forced"]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 14}},
          "required": ["city", "days"]}
GRAMMAR = StructuralTag(["CALL:"], [Tag("CALL:", JsonSchema(SCHEMA), "\n")], at_most=1)
NATIVE = StructuralTag(["CALL:"], [Tag("CALL:", JsonSchema(SCHEMA), "\n")], at_most=1, native=True)
SHOTS = ("Q: Will it rain in Oslo this week?\nA: Let me check the forecast for Oslo. CALL:{\"city\":\"Oslo\",\"days\":7}\n\n"
         "Q: Is Rome warm tomorrow?\nA: I will look up tomorrow in Rome. CALL:{\"city\":\"Rome\",\"days\":1}\n\n"
         "Q: Weather in Lima for three days?\nA: Checking three days of weather in Lima. CALL:{\"city\":\"Lima\",\"days\":3}\n\n")
QUESTIONS = ["Will it snow in Denver this weekend?", "How hot is Cairo for the next five days?",
             "Should I pack an umbrella for Paris tomorrow?", "What is the forecast in Tokyo for a week?",
             "Is it windy in Chicago over the next two days?", "Any sun in Dublin for the next four days?"]


async def run_mode(loaded: LoadedModel, mode: str, max_tokens: int, backend: str,
                   grammar: StructuralTag = GRAMMAR) -> dict:
    speculative = None if mode == "none" else SpeculativeConfig.parse(mode, max_draft_len=4)
    config = EngineConfig(speculative=speculative, grammar=GrammarConfig(backend=backend), max_batch_size=1)
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outputs = []
    async with Engine(loaded, config) as engine:
        await engine.complete(SHOTS + "Q: warm up\nA:", grammar=grammar, sampling=SamplingParams(max_tokens=4))
        start = time.perf_counter()
        for q in QUESTIONS:
            outputs.append(await engine.complete(f"{SHOTS}Q: {q}\nA:", grammar=grammar, sampling=sampling))
        elapsed = time.perf_counter() - start
    tokens = sum(c.stats.output_tokens for c in outputs)
    steps = sum(c.stats.steps for c in outputs)
    called, valid = 0, 0
    for c in outputs:
        if "CALL:" in c.text:
            called += 1
        if c.finish_reason == "stop":
            validate_output(grammar, c.text)          # raises on an invalid call
            valid += 1
    return {"mode": mode + (" native" if grammar.native else ""), "tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed,
            "acceptance_length": sum(c.stats.step_tokens for c in outputs) / steps if steps else 0.0,
            "drafted": sum(c.stats.drafted for c in outputs), "accepted": sum(c.stats.accepted for c in outputs),
            "called": called, "stopped_valid": valid,
            "outputs": [{"text": c.text, "token_ids": list(c.token_ids), "finish_reason": c.finish_reason}
                        for c in outputs]}


async def main_async(args: argparse.Namespace) -> dict:
    loaded = load_model(args.model)
    grammars = [GRAMMAR, NATIVE] if args.native else [GRAMMAR]
    results = [await run_mode(loaded, m, args.max_tokens, args.backend, g) for g in grammars for m in args.modes.split(",")]
    base = results[0]
    for r in results[1:]:
        same = [a["token_ids"] == b["token_ids"] for a, b in zip(base["outputs"], r["outputs"])]
        r["same_tokens_as_first"] = all(same)
    rows = [(r["mode"], r["tokens"], r["acceptance_length"], r["tokens_per_s"], r["tokens_per_s"] / base["tokens_per_s"],
             f"{r['called']}/{len(QUESTIONS)}", r.get("same_tokens_as_first", True)) for r in results]
    print_table(f"switching grammar (free text then CALL: json), {args.model}, greedy, batch 1",
                ["mode", "tokens", "accept len", "tok/s", "x none", "called", "same tokens"], rows)
    return {"model": args.model, "backend": args.backend, "max_tokens": args.max_tokens, "load_average": load_average(),
            "grammar": GRAMMAR.key, "native": args.native, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=EMBEDDED)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--native", action="store_true", help="also run every mode with native=True")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result = anyio.run(main_async, args)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print_json_last({k: v for k, v in result.items() if k != "results"}
                    | {"summary": [{k: r[k] for k in ("mode", "tokens_per_s", "acceptance_length")}
                                   for r in result["results"]]})


if __name__ == "__main__":
    main()
