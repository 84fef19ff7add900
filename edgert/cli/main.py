"""Entry point of the ``edgert`` command.

Errors edgert knows about (:class:`~edgert.errors.EdgertError`) print one line to stderr and exit 1;
usage errors exit 2 (argparse); ``--debug`` shows tracebacks. Anything else is an edgert bug and keeps
its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from edgert import __version__
from edgert.cli.native_logs import quiet_native_logs
from edgert.errors import EdgertError, OutputClosed
from edgert.redact import install_log_redaction, redact
from edgert.service.journal import JournalFormatter, stderr_is_journal

# Subcommand modules under edgert.cli, in the order --help lists them. Each imports its heavy
# dependencies inside its run function, so --help works whatever is installed.
SUBCOMMANDS: tuple[str, ...] = (
    "info", "inspect", "config", "build", "convert", "calibrate", "compare", "val", "rebatch", "bench", "run",
    "demo", "service", "power", "update",
)


def _setup_logging(verbosity: int) -> None:
    level = logging.WARNING - 10 * verbosity
    # A level prefix on every line: journald and humans both read it (no timestamps: journald adds them).
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr, force=True)
    if stderr_is_journal():  # under systemd: <N> priority prefixes, so `journalctl -p warning` works
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JournalFormatter("%(levelname)s %(name)s: %(message)s"))
    install_log_redaction()  # a camera's password in a URI never reaches the journal
    quiet_native_logs(verbosity)  # FFmpeg/OpenCV/GStreamer lines only with -v


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgert",
        description="Build, calibrate, run, measure and ship ONNX models on NVIDIA Jetson.",
    )
    parser.add_argument("--version", action="version", version=f"edgert {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"edgert.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose + (2 if args.debug else 0))
    try:
        code = args.func(args)
    except (BrokenPipeError, OutputClosed):
        # The reader of our stdout went away (`edgert run --json | head -1`): nothing is wrong with the run
        # and nobody is left to tell. Exit quietly the way a program killed by SIGPIPE does.
        _silence_stdout()
        return EXIT_STDOUT_CLOSED
    except EdgertError as exc:
        if args.debug:
            raise
        print(f"{'<3>' if stderr_is_journal() else ''}edgert: error: {redact(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("edgert: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        if args.debug:
            raise
        print(f"{'<3>' if stderr_is_journal() else ''}edgert: error: out of memory. Note: lower preprocess.size, "
              "runtime.queue_size or the batch", file=sys.stderr)
        return 1
    try:
        sys.stdout.flush()  # a pipe closed after the last print fails here, at exit: same quiet end
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_STDOUT_CLOSED
    return int(code or 0)


#: What a shell reports for a program ended by SIGPIPE (128 + 13): the reader of stdout left first.
EXIT_STDOUT_CLOSED = 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's own flush at exit cannot raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a real file (tests capture it): nothing to flush
        pass


if __name__ == "__main__":
    sys.exit(main())
