"""Command-line conventions shared by the ``python -m mohge.<command>`` entry points."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence

from .config import ConfigError

# A user mistake: a bad config, a missing or malformed file, a value out of range.
USER_ERRORS = (ConfigError, FileNotFoundError, ValueError)


def user_errors(main: Callable[[Sequence[str] | None], int]) -> Callable[[Sequence[str] | None], int]:
    """Wrap a ``main``: a user mistake prints one clear line (naming the key or file) and exits with status 2
    instead of a traceback. ``MOHGE_DEBUG=1`` re-raises, for the full traceback."""

    @functools.wraps(main)
    def wrapped(argv: Sequence[str] | None = None) -> int:
        try:
            return main(argv)
        except USER_ERRORS as err:
            if os.environ.get("MOHGE_DEBUG"):
                raise
            logging.getLogger("mohge").error("%s: %s", type(err).__name__, err)
            return 2

    return wrapped
