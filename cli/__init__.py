"""The `interlock` command: `run` (the embedded demo), `generate`, `bench`, `serve`.

- parser.py    the flags, each checked where argparse reads it (a bad value: a usage error, exit 2)
- commands.py  what each command does: results on stdout, progress, stats and logs on stderr;
               what fails without the model (a grammar, a tensor-parallel size) fails before it loads
- progress.py  progress on stderr (rich): a spinner on a terminal, one line with the time taken

`main` below runs one command. What it checks before any wait (the rules between generate's flags,
its grammar's text) imports neither torch nor the engine. An interlock error ends the command with
one line on stderr in argparse's words, naming the flag it is about where there is one (exit 2).
"""
from __future__ import annotations

import argparse
import re
import sys

import anyio

from interlock.cli.parser import build_parser, flag
from interlock.models.names import check_name
from interlock.protocol.errors import (DeviceUnavailableError, EmptyPromptError, GrammarError, InterlockError,
                                       InvalidParameterError, ModelNotFoundError, PromptTooLongError,
                                       UnsupportedModelError, user_message)

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from interlock.cli import commands

    try:
        if args.command == "generate":           # the rules between flags and the grammar's text, before any wait
            commands.sampling_from_args(args)
            commands.precheck_grammar(args)
        check_name(args.model)                    # a name that stands for no model, before any wait
        from interlock.logs import configure_logging

        configure_logging(json=args.log_json, level=args.log_level)
        if args.command == "serve" and args.replicas:
            commands.serve_replicas(args)
        else:
            run = {"run": commands.run_demo, "generate": commands.generate, "bench": commands.bench,
                   "serve": commands.serve}[args.command]
            anyio.run(run, args)
    except InterlockError as exc:       # bad input or a failed load: what to do about it, on one line
        print(f"interlock {args.command}: error: {error_message(args, exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def error_message(args: argparse.Namespace, exc: InterlockError) -> str:
    """An interlock error as argparse words a bad flag ("argument --max-tokens: ..."), for the flag
    it is about: a parameter's, the grammar's (generate's one grammar flag), --model's, --device's,
    the prompt's; any other error by its type."""
    from interlock.cli.commands import grammar_flag

    if isinstance(exc, InvalidParameterError):
        return flag_message(exc)
    about = {ModelNotFoundError: "--model", UnsupportedModelError: "--model", DeviceUnavailableError: "--device",
             PromptTooLongError: "prompt", EmptyPromptError: "prompt"}
    name = next((f for kind, f in about.items() if isinstance(exc, kind)), None)
    if isinstance(exc, GrammarError) and args.command == "generate":
        name = grammar_flag(args)              # generate's one grammar, from at most one flag
    return f"argument {name}: {user_message(exc)}" if name else f"{type(exc).__name__}: {user_message(exc)}"


def flag_message(exc: InvalidParameterError) -> str:
    """A parameter error as argparse words it, with flags for field names ("argument --max-tokens: ...")."""
    why = re.sub(r"\b(?:sampling\.)?([a-z]+(?:_[a-z]+)+)\b", lambda m: flag(m.group(1)), exc.reason)
    return f"argument {flag(exc.field)}: {why}"
