"""Inert data that crosses a boundary: id aliases, frozen configs and specs, messages and typed errors.

Nothing in here imports the rest of the project, does I/O or holds mutable state.
"""
