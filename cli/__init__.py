"""The `interlock` command: `run` (the embedded demo), `generate`, `bench`, `serve`.

- parser.py    the flags, each checked where argparse reads it (a bad value: a usage error, exit 2)
- commands.py  what each command does: results on stdout, progress, stats and logs on stderr;
               what fails without the model (a grammar, a tensor-parallel size) fails before it loads
- progress.py  progress on stderr (rich): a spinner on a terminal, one line with the time taken

`main` below runs one command; an interlock error ends it with one line on stderr (exit 2).
"""
from __future__ import annotations

import re
import sys

import anyio

from interlock.cli.parser import build_parser, flag
from interlock.protocol.errors import GrammarError, InterlockError, InvalidParameterError, user_message

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from interlock.cli import commands

    if args.command == "generate":           # the rules between flags, before any wait
        try:
            commands.sampling_from_args(args)
            commands.check_grammar_text(args)
        except InvalidParameterError as exc:
            print(f"interlock generate: error: {flag_message(exc)}", file=sys.stderr)
            return 2
        except GrammarError as exc:
            print(f"interlock generate: error: argument {commands.grammar_flag(args)}: {user_message(exc)}",
                  file=sys.stderr)
            return 2
    from interlock.logs import configure_logging

    configure_logging(json=args.log_json, level=args.log_level)
    import torch

    # The model lane runs torch at --threads (EngineConfig.threads); every other thread of this
    # process at 1, so that the lane's OpenMP pool is the only one (see streams/cpu_timeline.py).
    torch.set_num_threads(1)
    try:
        if args.command == "serve" and args.replicas:
            commands.serve_replicas(args)
        else:
            run = {"run": commands.run_demo, "generate": commands.generate, "bench": commands.bench,
                   "serve": commands.serve}[args.command]
            anyio.run(run, args)
    except InterlockError as exc:       # bad input or a failed load: what to do about it, on one line
        print(f"error: {type(exc).__name__}: {user_message(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def flag_message(exc: InvalidParameterError) -> str:
    """A parameter error as argparse words it, with flags for field names ("argument --max-tokens: ...")."""
    why = re.sub(r"\b(?:sampling\.)?([a-z]+(?:_[a-z]+)+)\b", lambda m: flag(m.group(1)), exc.reason)
    return f"argument {flag(exc.field)}: {why}"
