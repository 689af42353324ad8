"""The `tpcost` command line: the one root; one module per subcommand in this package, each with
register(sub) and its command function(s):

    whatif, op, profiles (profiles, models), evaluate, vllm_config, calib_cmds (calibrate, validate)

costmodel holds no argparse; calib (and torch) are imported only inside the calibrate/validate
commands.

Used by the console script and by `python -m integration`. Importing a subcommand module is not
optional: an ImportError there is a bug and fails loudly, never a silently missing command (torch
and vllm themselves are imported only inside the commands that need them).
"""

from __future__ import annotations

import argparse
import sys

from costmodel.errors import TpcostError

from . import calib_cmds, collective, ep, evaluate, op, profiles, vllm_config, whatif


class _Parser(argparse.ArgumentParser):
    """argparse, with every bad value of a call reported at once, in one line (exit 2, no usage
    dump)."""

    _bad: list[str]

    def error(self, message):
        raise TpcostError(message)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._bad = []
        try:
            ns, extras = super().parse_known_args(args, namespace)
        except (
            TpcostError
        ) as e:  # a later error (a missing flag, an unknown command): after the values seen
            raise TpcostError("; ".join(dict.fromkeys([*self._bad, str(e)]))) from None
        if self._bad:  # carried up through the subcommand's namespace to parse_args
            setattr(ns, _BAD_VALUES, [*getattr(ns, _BAD_VALUES, []), *self._bad])
        return ns, extras

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, extras = self.parse_known_args(args, namespace)
        bad = list(getattr(ns, _BAD_VALUES, []))
        if extras:
            bad.append(f"unrecognized arguments: {' '.join(extras)}")
        if bad:
            raise TpcostError("; ".join(dict.fromkeys(bad)))
        return ns

    # a bad value is noted and parsing goes on to the next flag
    def _get_value(self, action, arg_string):
        if isinstance(action, argparse._SubParsersAction):
            return super()._get_value(action, arg_string)
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as e:
            self._bad.append(str(e))
            return _BAD

    def _check_value(self, action, value):
        if value is _BAD:
            return
        if isinstance(action, argparse._SubParsersAction):  # an unknown command stops the parse
            return super()._check_value(action, value)
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as e:
            self._bad.append(str(e))


_BAD = object()  # the value of a flag whose string was refused (never reaches a command)
_BAD_VALUES = "_tpcost_bad_values"  # the namespace attribute the refused values travel up in


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tpcost")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="tpcost",
        description="When does SP + AsyncTP pay off? A calibrated cost model for vLLM.",
    )
    ap.add_argument("--version", action="version", version=f"tpcost {_version()}")
    sub = ap.add_subparsers(dest="cmd", parser_class=_Parser)
    for module in (whatif, op, collective, ep, profiles, evaluate, vllm_config, calib_cmds):
        module.register(sub)
    return ap


def main(argv=None) -> int:
    """Run one tpcost command; returns its exit code (0 ok, 2 bad input, 130 interrupted)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        ap = build_parser()
        if not argv:
            argv = ["whatif"]
        # an MoE under DP+EP: the EP step's command
        if argv[0] == "whatif" and "--enable-expert-parallel" in argv:
            argv = ["ep", *argv[1:]]
        args = ap.parse_args(argv)
        if not getattr(args, "func", None):
            ap.print_help()
            return 2
        return int(args.func(args) or 0)
    except TpcostError as e:
        print(f"tpcost: error: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print(
            "tpcost: error: out of memory (a smaller --max-num-batched-tokens, fewer --tokens, or "
            "--no-band needs "
            "less)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("tpcost: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `tpcost whatif | head`: the reader left; not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
