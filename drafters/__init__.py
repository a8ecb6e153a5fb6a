"""Drafters that propose tokens for the target to verify: grammar-forced tokens, n-gram prompt lookup,
suffix tries, draft models and user-provided drafters.

base.py     the Drafter protocol (`propose(requests, k)`) every lookup drafter and user drafter
            implements, and `Tracked` (add / commit / remove / counts) for the ones that keep
            per-request state
chain.py    DraftChain: per request and step, forced -> n-gram / suffix -> draft model -> user, the
            rules applied to every answer and the adaptive budget (the one home of the drafting order)
forced.py   ForcedDrafter: the grammar's forced (jump-forward) tokens as the first answer
ngram.py    NGramDrafter: prompt lookup with TensorRT-LLM's options (keep all / oldest / public pool),
            incremental index, O(max_matching_ngram_size) lookups per propose
suffix.py   SuffixDrafter: SuffixDecoding-style drafts from a per-request suffix trie and a bounded
            global trie over finished outputs (the most frequent continuation of the longest match)
model.py    DraftLM / ModelDrafter (a draft model's KV cache and generators) and DraftRounds (one
            step's draft loop, run by the DraftActor round by round around the draft-side mask rows)
combine.py  the pure rules: combine_drafts (longest answer), consistent_prefix (cut at a forced-token
            disagreement), after_forced (forced tokens, then a lookup past them)

Example of a user drafter: examples/user_drafter.py.
"""
