"""Command-line conventions shared by the ``python -m mohge.<command>`` entry points: one line per refusal, and
exit codes that mean the same in every command (the table is docs/errors.md)."""

from __future__ import annotations

import errno
import functools
import logging
import os
import signal
from collections.abc import Callable, Sequence

from .atomic import LockedError
from .strict import ConfigError

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


# A user mistake: a bad config, a missing or malformed file, a value out of range.
USER_ERRORS = (ConfigError, FileNotFoundError, ValueError)
# OS errors that are the machine's answer rather than a bug: reported in one line with EXIT_IO.
IO_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO, errno.EINTR}


def describe_os_error(err: OSError) -> str:
    """``No space left on device (ENOSPC): /path/file``."""
    name = errno.errorcode.get(err.errno or 0, "?")
    where = f": {err.filename}" if err.filename else ""
    return f"{err.strerror or err} ({name}){where}"


def exit_code(err: BaseException) -> int | None:
    """The documented exit code of an error a command reports in one line (None: a bug, let it raise)."""
    if isinstance(err, USER_ERRORS):
        return EXIT_USER
    if isinstance(err, LockedError):
        return EXIT_BUSY
    if isinstance(err, OSError) and err.errno in IO_ERRNOS:
        return EXIT_IO
    return None


def user_errors(main: Callable[[Sequence[str] | None], int]) -> Callable[[Sequence[str] | None], int]:
    """Wrap a ``main``: a user mistake, a busy output or a refused read/write prints one clear line (naming the
    key or file) and exits with its documented status instead of a traceback. ``MOHGE_DEBUG=1`` re-raises,
    for the full traceback."""

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
        except (*USER_ERRORS, LockedError, OSError) as err:
            code = exit_code(err)
            if code is None or os.environ.get("MOHGE_DEBUG"):
                raise
            text = describe_os_error(err) if code == EXIT_IO else str(err)
            logging.getLogger("mohge").error("%s: %s", type(err).__name__, text)
            return code

    return wrapped
