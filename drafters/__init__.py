"""Drafters that propose tokens for the target to verify: n-gram prompt lookup, draft models,
grammar-forced (jump-forward) tokens and user-provided drafters.

ngram.py    NGramDrafter: prompt lookup with TensorRT-LLM's options (keep all / oldest / public pool),
            incremental index, O(max_matching_ngram_size) lookups per propose
chain.py    DraftChain: per request and step, forced -> n-gram -> user drafts and the adaptive budget
            (the one home of the drafting order); which requests a draft model continues
suffix.py   SuffixDrafter: SuffixDecoding-style drafts from a per-request suffix trie and a bounded
            global trie over finished outputs (the most frequent continuation of the longest match)
combine.py  combine_drafts (longest useful draft among members), forced_then_ngram (forced tokens,
            then the n-gram continuation past them)
base.py     the Drafter Protocol for user-provided drafters (wired in actors/draft_actor.py;
            example: examples/user_drafter.py)
"""
