"""Command-line conventions shared by every ``mohge <command>`` (and ``python -m mohge.train``): one logging set-up,
one line per refusal, and exit codes that mean the same in every command (the table is docs/errors.md).

The exit-code policy: a user mistake is a :class:`ConfigError` (the one user-error class, naming the key or file
and the value) and prints one line with status 2; a busy output folder (5), a refused read or write (4) and a
signal (128 + N) are one line too; any other exception, ``ValueError`` included, is a bug: it keeps its
traceback and the process exits 1.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from .atomic import LockedError
from .knobs import ConfigError

EXIT_OK = 0
EXIT_USER = 2  # a bad config, a missing or malformed input file, a corrupted checkpoint or model folder
EXIT_NONFINITE = 3  # training stopped at a NaN/inf loss or gradient norm (mohge.train)
EXIT_IO = 4  # the system refused a read or write: disk full, permission denied, read-only or failing disk
EXIT_BUSY = 5  # another process writes the same output folder (its lock names it)
EXIT_PEER = 6  # a collective failed: another rank died or stalled past train.parallel.timeout_s (mohge.train)
# 128 + N: stopped by signal N (143 SIGTERM, 130 SIGINT), as a shell reports it; mohge.train checkpoints first


class Interrupted(BaseException):
    """A signal that stops a command at once (SIGTERM or SIGINT outside mohge.train's step loop, or a second
    one): one line and status 128 + signum. A BaseException, as KeyboardInterrupt, so no ``except Exception``
    on the way swallows it (mohge.train.runtime.GracefulStop raises it)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"{signal.Signals(signum).name} received: stopped")


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# OS errors that are the machine's answer rather than a bug: reported in one line with EXIT_IO.
IO_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO, errno.EINTR}


def describe_os_error(err: OSError) -> str:
    """``No space left on device (ENOSPC): /path/file``."""
    name = errno.errorcode.get(err.errno or 0, "?")
    where = f": {err.filename}" if err.filename else ""
    return f"{err.strerror or err} ({name}){where}"


def setup_logging(level: str | int = "INFO") -> None:
    """The logging of every command: ``time LEVEL logger: message`` on stderr. Under torchrun (``RANK`` set) the
    rank follows the logger's name (``mohge.train[1]: ...``) and ranks other than 0 log warnings and errors only.
    A no-op where logging is already configured (a test's capture, a command called by another)."""
    rank = os.environ.get("RANK")
    fmt = LOG_FORMAT if rank is None else LOG_FORMAT.replace("%(name)s", f"%(name)s[{rank}]")
    logging.basicConfig(level=level if rank in (None, "0") else logging.WARNING, format=fmt, stream=sys.stderr)


class ProgressLines:
    """Where a progress bar writes off a terminal (a SLURM log, a pipe): tqdm redraws its one line after a carriage
    return, which a log file keeps as one ever longer line; here every redraw is a line of its own, without the
    padding that blanked the previous one."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def progress_stream() -> TextIO | ProgressLines:
    """The stream of a command's progress bar: stderr on a terminal, else stderr a whole line per update."""
    return sys.stderr if sys.stderr.isatty() else ProgressLines(sys.stderr)


def exit_code(err: BaseException) -> int | None:
    """The documented exit code of an error a command reports in one line (None: a bug, let it raise)."""
    if isinstance(err, ConfigError):
        return EXIT_USER
    if isinstance(err, LockedError):
        return EXIT_BUSY
    if isinstance(err, OSError) and err.errno in IO_ERRNOS:
        return EXIT_IO
    return None


def user_errors(main: Callable[[Sequence[str] | None], int]) -> Callable[[Sequence[str] | None], int]:
    """Wrap a ``main``: a user mistake (:class:`ConfigError`), a busy output or a refused read/write prints one
    clear line (naming the key or file) and exits with its documented status instead of a traceback; anything
    else propagates with its traceback (exit 1). ``MOHGE_DEBUG=1`` re-raises every error, for the full traceback."""

    @functools.wraps(main)
    def wrapped(argv: Sequence[str] | None = None) -> int:
        try:
            return main(argv)
        except (Interrupted, KeyboardInterrupt) as err:  # Ctrl-C, SIGTERM: one line, not a traceback
            if os.environ.get("MOHGE_DEBUG"):
                raise
            signum = getattr(err, "signum", signal.SIGINT)
            logging.getLogger("mohge").error("%s received: stopped", signal.Signals(signum).name)
            return 128 + signum
        except (ConfigError, LockedError, OSError) as err:
            code = exit_code(err)
            if code is None or os.environ.get("MOHGE_DEBUG"):
                raise
            text = describe_os_error(err) if code == EXIT_IO else str(err)
            logging.getLogger("mohge").error("%s: %s", type(err).__name__, text)
            return code

    return wrapped
