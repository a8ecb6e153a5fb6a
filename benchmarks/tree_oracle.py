"""`python -m interlock.benchmarks.tree_oracle`: would a tree of draft candidates pay on this CPU?

Issue 13 asks for a small tree of suffix-draft candidates, verified in one forward, only if a CPU
verify row is cheap enough. This measures both sides in one run, at batch 1:

- what a verify row costs: one forward of R rows of a sequence after C cached tokens (C: the
  workload's mean prompt plus half its mean output), R = 1 .. the most a projected tree needs, all R
  in each round, medians over the rounds (benchmarks/step_costs.step_s, batch building inside), twice:
  with the dense head on every row, and without a head (the layers alone), which brackets a greedy
  step's, whose head computes only the logits a row's mask allows where it allows few
  (Transformer.head_argmax);
- what a sibling row would win: the engine runs the workload with `forced` and a recording suffix
  drafter (`SiblingRecorder`: the suffix drafter's own drafts after the grammar's forced tokens, i.e.
  suffix+forced without its long drafts), which also keeps, per lookup token, the trie's runners-up
  at that node (`SuffixDrafter.lookup_draft(siblings=...)`). A step's committed tokens say where the
  chain was refused and which token the target wanted there; a sibling equal to it would have been
  accepted, and its row would have given one more token (the target's next).

A tree with up to w - 1 siblings beside each lookup token ("all") or beside the first one only
("first") is then projected step by step: the chain's rows plus the siblings the trie had, one more
token where a sibling wins, each step costing the measured forward of its rows. Left out of the
projection: the rest of a step (grammar, drafting, host: unchanged by a tree), and the replay of
later steps (a win starts the next step one token later, with other drafts). Prints the win rates
and the projected tokens per forward-second of chain and trees; saves the per-step records under
benchmarks/results/.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import date
from pathlib import Path

import anyio
import torch

from interlock.benchmarks.common import load_average, median, print_json_last, print_table
from interlock.benchmarks.engine_bench import add_workload_args, bench_rows, workload
from interlock.benchmarks.prompts import build_messages
from interlock.benchmarks.step_costs import step_s
from interlock.drafters.combine import after_forced
from interlock.drafters.suffix import Draft, SuffixDrafter
from interlock.engine import Engine, EngineConfig, lane_threads
from interlock.logs import configure_logging
from interlock.models.loader import EMBEDDED, LoadedModel, load_model
from interlock.protocol.errors import InterlockError
from interlock.protocol.grammar import JsonSchema
from interlock.protocol.sampling import SamplingParams
from interlock.protocol.speculative import DraftRequest, SpeculativeConfig, SuffixConfig
from interlock.protocol.types import RequestId, TokenId

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class StepRecord:
    """One verify step of one request, as the chain drafted it and the target answered."""

    forced: int                     # grammar-forced tokens at the head of the draft
    drafted: int                    # forced + lookup tokens: the chain verified drafted + 1 rows
    accepted: int                   # drafts the target accepted
    siblings: tuple[int, ...]       # per lookup token, how many runners-up the trie had (<= w - 1)
    won_rank: int | None            # the refused lookup token's runner-up equal to the target's token
                                    # (0: the first runner-up); None: none was, or nothing was refused


def outcome(draft: Sequence[TokenId], forced: int, siblings: Sequence[Sequence[TokenId]],
            committed: Sequence[TokenId]) -> StepRecord | None:
    """The record of a step whose draft was `draft` (its first `forced` tokens forced, `siblings[j]` the
    runners-up of lookup token j) and whose committed tokens were `committed` (accepted drafts, then
    the target's token). None when the output ended inside the accepted drafts (no answer to read)."""
    accepted = 0
    while accepted < min(len(draft), len(committed)) and draft[accepted] == committed[accepted]:
        accepted += 1
    if accepted == len(committed):
        return None
    won = None
    j = accepted - forced
    if accepted < len(draft) and 0 <= j < len(siblings):
        target = committed[accepted]
        won = list(siblings[j]).index(target) if target in siblings[j] else None
    return StepRecord(forced, len(draft), accepted, tuple(len(s) for s in siblings), won)


def project(records: Sequence[StepRecord], step_ms: dict[int, float], width: int, where: str) -> dict:
    """Tokens per forward-second of the chain and of a tree with up to width - 1 siblings beside
    each lookup token ("all") or the first one ("first"), each step costing step_ms[its rows]."""
    if where not in ("all", "first"):
        raise ValueError(f"where must be 'all' or 'first', got {where!r}")
    chain_tokens = tree_tokens = 0
    chain_ms = tree_ms = 0.0
    extra_rows = wins = 0
    for r in records:
        beside = [min(n, width - 1) for n in (r.siblings if where == "all" else r.siblings[:1])]
        win = r.won_rank is not None and r.won_rank < width - 1 and (where == "all" or r.accepted == r.forced)
        chain_tokens += r.accepted + 1
        chain_ms += step_ms[r.drafted + 1]
        tree_tokens += r.accepted + 1 + win
        tree_ms += step_ms[r.drafted + 1 + sum(beside)]
        extra_rows += sum(beside)
        wins += win
    return {"width": width, "where": where, "steps": len(records), "extra_rows": extra_rows, "wins": wins,
            "win_per_extra_row": round(wins / extra_rows, 4) if extra_rows else 0.0,
            "chain_tokens_per_s": round(1e3 * chain_tokens / chain_ms, 2) if chain_ms else 0.0,
            "tree_tokens_per_s": round(1e3 * tree_tokens / tree_ms, 2) if tree_ms else 0.0,
            "tree_over_chain": round(tree_tokens * chain_ms / (chain_tokens * tree_ms), 4) if chain_ms else 0.0}


class SiblingRecorder:
    """A user drafter (drafters/base.py: Drafter and Tracked): the suffix drafter's drafts after the
    forced tokens, recording each step's runners-up and outcome as a StepRecord."""

    def __init__(self, suffix: SuffixDrafter, width: int) -> None:
        self.suffix = suffix
        self.width = width
        self.records: list[StepRecord] = []
        self._pending: dict[RequestId, tuple[tuple[TokenId, ...], int, tuple[tuple[TokenId, ...], ...]]] = {}

    def add(self, request_id: RequestId, prompt: tuple[TokenId, ...]) -> None:
        self.suffix.add(request_id, prompt)

    def remove(self, request_id: RequestId) -> None:
        self.suffix.remove(request_id)
        self._pending.pop(request_id, None)

    def counts(self) -> dict[str, int]:
        return self.suffix.counts()

    def propose(self, requests: Sequence[DraftRequest], k: int) -> list[list[TokenId]]:
        out = []
        for r in requests:
            found = Draft((), 0.0, 0)

            def lookup(n: int, head: Sequence[TokenId], rid: RequestId = r.request_id) -> list[TokenId]:
                nonlocal found
                found = self.suffix.lookup_draft(rid, n, after=head, siblings=self.width - 1)
                return list(found.tokens)

            draft = after_forced(r.forced, k, lookup)        # the forced tokens, then the lookup past them
            self._pending[r.request_id] = (tuple(draft), len(draft) - len(found.tokens), found.siblings)
            out.append(draft)
        return out

    def commit(self, request_id: RequestId, new_tokens: tuple[TokenId, ...]) -> None:
        self.suffix.commit(request_id, new_tokens)
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            record = outcome(*pending, new_tokens)
            if record is not None:
                self.records.append(record)


async def record_steps(loaded: LoadedModel, rows: list, repeats: int, draft_len: int, width: int,
                       max_tokens: int) -> tuple[SiblingRecorder, list[dict]]:
    spec = SpeculativeConfig(drafters=("forced",), max_draft_len=draft_len)
    recorder = SiblingRecorder(SuffixDrafter(SuffixConfig(), spec.step_drafts, lookup_len=draft_len), width)
    config = EngineConfig(speculative=replace(spec, user_drafter=recorder), max_batch_size=1)
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=0)
    outputs = []
    async with Engine(loaded, config) as engine:
        for row in rows:
            for _ in range(repeats):
                try:
                    c = await engine.complete(build_messages(row), grammar=JsonSchema(row.schema), sampling=sampling)
                except InterlockError:
                    continue
                outputs.append({"id": row.id, "prompt_tokens": c.stats.prompt_tokens, "token_ids": list(c.token_ids)})
    return recorder, outputs


