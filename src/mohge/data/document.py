"""A document, the unit every source yields and every split, shard and hold-out is made of."""

from __future__ import annotations

from typing import NamedTuple

CANDIDATE = "candidate"  # pseudo-split of an hf document set aside for the token-count hold-out (§12.2)


class Doc(NamedTuple):
    """One document: a name (play, file, dataset row), its text and (graded corpus) its levels per char."""

    name: str
    text: str
    levels: list[int] | None = None
