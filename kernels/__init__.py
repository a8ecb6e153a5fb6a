"""Synchronous tensor functions: bitmask apply, sampling, rejection sampling, CFG combine.

Each has a torch reference; device variants sit beside it behind one dispatcher per function.
"""
