"""The graded corpus: generated text whose every character carries a known difficulty level.

It lets us ask which expert groups serve which difficulty, the premise of MoHGE (arXiv 2604.23108): a document
mixes lines of three kinds, each character labelled with its level:

* easy (0): an exact copy of an earlier line of the same document;
* medium (1): a templated grammar line with number agreement across an intervening phrase, and the problem
  part "a+b=" of a sum;
* hard (2): the digits of a sum's answer;

and -1 for separators (newlines, end of text). Documents are a pure function of (seed, index).

A second design, ``sums`` (:func:`generate_sums`), is a difficulty ladder of one kind of token: every line is a
sum "a+b=c", and the level of its answer digits is set by the operands' digit counts (easy 1+1 digits, medium
2+1, hard 2+2 by default; the problem part and separators are -1). One knob per level lets the study calibrate
every level to land between chance and ceiling for the models it trains (docs/method.md, the graded corpus).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from mohge.config import LEVEL_NAMES, SUM_DIGITS
from mohge.core.knobs import ConfigError

LEVEL_SEP, LEVEL_EASY, LEVEL_MEDIUM, LEVEL_HARD = -1, 0, 1, 2

# Lexicon for the grammar lines. The word classes are disjoint, so a line can be parsed back.
NOUNS = {
    "cat": "cats",
    "dog": "dogs",
    "bird": "birds",
    "child": "children",
    "farmer": "farmers",
    "king": "kings",
    "horse": "horses",
    "teacher": "teachers",
    "mouse": "mice",
    "fox": "foxes",
}
# third person singular -> plural
VERBS = {
    "sees": "see",
    "likes": "like",
    "follows": "follow",
    "chases": "chase",
    "helps": "help",
    "watches": "watch",
    "finds": "find",
    "carries": "carry",
}
ADJECTIVES = ("old", "small", "happy", "quiet", "brown", "clever")
DETERMINERS_SG = ("the", "one", "this", "every")
DETERMINERS_PL = ("the", "some", "these", "two", "many")
PREPOSITIONS = ("near", "behind", "with", "beside")


class GradedDoc(NamedTuple):
    """A generated document and its level per character (`len(levels) == len(text)`)."""

    text: str
    levels: list[int]


def _noun_phrase(rng: random.Random, plural: bool) -> str:
    det = rng.choice(DETERMINERS_PL if plural else DETERMINERS_SG)
    noun = rng.choice(list(NOUNS))
    noun = NOUNS[noun] if plural else noun
    adj = rng.choice(ADJECTIVES) + " " if rng.random() < 0.4 else ""
    return f"{det} {adj}{noun}"


def grammar_line(rng: random.Random) -> str:
    """A templated sentence whose verb agrees in number with its subject, across an optional
    prepositional phrase whose noun has a random number (an agreement attractor):
    "the old fox behind some dogs chases a bird." """
    plural = rng.random() < 0.5
    subject = _noun_phrase(rng, plural)
    attractor = f" {rng.choice(PREPOSITIONS)} {_noun_phrase(rng, rng.random() < 0.5)}" if rng.random() < 0.5 else ""
    verb = rng.choice(list(VERBS))
    verb = VERBS[verb] if plural else verb
    return f"{subject}{attractor} {verb} {_noun_phrase(rng, rng.random() < 0.5)}."


def arithmetic_line(rng: random.Random) -> tuple[str, str]:
    """A sum of 2 or 3 numbers of 1 to 4 digits: ("123+45=", "168")."""
    terms = [rng.randrange(10 ** rng.randint(1, 4)) for _ in range(rng.choice((2, 2, 3)))]
    return "+".join(map(str, terms)) + "=", str(sum(terms))


def generate_graded(
    num_docs: int, seed: int, levels: Sequence[str] = LEVEL_NAMES, lines_per_doc: tuple[int, int] = (6, 12)
) -> list[GradedDoc]:
    """Generate `num_docs` documents of newline-separated lines, each line one of:

    easy (0):   an exact copy of an earlier line of the same document (predictable by copying);
    medium (1): a grammar line (`grammar_line`), or the "a+b=" part of a sum;
    hard (2):   the answer digits of a sum (`arithmetic_line`), a function of the digits before "=".
    Newlines between lines are separators (-1). The first line is never a copy.

    Document i depends only on (seed, i), so the corpus is deterministic and its prefix does not
    change with `num_docs`.
    """
    kinds = [k for k in LEVEL_NAMES if k in levels]
    sources = [k for k in kinds if k != "easy"]
    if not sources or any(k not in LEVEL_NAMES for k in levels):
        raise ConfigError(f"levels={tuple(levels)!r}: expected a subset of {LEVEL_NAMES} with medium or hard")
    docs = []
    for i in range(num_docs):
        rng = random.Random(f"graded:{seed}:{i}")
        lines: list[tuple[str, list[int]]] = []
        for j in range(rng.randint(*lines_per_doc)):
            kind = rng.choice(sources if j == 0 else kinds)
            if kind == "easy":
                text, _ = rng.choice(lines)
                lines.append((text, [LEVEL_EASY] * len(text)))
            elif kind == "medium":
                text = grammar_line(rng)
                lines.append((text, [LEVEL_MEDIUM] * len(text)))
            else:
                problem, answer = arithmetic_line(rng)
                lines.append((problem + answer, [LEVEL_MEDIUM] * len(problem) + [LEVEL_HARD] * len(answer)))
        text = "\n".join(t for t, _ in lines)
        char_levels: list[int] = []
        for j, (_, lv) in enumerate(lines):
            char_levels += ([LEVEL_SEP] if j else []) + lv
        assert len(char_levels) == len(text)
        docs.append(GradedDoc(text, char_levels))
    return docs


def sum_line(rng: random.Random, digits: tuple[int, int]) -> tuple[str, str]:
    """A sum of two numbers with exactly the given digit counts (a one-digit operand may be 0): ("47+8=", "55")."""
    a, b = (rng.randrange(10 ** (d - 1) if d > 1 else 0, 10**d) for d in digits)
    return f"{a}+{b}=", str(a + b)


def generate_sums(
    num_docs: int,
    seed: int,
    digits: Sequence[Sequence[int]] = SUM_DIGITS,
    lines_per_doc: tuple[int, int] = (6, 12),
    extra: Sequence[Sequence[int]] = (),
) -> list[GradedDoc]:
    """`num_docs` documents of newline-separated sums. Rungs: one per level, ``digits[level]`` = the operand
    digit counts (a, b), plus the ``extra`` rungs (a, b, level), whose level is 0-2 (more sums of that level) or
    -1 (sums that help the model learn to add but belong to no level). Each line's rung is drawn uniformly; only
    the answer digits carry its level, the "a+b=" part and the newlines are -1. Document i depends only on
    (seed, i), and ``extra=()`` gives the same documents as a ladder without extra rungs."""
    if len(digits) != len(LEVEL_NAMES) or any(len(d) != 2 or min(d) < 1 for d in digits):
        raise ConfigError(f"digits={digits!r}: expected {len(LEVEL_NAMES)} pairs of positive digit counts")
    if any(len(e) != 3 or min(e[:2]) < 1 or not LEVEL_SEP <= e[2] < len(LEVEL_NAMES) for e in extra):
        raise ConfigError(f"extra={extra!r}: expected triples [a, b, level] with a, b >= 1 and level in -1..2")
    rungs = [(int(a), int(b), lv) for lv, (a, b) in enumerate(digits)] + [
        (int(a), int(b), int(lv)) for a, b, lv in extra
    ]
    docs = []
    for i in range(num_docs):
        rng = random.Random(f"sums:{seed}:{i}")
        text, char_levels = [], []
        for j in range(rng.randint(*lines_per_doc)):
            a_digits, b_digits, level = rungs[rng.randrange(len(rungs))]
            problem, answer = sum_line(rng, (a_digits, b_digits))
            if j:
                text.append("\n")
                char_levels.append(LEVEL_SEP)
            text.append(problem + answer)
            char_levels += [LEVEL_SEP] * len(problem) + [level] * len(answer)
        docs.append(GradedDoc("".join(text), char_levels))
    return docs


def token_levels(offsets: Sequence[tuple[int, int]], char_levels: Sequence[int]) -> np.ndarray:
    """Level per token = max level of the characters in its [start, end) span (-1 for an empty span)."""
    lv = np.asarray(char_levels, dtype=np.int8)
    return np.array([lv[s:e].max() if e > s else LEVEL_SEP for s, e in offsets], dtype=np.int8)
