"""A user-provided drafter: propose continuations from a phrase book.

Run: python -m interlock.examples.user_drafter

Any object with `propose(requests, k) -> list[list[int]]` is a drafter (drafters/base.py). It runs
on the model lane before each target forward, so it must be quick. Its drafts are verified by the
target model, so a drafter can only change speed, never the output: a wrong guess is simply
rejected. `request.forced` holds the grammar's forced next tokens (a draft that disagrees with one
is cut there); a drafter that also has `add`/`commit`/`remove`/`counts` (drafters.base.Tracked)
keeps its own per-request state and is handed no `tokens`.
"""
from __future__ import annotations

from collections.abc import Sequence

import anyio

from interlock import Engine, EngineConfig, JsonSchema, SamplingParams, SpeculativeConfig, load_model
from interlock.protocol.speculative import DraftRequest


class PhraseBookDrafter:
    """If the output so far ends with the start of a known phrase, propose the rest of it."""

    def __init__(self, tokenizer, phrases: Sequence[str]) -> None:
        self.phrases = [tokenizer.encode(p) for p in phrases]

    def propose(self, requests: Sequence[DraftRequest], k: int) -> list[list[int]]:
        out = []
        for request in requests:
            draft: list[int] = []
            for phrase in self.phrases:
                for cut in range(len(phrase) - 1, 0, -1):        # longest matching phrase prefix
                    if tuple(request.tokens[-cut:]) == tuple(phrase[:cut]):
                        draft = phrase[cut: cut + k]
                        break
                if draft:
                    break
            out.append(draft)
        return out


async def main() -> None:
    loaded = load_model("smollm2-135m-instruct")
    drafter = PhraseBookDrafter(loaded.tokenizer, ['{"city":"', '","country":"'])
    config = EngineConfig(speculative=SpeculativeConfig(drafters=("forced",), user_drafter=drafter))
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"]}
    async with Engine(loaded, config) as engine:
        result = await engine.complete([{"role": "user", "content": "Where is the Eiffel Tower? Answer in JSON."}],
                                       grammar=JsonSchema(schema), sampling=SamplingParams(max_tokens=40))
    print(result.text)
    print(f"acceptance length {result.stats.mean_acceptance_length:.2f}, "
          f"{result.stats.accepted}/{result.stats.drafted} drafts accepted")


if __name__ == "__main__":
    anyio.run(main)
