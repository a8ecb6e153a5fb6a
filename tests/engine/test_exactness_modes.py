"""Greedy speculation changes speed, never output, compared with NO speculation: with the grammar
off for n-gram, forced, adaptive and user drafters; with the `auto` grammar backend; and for a
draft model loaded from a checkpoint file (`draft:PATH`)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from interlock.actors.verifier_actor import VerifierActor
from interlock.engine import Engine, EngineConfig
from interlock.kernels import native
from interlock.models.loader import load_model
from interlock.protocol.grammar import Choice, GrammarConfig
from interlock.protocol.sampling import Completion, SamplingParams
from interlock.protocol.speculative import SpeculativeConfig

from helpers import GRAMMARS, PROMPTS, assert_all_free, complete_all, wait_idle


class Always:
    """A user drafter that proposes one token k times."""

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, requests, k):
        return [[self.token] * k for _ in requests]


class EchoLast:
    """A user drafter that proposes the last token again, k times (right whenever the output repeats)."""

    def propose(self, requests, k):
        return [[r.tokens[-1]] * k for r in requests]


def _modes() -> dict[str, SpeculativeConfig]:
    return {
        "ngram": SpeculativeConfig(("ngram",), max_draft_len=3),
        "forced": SpeculativeConfig(("forced",), max_draft_len=3),
        "ngram+forced+adaptive": SpeculativeConfig.parse("ngram+forced+adaptive", max_draft_len=3),
        "user:echo": SpeculativeConfig((), max_draft_len=3, user_drafter=EchoLast()),
    }


async def _run(loaded, speculative: SpeculativeConfig | None, grammars, *, backend: str = "auto",
               max_tokens: int = 24, prompts=PROMPTS) -> list[Completion]:
    config = EngineConfig(speculative=speculative, grammar=GrammarConfig(backend=backend), max_batch_size=4)
    cases = [(prompts[i % len(prompts)], grammars[i % len(grammars)], SamplingParams(max_tokens=max_tokens))
             for i in range(len(prompts) * len(grammars))]
    async with Engine(loaded, config) as engine:
        out = await complete_all(engine, cases)
        await wait_idle(engine)
        await assert_all_free(engine)
    return [out[i] for i in range(len(out))]


def _same(base: list[Completion], got: list[Completion], mode: str) -> None:
    for i, (want, have) in enumerate(zip(base, got)):
        assert have.token_ids == want.token_ids, f"{mode}: case {i} differs from no speculation"
        assert have.finish_reason == want.finish_reason


@pytest.mark.parametrize("mode", [*_modes(), "user:always"])
async def test_grammar_off_every_drafter_equals_no_speculation(tiny, mode: str) -> None:
    base = await _run(tiny, None, [None])
    if mode == "user:always":                      # always the token the model emits most: often right
        common = Counter(t for c in base for t in c.token_ids).most_common(1)[0][0]
        speculative = SpeculativeConfig((), max_draft_len=4, user_drafter=Always(common))
    else:
        speculative = _modes()[mode]
    got = await _run(tiny, speculative, [None])
    _same(base, got, mode)
    if mode != "forced":                           # forced drafts need a grammar: none here
        assert sum(c.stats.accepted for c in got) > 0, f"{mode} never had a draft accepted"
        assert sum(c.stats.steps for c in got) < sum(c.stats.steps for c in base)


@pytest.mark.parametrize("mode", ["ngram+forced+adaptive", "user:echo"])
async def test_auto_backend_with_grammars_equals_no_speculation(tiny, mode: str) -> None:
    base = await _run(tiny, None, GRAMMARS, backend="auto")
    got = await _run(tiny, _modes()[mode], GRAMMARS, backend="auto")
    _same(base, got, mode)
    assert sum(c.stats.accepted for c in got) > 0


@pytest.mark.parametrize("extra", [0, 4])
async def test_forced_tokens_take_rows_beyond_the_draft_length(tiny, extra: int) -> None:
    # One long choice: after its first token every token is forced. With K = 1, forced_extra = 0
    # caps a step at 2 tokens; 4 extra rows carry up to 6, and the output stays the same.
    grammar = [Choice(["abc xyz abc xyz abc xyz abc xyz"])]
    base = await _run(tiny, None, grammar, max_tokens=64)
    got = await _run(tiny, SpeculativeConfig(("forced",), max_draft_len=1, forced_extra=extra), grammar, max_tokens=64)
    _same(base, got, f"forced:{extra}")
    tokens, steps = sum(len(c.token_ids) for c in got), sum(c.stats.steps for c in got)
    if extra:
        assert steps * 2 < tokens, "no step carried more than K + 1 tokens"
    else:
        assert steps * 2 >= tokens


@pytest.mark.skipif(not native.available(), reason="no C++ compiler: the lean greedy path needs the native kernels")
@pytest.mark.parametrize("model,sparse", [("tiny", True), ("tiny_float", False)])
async def test_the_lean_greedy_path_decides_what_the_general_one_does(request, model: str, sparse: bool,
                                                                      monkeypatch) -> None:
    # Greedy rows with only a grammar take one native argmax pass (actors/verifier_actor.py): the
    # sparse head over the hidden rows (int8 head) or masked_argmax over the logits (float head);
    # the general path masks the logits and runs rejection_sample_greedy. Same tokens, same stats.
    tiny = request.getfixturevalue(model)
    assert tiny.model.sparse_head == sparse
    spec = SpeculativeConfig.parse("ngram+forced", max_draft_len=3)
    lean = await _run(tiny, spec, GRAMMARS + [None])
    init = VerifierActor.__init__

    def general(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        self.lean = False

    monkeypatch.setattr(VerifierActor, "__init__", general)
    for want, have in zip(await _run(tiny, spec, GRAMMARS + [None]), lean):
        assert have.token_ids == want.token_ids and have.finish_reason == want.finish_reason
        assert (have.stats.steps, have.stats.drafted, have.stats.accepted) == \
            (want.stats.steps, want.stats.drafted, want.stats.accepted)


def _checkpoint(folder: Path) -> Path:
    """A small random Llama checkpoint directory (config.json, model.safetensors, a word-level tokenizer)."""
    import transformers
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = 320                                    # > the tokenizer's 257 ids, as in real checkpoints
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": vocab,
           "num_hidden_layers": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
           "tie_word_embeddings": False, "torch_dtype": "float32"}
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.AutoConfig.for_model(
        **{k: v for k, v in cfg.items() if k != "architectures"})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.08 if p.dim() > 1 else 0.5)
    # Byte-level, one id per byte plus <eos>: a decoder both grammar backends understand.
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    raw = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)} | {"<eos>": 256}, []))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    transformers.PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>").save_pretrained(str(folder))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


# bf16: the cache rounds K/V to bf16, which turns a prompt chunked differently by the draft (the
# dense path rounds a row by chunk length) into rejected drafts; the draft prefills as the target does.
@pytest.mark.parametrize("kv_dtype", ["float32", "float16", "bfloat16"])
async def test_draft_model_from_a_checkpoint_file_equals_no_speculation(tmp_path: Path, kv_dtype: str) -> None:
    path = _checkpoint(tmp_path / "ckpt")
    target = load_model(str(path), kv_dtype=kv_dtype)
    prompts = ["Once upon a time", "abc abc abc abc", "List three colors:"]
    speculative = SpeculativeConfig.parse(f"draft:{path}", max_draft_len=3)
    assert speculative.draft_model == str(path)
    base = await _run(target, None, [None], prompts=prompts, max_tokens=20)
    got = await _run(target, speculative, [None], prompts=prompts, max_tokens=20)
    _same(base, got, "draft:PATH")
    drafted, accepted = sum(c.stats.drafted for c in got), sum(c.stats.accepted for c in got)
    assert drafted > 0 and accepted == drafted           # the draft is the target itself: every draft right
