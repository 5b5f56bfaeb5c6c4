"""The graded corpus's sum ladder (mohge.graded.generate_sums) and its multiple-choice tasks."""

import json
import re

import pytest

from mohge.data import DataConfig
from mohge.evaluate import graded_docs
from mohge.graded import LEVEL_SEP, generate_sums


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


def test_unscored_rungs_are_in_the_corpus_but_in_no_task():
    digits, extra = ((2, 1), (2, 2), (3, 1)), ((1, 1),)
    docs = generate_sums(60, seed=5, digits=digits, unscored=extra)
    unscored_answers = 0
    for doc in docs:
        start = 0
        for line in doc.text.split("\n"):
            a, b = map(int, line.split("=")[0].split("+"))
            answer = set(doc.levels[start + line.index("=") + 1 : start + len(line)])
            if answer == {LEVEL_SEP}:  # only the one-digit sums are unscored: no level has 1+1 operands
                unscored_answers += 1
                assert a < 10 and b < 10
            start += len(line) + 1
    assert unscored_answers > 50  # about a quarter of ~540 lines
    tasks = graded_docs([{"text": d.text, "levels": d.levels} for d in docs])
    for task in tasks.values():
        for doc in task:
            a, b = map(int, doc["context"].rsplit("\n", 1)[-1].rstrip("=").split("+"))
            assert a >= 10  # every scored sum has a two- or three-digit first operand
    assert generate_sums(10, seed=5, digits=digits, unscored=()) == generate_sums(10, seed=5, digits=digits)


def test_bad_unscored_rungs_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="graded_sum_unscored"):
        DataConfig(source="graded", graded_design="sums", graded_sum_unscored=((1, 0),))
