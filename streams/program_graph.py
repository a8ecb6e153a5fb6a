"""The dependencies of a captured program: which of its ops must finish before another may start.

An op depends on the op before it on its lane (stream order) and, for a wait, on the record of
the same event that the wait binds to (the latest one before it in host order). `ancestors(program)`
gives, for each entry of a `RulesProgram` (streams/cuda_rules.py), every entry it transitively
depends on. What the step's layout promises (actors/step/program.py) is checked on this graph: the
forward depends on no host function of its step, and the verification on the mask fill.
"""
from __future__ import annotations

from interlock.streams.cuda_rules import Entry, RulesProgram


def ancestors(program: RulesProgram) -> list[set[int]]:
    """For each entry (by index), the indices of every entry it depends on."""
    entries = program.entries
    direct: list[set[int]] = [set() for _ in entries]
    last_on_lane: dict[int, int] = {}
    last_record: dict[int, int] = {}
    for i, e in enumerate(entries):
        lane = id(e.lane)
        if lane in last_on_lane:
            direct[i].add(last_on_lane[lane])
        last_on_lane[lane] = i
        if e.kind == "record":
            last_record[id(e.target)] = i
        elif e.kind == "wait" and e.private and id(e.target) in last_record:
            direct[i].add(last_record[id(e.target)])
    closure: list[set[int]] = []
    for i in range(len(entries)):        # entries only depend on earlier ones: one pass in order
        seen = set(direct[i])
        for j in direct[i]:
            seen |= closure[j]
        closure.append(seen)
    return closure


def find(program: RulesProgram, name: str, kind: str | None = None) -> list[int]:
    """Indices of the entries whose name ends with `name` (a qualname such as 'GrammarActor.fill')."""
    return [i for i, e in enumerate(program.entries) if e.name.endswith(name) and (kind is None or e.kind == kind)]


def host_functions(program: RulesProgram, among: set[int]) -> list[Entry]:
    """The host-function entries among `among`."""
    return [program.entries[i] for i in sorted(among) if program.entries[i].kind == "host"]
