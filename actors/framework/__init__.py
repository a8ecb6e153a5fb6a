"""The actor framework, independent of what the actors do:

base.py     `Actor`: one task, one bounded inbox, one receive loop, lifecycle hooks
channel.py  `Channel[T]`, the bounded, closable actor inbox (`send`/`send_nowait`, `receive`/
            `receive_nowait`, `close`, `statistics()`)
reply.py    `Reply[T]` one-shot reply slots and `PendingReplies`, which fails them all when their
            actor stops
runtime.py  every actor in one anyio task group, started in order, stopped in reverse
"""
