"""A declared analysis as the generic workflow reads it: the files its rules make for a study and what they take
from the study's config. Each package that :data:`mohge_studies.DESIGNS` names defines one as ``DESIGN``; the
Snakefile includes the ``rules.smk`` beside it, and :class:`mohge_studies.workflow.WorkflowPlan` asks it for the
targets of ``all`` and ``figures`` and for its rules' settings."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mohge_studies import DESIGNS


def _no_settings(config: dict) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Design:
    """``name``: the value of ``analysis.design`` that selects it; ``outputs(study)``: every file its rules make
    for the study ``study`` (results/<study>/..., figures/<study>/...); ``settings(config)``: what its rules take
    from the study's merged config (JSON-serialisable)."""

    name: str
    outputs: Callable[[str], list[str]]
    settings: Callable[[dict], dict[str, Any]] = field(default=_no_settings)


def design(name: str) -> Design:
    """The ``DESIGN`` of the declared analysis ``name`` (a key of :data:`mohge_studies.DESIGNS`)."""
    return importlib.import_module(f"mohge_studies.{DESIGNS[name]}").DESIGN


def rules_files() -> list[str]:
    """Each declared analysis's rules, relative to the checkout (the Snakefile includes them)."""
    return [f"studies/{folder}/rules.smk" for folder in DESIGNS.values()]
