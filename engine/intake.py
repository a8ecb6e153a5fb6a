"""A request's way in: its prompt encoded and every parameter checked before anything is queued.

One error type per fault, raised for this request only:
    a prompt of the wrong type, a token id outside the vocabulary,
    a chat template that refuses the messages, a bad parameter   InvalidParameterError (field named)
    an empty prompt (or one that encodes to no token)            EmptyPromptError
    a prompt that leaves no room for one new token                PromptTooLongError
    a regex the end-of-request check cannot compile (`ab\\`)        GrammarError
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

from interlock.grammars.checks import check_regexes
from interlock.models.tokenizer import Message, Tokenizer
from interlock.protocol.errors import (
    EmptyPromptError, InterlockError, InvalidParameterError, PromptTooLongError,
)
from interlock.protocol.grammar import GrammarSpec
from interlock.protocol.messages import RequestSpec
from interlock.protocol.sampling import SamplingParams, check_guidance
from interlock.protocol.types import RequestId

Prompt = str | Sequence[Message] | Sequence[int]   # text, chat messages, or token ids
EMPTY_CHAT: list[Message] = [{"role": "user", "content": ""}]   # classifier-free guidance's default negative prompt


@dataclass(frozen=True)
class Intake:
    """What a request is checked against: the tokenizer and the engine's context."""

    tokenizer: Tokenizer
    max_context: int                 # prompt + at least one new token must fit

    def check(self, grammar: GrammarSpec | None, sampling: SamplingParams, negative_prompt: Prompt | None) -> None:
        """The request's parameters (the prompt is `encode`'s)."""
        if not isinstance(sampling, SamplingParams):
            raise InvalidParameterError("sampling", f"must be a SamplingParams, got {type(sampling).__name__}")
        if sampling.ignore_eos and grammar is not None:
            # Once the grammar completes, the stop token is the only one it allows: there is no going on.
            raise InvalidParameterError("ignore_eos", "cannot be combined with a grammar (a complete document "
                                                      "ends the request); use max_tokens or drop ignore_eos")
        check_regexes(grammar)          # a regex no output could pass: refused before anything runs
        check_guidance(sampling, negative_prompt)

    def request(self, rid: RequestId, prompt: Prompt, grammar: GrammarSpec | None, sampling: SamplingParams,
                negative_prompt: Prompt | None) -> RequestSpec:
        """A request checked and encoded (classifier-free guidance's negative prompt too)."""
        self.check(grammar, sampling, negative_prompt)
        tokens = self.encode(prompt, grammar)
        uncond = None
        if sampling.guidance_scale is not None:
            uncond = tuple(self.encode(negative_prompt, grammar) if negative_prompt is not None
                           else self.unconditional(grammar))
        return RequestSpec(rid, tuple(tokens), grammar, sampling, uncond)

    def unconditional(self, grammar: GrammarSpec | None = None) -> list[int]:
        """Classifier-free guidance's default negative prompt: an empty user turn where the model has
        a chat template, else its BOS alone (a base model's unconditional start)."""
        if self.tokenizer.has_chat_template:
            return self.encode(EMPTY_CHAT, grammar)
        if not self.tokenizer.prefix:
            raise InvalidParameterError("negative_prompt", "this model has neither a chat template nor a BOS "
                                                           "to guide against: give a negative prompt")
        return list(self.tokenizer.prefix)

    def encode(self, prompt: Prompt, grammar: GrammarSpec | None = None) -> list[int]:
        """The prompt's token ids: text as is, chat messages through the chat template (which thinks or
        not by the request's grammar, models/tokenizer.py), ids checked."""
        if _is_ids(prompt):
            return self._fits(self._ids(prompt))
        if not isinstance(prompt, str) and not _is_messages(prompt):
            raise InvalidParameterError("prompt", f"must be a str, a list of chat messages (dicts) or a list of "
                                                  f"token ids (ints), got {type(prompt).__name__}")
        if len(prompt) == 0:
            raise EmptyPromptError("the prompt is empty (an empty string or message list): give at least one token")
        try:
            tokens = self.tokenizer.encode_prompt(prompt, grammar)
        except InterlockError:
            raise
        except Exception as exc:        # jinja2 / transformers errors: how a chat template refuses bad messages
            raise InvalidParameterError("prompt", f"the chat template refused the messages: {exc}") from exc
        return self._fits(tokens)

    def _ids(self, ids: Sequence[int]) -> list[int]:
        """A prompt given as token ids: each must be a tokenizer id (the model's padding ids are not)."""
        vocab = self.tokenizer.vocab_size
        for i, t in enumerate(ids):
            if not 0 <= t < vocab:
                raise InvalidParameterError("prompt", f"token id {int(t)} at position {i} is outside the "
                                                      f"vocabulary [0, {vocab})")
        return [int(t) for t in ids]

    def _fits(self, tokens: list[int]) -> list[int]:
        if not tokens:
            raise EmptyPromptError("the prompt encodes to no tokens: give at least one token")
        if len(tokens) + 1 > self.max_context:
            raise PromptTooLongError(f"prompt has {len(tokens)} tokens; the engine's context is {self.max_context} "
                                     "(prompt + at least 1 generated token must fit): shorten the prompt")
        return tokens


def _is_ids(prompt: object) -> TypeGuard[Sequence[int]]:
    """A non-empty sequence of integers (bools are not token ids)."""
    return (isinstance(prompt, Sequence) and not isinstance(prompt, str) and len(prompt) > 0
            and all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt))


def _is_messages(prompt: object) -> TypeGuard[Sequence[Message]]:
    """A sequence of mappings: chat messages, whose keys the chat template checks."""
    return isinstance(prompt, Sequence) and not isinstance(prompt, str) and all(isinstance(m, Mapping) for m in prompt)
