"""One speculative step and its planning:

program.py  the step: its prologue on the event loop, then one lane program (the host order of
            every part's lane ops), captured once per shape and replayed
state.py    the step's per-slot state and the step boundary (loop-side changes between steps)
planner.py  the Scheduler's request view (its Phase) and the step plan, as pure functions
watchdog.py a step that never reports back (a device fault, a hang) becomes a typed error
"""
