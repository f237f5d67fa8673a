"""The ``ub`` parser, built from command modules, and how a command's failure is reported."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from ub.errors import UbError


class Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments as a UbError (one line) instead of usage + exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        import difflib
        import re

        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:  # a mistyped command or choice: the nearest one first
            near = difflib.get_close_matches(choice.group(1), re.findall(r"'([^']*)'",
                                                                         choice.group(2)), n=1)
            if near:
                message += f"; did you mean {near[0]!r}?"
        raise UbError(f"{message} (see `{self.prog} --help`)")


def build_parser(commands: Sequence[ModuleType]) -> argparse.ArgumentParser:
    """The ``ub`` parser with ``commands`` (modules with ``add_parser(sub)``), in that order."""
    parser = Parser(prog="ub", description="Self-play RL for language models on TextArena games.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in commands:
        command.add_parser(sub)
    return parser


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run its command; expected failures become one line and exit code 2,
    and a reader that stops reading (``ub sql ... | head``) ends it quietly with exit code 0."""
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # (the top parser finds them: name the command they were given to)
            raise UbError(f"unrecognized arguments: {' '.join(extra)} (see "
                          f"`{parser.prog} {args.command} --help`)")
        code = args.func(args)
        sys.stdout.flush()  # (here, where a closed pipe is caught, not at the exit)
        return code
    except BrokenPipeError:
        # Python would flush stdout again at exit and fail again: point it at /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UbError as exc:
        print(f"ub: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # Every ub write is atomic: what failed left nothing behind, so rerunning resumes.
        print(f"ub: error: {exc.strerror} writing {exc.filename or 'a file'}: free space, "
              "then run the same command again", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # (a command may say how to go on)
        print(f"ub: interrupted: {exc}" if str(exc) else "ub: interrupted", file=sys.stderr)
        return 130