def row_costs(loaded: LoadedModel, context: int, max_rows: int, rounds: int, repeats: int,
              head: bool) -> dict[int, float]:
    """Median ms of a forward of R rows after `context` tokens, R = 1 .. max_rows, every R each round."""
    times: dict[int, list[float]] = {r: [] for r in range(1, max_rows + 1)}
    for _ in range(rounds):
        for r in times:
            times[r].append(1e3 * step_s(loaded.model, context, r, repeats, head=head))
    return {r: median(t) for r, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_args(p)
    p.add_argument("--draft-len", type=int, default=3, help="K: lookup tokens after the forced ones")
    p.add_argument("--width", type=int, default=3, help="the widest tree projected (w - 1 runners-up per token)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3, help="rounds of the row-cost measurement (medians)")
    p.add_argument("--step-repeats", type=int, default=5, help="forwards per row count and round")
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/tree-oracle-DATE.json)")
    args = p.parse_args()
    if args.width < 2:
        p.error("--width must be at least 2 (one runner-up beside each token)")
    if not 1 <= args.draft_len <= 16:
        p.error("--draft-len must be in 1..16")
    base, what = workload(p, args)
    configure_logging(level="warning")
    torch.set_num_threads(1)            # before loading: the engine's model lane gets its own threads
    loaded = load_model(EMBEDDED)
    recorder, outputs = anyio.run(record_steps, loaded, bench_rows(base), args.repeats, args.draft_len,
                                  args.width, args.max_tokens)
    records = recorder.records
    if not records:
        raise SystemExit("no verify steps were recorded (every request failed?)")
    prompt = sum(o["prompt_tokens"] for o in outputs) / len(outputs)
    output = sum(len(o["token_ids"]) for o in outputs) / len(outputs)
    context = round(prompt + output / 2)
    max_rows = max(r.drafted + 1 + sum(r.siblings) for r in records)
    torch.set_num_threads(lane_threads(None))  # the engine's model lane threads, as model_speed times them
    load_before = load_average()
    costs = {name: row_costs(loaded, context, max_rows, args.rounds, args.step_repeats, head)
             for name, head in (("dense head", True), ("no head", False))}
    shapes = [{"rows_cost": head} | project(records, step_ms, w, where) for head, step_ms in costs.items()
              for where in ("first", "all") for w in range(2, args.width + 1)]
    refused = [r for r in records if r.accepted < r.drafted and r.accepted >= r.forced]
    result = {"workload": what, "draft_len": args.draft_len, "width": args.width, "max_tokens": args.max_tokens,
              "threads": torch.get_num_threads(), "context": context, "steps": len(records),
              "refused_lookup_steps": len(refused),
              "won_by_rank": {str(k): sum(r.won_rank == k for r in refused) for k in range(args.width - 1)},
              "step_ms": {head: {str(k): round(v, 3) for k, v in step_ms.items()} for head, step_ms in costs.items()},
              "shapes": shapes,
              "load_average_before": load_before, "load_average_after": load_average(),
              "records": [asdict(r) for r in records], "outputs": outputs}
    out = Path(args.out) if args.out else RESULTS / f"tree-oracle-{date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    dense, bare = costs["dense head"], costs["no head"]
    print_table(f"forward of R rows after {context} tokens, {result['threads']} threads, median of {args.rounds}",
                ["rows", "dense head ms", "over 1 row", "no head ms", "over 1 row"],
                [[k, round(dense[k], 2), round(dense[k] / dense[1], 2), round(bare[k], 2), round(bare[k] / bare[1], 2)]
                 for k in dense])
    keys = ["rows_cost", "where", "width", "steps", "extra_rows", "wins", "win_per_extra_row", "chain_tokens_per_s",
            "tree_tokens_per_s", "tree_over_chain"]
    print_table(f"{what}: {len(records)} steps, {len(refused)} refused a lookup token; projected trees",
                keys, [[s[k] for k in keys] for s in shapes])
    print_json_last({k: v for k, v in result.items() if k not in ("records", "outputs")} | {"saved": str(out)})


if __name__ == "__main__":
    main()
