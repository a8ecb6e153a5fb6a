"""Drafters that propose tokens for the target to verify: n-gram prompt lookup, draft models,
grammar-forced (jump-forward) tokens and user-provided drafters."""
