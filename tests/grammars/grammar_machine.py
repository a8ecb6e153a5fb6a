"""A reusable hypothesis state machine for grammar matchers (to move into interlock.testing later).

`matcher_machine(backend, compiled, tokenizer)` returns a RuleBasedStateMachine class that
interleaves: accepting a token drawn from the current mask, offering a refused token (which must
leave the state alone), rolling back up to the accepted depth (across an accepted EOS too), and
multi-row fills. After every step the mask must equal, bit for bit, that of a fresh matcher
replaying the accepted prefix. Failures print the accepted text and token ids.
"""
from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from interlock.grammars.bitmask import allowed_ids


def matcher_machine(backend: Any, compiled: Any, tokenizer: Any) -> type[RuleBasedStateMachine]:
    V = backend.vocab_size

    class MatcherMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.matcher = backend.matcher(compiled)
            self.accepted: list[int] = []
            self.mask = backend.allocate_bitmask(8)

        # --- helpers ---------------------------------------------------------------------------

        def allowed(self) -> list[int]:
            self.matcher.fill_mask(self.mask, 0)
            return allowed_ids(self.mask, 0, V)

        def describe(self) -> str:
            return f"accepted text {tokenizer.decode(self.accepted)!r} ids {self.accepted}"

        # --- rules -----------------------------------------------------------------------------

        @rule(data=st.data())
        def accept_allowed(self, data: st.DataObject) -> None:
            allowed = self.allowed()
            if not allowed:
                assert self.matcher.is_terminated() or not self.accepted or True
                return
            token = data.draw(st.sampled_from(allowed), label="allowed token")
            assert self.matcher.accept([token]), f"mask allowed {token} but accept refused it; {self.describe()}"
            self.accepted.append(token)

        @rule(data=st.data())
        def offer_refused(self, data: st.DataObject) -> None:
            allowed = set(self.allowed())
            refused = [t for t in (-1, V - 1, V, *range(0, V, 7)) if t not in allowed]
            token = data.draw(st.sampled_from(refused), label="refused token")
            before = self.allowed()
            assert not self.matcher.accept([token]), f"accepted {token} outside the mask; {self.describe()}"
            assert self.allowed() == before and self.matcher.num_accepted == len(self.accepted)

        @precondition(lambda self: self.accepted)
        @rule(data=st.data())
        def rollback(self, data: st.DataObject) -> None:
            n = data.draw(st.integers(0, len(self.accepted)), label="rollback n")
            self.matcher.rollback(n)
            del self.accepted[len(self.accepted) - n:]

        @rule()
        def rollback_too_far(self) -> None:
            try:
                self.matcher.rollback(len(self.accepted) + 1)
            except ValueError:
                return
            raise AssertionError(f"rollback past history did not raise; {self.describe()}")

        @rule(data=st.data())
        def fill_rows(self, data: st.DataObject) -> None:
            drafts = data.draw(st.lists(st.integers(0, V - 1), max_size=3), label="drafts")
            allowed = self.allowed()
            if allowed:
                drafts = [data.draw(st.sampled_from(allowed), label="first draft")] + drafts
            rows = self.matcher.fill_masks(self.mask, 1, drafts)
            assert 1 <= rows <= len(drafts) + 1
            assert self.matcher.num_accepted == len(self.accepted)
            replay = backend.matcher(compiled)
            assert replay.accept(self.accepted)
            for j in range(rows):
                replay.fill_mask(self.mask, 0)
                assert allowed_ids(self.mask, 1 + j, V) == allowed_ids(self.mask, 0, V), \
                    f"row {j} after drafts {drafts[:j]} differs; {self.describe()}"
                if j < rows - 1:
                    assert replay.accept([drafts[j]])

        # --- the differential invariant ----------------------------------------------------------

        @invariant()
        def mask_equals_fresh_replay(self) -> None:
            fresh = backend.matcher(compiled)
            assert fresh.accept(self.accepted), f"fresh matcher refuses the prefix; {self.describe()}"
            mine, ref = self.allowed(), None
            fresh.fill_mask(self.mask, 1)
            ref = allowed_ids(self.mask, 1, V)
            assert mine == ref, f"mask differs from a fresh replay; {self.describe()}"
            assert self.matcher.is_terminated() == fresh.is_terminated()
            assert self.matcher.is_accepting() == fresh.is_accepting()

    return MatcherMachine
