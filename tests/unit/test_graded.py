"""The graded corpus's sum ladder (mohge.data.graded.generate_sums) and its multiple-choice tasks."""

import json
import re

import pytest

from mohge.data import DataConfig
from mohge.data.graded import LEVEL_SEP, generate_sums
from mohge.evaluate.suite import graded_docs


def test_sum_ladder_levels_mark_only_the_answer_digits():
    digits = ((1, 1), (2, 1), (3, 2))
    for doc in generate_sums(50, seed=3, digits=digits):
        start = 0
        for line in doc.text.split("\n"):
            a, b, c = map(int, re.fullmatch(r"(\d+)\+(\d+)=(\d+)", line).groups())
            assert a + b == c
            cut = line.index("=") + 1
            levels = doc.levels[start : start + len(line)]
            assert set(levels[:cut]) == {LEVEL_SEP}
            (level,) = set(levels[cut:])
            assert (len(str(a)), len(str(b))) == digits[level] or digits[level][0] == 1 or digits[level][1] == 1
            assert len(str(a)) <= digits[level][0] and len(str(b)) <= digits[level][1]
            start += len(line) + 1


def test_sum_ladder_is_deterministic_and_prefix_stable():
    assert generate_sums(20, 1) == generate_sums(20, 1)[:20]
    assert generate_sums(5, 1) == generate_sums(20, 1)[:5]
    assert generate_sums(5, 1) != generate_sums(5, 2)


def test_sum_ladder_tasks_follow_the_answer_level():
    records = [{"text": d.text, "levels": d.levels} for d in generate_sums(40, 0)]
    docs = graded_docs(records)
    for task in ("mohge_graded_easy", "mohge_graded_medium", "mohge_graded_hard"):
        assert docs[task], task
        for doc in docs[task]:
            problem = doc["context"].rsplit("\n", 1)[-1]
            a, b = map(int, problem.rstrip("=").split("+"))
            assert doc["choices"][doc["gold"]] == str(a + b)
            assert len(set(doc["choices"])) == 4
    assert json.dumps(docs) == json.dumps(graded_docs(records))


@pytest.mark.parametrize("bad", [[[1, 1], [2, 1]], [[1, 0], [2, 1], [2, 2]], [[1, 1], [2, 1], [2, 9]]])
def test_bad_sum_digits_are_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match="graded_sum_digits"):
        DataConfig(source="graded", graded_design="sums", graded_sum_digits=tuple(map(tuple, bad)))


def test_unknown_design_is_refused():
    with pytest.raises(ValueError, match="graded_design"):
        DataConfig(source="graded", graded_design="ladder")


def test_extra_rungs_add_sums_to_a_level_or_to_none():
    digits, extra = ((2, 1), (2, 2), (3, 1)), ((1, 1, 0), (1, 1, -1))
    docs = generate_sums(60, seed=5, digits=digits, extra=extra)
    seen = {0: set(), -1: set()}
    for doc in docs:
        start = 0
        for line in doc.text.split("\n"):
            a, b = map(int, line.split("=")[0].split("+"))
            (level,) = set(doc.levels[start + line.index("=") + 1 : start + len(line)])
            if a < 10:  # a one-digit first operand: one of the two extra 1+1 rungs
                assert b < 10 and level in (0, -1)
                seen[level].add(line)
            else:
                assert level in (0, 1, 2)
            start += len(line) + 1
    assert len(seen[0]) > 20 and len(seen[-1]) > 20  # both extra rungs are drawn (about a fifth of ~540 lines each)
    tasks = graded_docs([{"text": d.text, "levels": d.levels} for d in docs])
    easy = [doc["context"].rsplit("\n", 1)[-1] for doc in tasks["mohge_graded_easy"]]
    assert any(int(p.split("+")[0]) < 10 for p in easy) and any(int(p.split("+")[0]) >= 10 for p in easy)
    for task in ("mohge_graded_medium", "mohge_graded_hard"):
        assert all(int(doc["context"].rsplit("\n", 1)[-1].split("+")[0]) >= 10 for doc in tasks[task])
    assert generate_sums(10, seed=5, digits=digits, extra=()) == generate_sums(10, seed=5, digits=digits)


@pytest.mark.parametrize("bad", [((1, 0, 0),), ((1, 1),), ((1, 1, 3),), ((1, 1, -2),)])
def test_bad_extra_rungs_are_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match="graded_sum_extra"):
        DataConfig(source="graded", graded_design="sums", graded_sum_extra=bad)
