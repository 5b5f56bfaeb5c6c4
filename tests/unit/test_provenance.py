"""Committed results were made by today's code: every run's summary.json and metrics.json records (mohge.provenance)
the commit, whether the tree was clean, a normalized hash of the sources that decide it and a hash of its config;
the hash moves with the code that computes, not with documentation or imports."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import mohge_studies
import pytest
import yaml
from conftest import ROOT

from mohge.config import provenance as prov

STUDIES = sorted(p.parent.name for p in (ROOT / "results").glob("*/runs"))


def study_config(study: str) -> str:
    """The config file that makes ``study`` (the one whose ``study:`` names it; configs/config.yaml for default)."""
    for path in [*sorted((ROOT / "configs").glob("*.yaml")), *(ROOT / p for p in mohge_studies.config_files())]:
        head = yaml.safe_load(path.read_text()) or {}
        if isinstance(head, dict) and head.get("study") == study:
            return str(path.relative_to(ROOT))
    raise AssertionError(f"no config in configs/ or studies/ names study {study!r}")


def what_to_run(study: str, found: dict[str, str]) -> str:
    """The two ways out for a stale study: regenerate it, or restamp it after a change shown to alter no result."""
    extra = "" if study == "default" else f" --configfile {study_config(study)}"
    old = sorted({json.loads(Path(p).read_text())["code"]["sources_sha256"] for p in found if "other code" in found[p]})
    lines = [
        f"{len(found)} result files of results/{study} were not made by today's code, e.g.",
        *(f"  {p}: {why}" for p, why in list(found.items())[:3]),
        "regenerate the study (hours):",
        f"  MOHGE_RERUN_COMMITTED=1 snakemake --cores all{extra} --forcerun train",
        "or, for a change shown to alter no result (tests/golden exact), restamp it:",
        *(f"  mohge provenance restamp --from {h} --reason 'WHAT SHOWS IT' results/{study}" for h in old),
    ]
    return "\n".join(lines)


@pytest.mark.slow  # a release gate: any change of what training or evaluation computes fails it until regenerated
@pytest.mark.parametrize("study", STUDIES)
def test_committed_results_were_made_by_todays_code(study):
    """Every results/<study>/runs/*/{summary,metrics}.json holds today's sources_sha256 and its run config's hash.
    A change to what the training or evaluation computes fails this until the study is regenerated (or, for a
    change shown to alter no result, such as a move of code, restamped); the failure prints both commands."""
    root = ROOT / "results" / study
    assert any(root.glob("runs/*/summary.json")), root
    found = prov.stale([root])
    assert not found, what_to_run(study, found)


def test_the_default_study_is_committed_and_checked():
    assert "default" in STUDIES


def test_a_stale_study_is_told_how_to_regenerate_or_restamp(tmp_path):
    """The gate's message names the study's own config and the old hash to restamp from."""
    run = tmp_path / "summary.json"
    run.write_text(json.dumps({"code": {"sources_sha256": "ab" * 32}}))
    text = what_to_run("claims", {str(run): "made by other code: sources abab, today cdcd"})
    assert "--configfile studies/claims/config.yaml --forcerun train" in text
    assert f"restamp --from {'ab' * 32} --reason" in text and "results/claims" in text
    assert "--configfile" not in what_to_run("default", {})


def _digest(source: str) -> str:
    return prov.digest_units(prov.python_units(source))


MODULE = '''"""A module."""
import math
from .x import y  # a comment
import logging

log = logging.getLogger("mohge.a")
__all__ = ["f"]


def f(a, b=2):
    """Docstring."""
    from .z import w
    return math.sqrt(a) * b  # why


class C:
    """Doc."""

    K = 3
'''


def test_the_digest_ignores_documentation_imports_formatting_and_moves():
    base = _digest(MODULE)
    doc_only = MODULE.replace('"""Docstring."""', '"""Another docstring, longer."""').replace("# why", "# because")
    imports_moved = MODULE.replace("from .x import y", "from ..core.x import y").replace("import math\n", "")
    reformatted = MODULE.replace("return math.sqrt(a) * b", "return (\n        math.sqrt(a)\n        * b\n    )")
    logger_renamed = MODULE.replace('"mohge.a"', '"mohge.evaluate.a"')
    for same in (doc_only, imports_moved, reformatted, logger_renamed):
        assert _digest(same) == base
    # a function moved to another module: the same multiset of top-level statements
    a, b = MODULE.split("\n\nclass C:")
    assert prov.digest_units(prov.python_units(a) + prov.python_units("class C:" + b)) == base


@pytest.mark.parametrize(
    "change",
    [("b=2", "b=3"), ("* b", "+ b"), ("K = 3", "K = 4"), ("math.sqrt(a)", "math.sqrt(abs(a))")],
)
def test_the_digest_moves_with_any_change_of_what_is_computed(change):
    assert _digest(MODULE.replace(*change)) != _digest(MODULE)


def test_the_scope_is_the_import_closure_of_training_and_evaluation():
    files = {p.relative_to(ROOT).as_posix() for p in prov.deciding_files()}
    package = Path(prov.PACKAGE).relative_to(ROOT).as_posix()
    for module in ("routing", "losses", "transformer", "lm_eval_adapter", "tokenizer"):  # by import, lazy included
        assert any(f.startswith(package) and f.endswith(f"/{module}.py") for f in files), module
    assert {"src/mohge/tasks/mohge_cloze.yaml", "src/mohge/tasks/mohge_task_data.py"} <= files
    assert not any("kernels/" in f or f.endswith("provenance.py") or f.endswith(".md") for f in files)
    assert prov.sources_sha256() == prov.sources_sha256() and len(prov.sources_sha256()) == 64


def _uncached(source: str | None) -> tuple[tuple[Path, ...], str]:
    """The scope and the digest computed afresh, without the cache."""
    files = prov._deciding_files()
    other = {prov._scoped_file(n) for s, names in prov.SOURCE_SCOPED.items() if s != source for n in names}
    kept = files if source is None else tuple(f for f in files if f not in other)
    return files, prov.digest_units(u for path in kept for u in prov._units(path))


def _forget() -> None:
    for fn in (prov.package_key, prov.deciding_files, prov.sources_sha256):
        fn.cache_clear()


@pytest.fixture
def forget():
    """The in-process caches cleared after the test, passed or failed: no later test reads a key or digest computed
    for another cache folder or a copy of the package."""
    yield
    _forget()


def test_a_cold_or_warm_cache_gives_the_scope_and_digest_computed_afresh(tmp_path, monkeypatch, forget):
    """The cache across processes (one record per package content under $XDG_CACHE_HOME/mohge/provenance) returns
    what a fresh computation gives, for the whole scope and for each source's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for attempt in ("cold", "warm"):
        _forget()
        for source in (None, "graded", "facts"):
            files, digest = _uncached(source)
            assert prov.deciding_files() == files and prov.sources_sha256(source) == digest, (attempt, source)
    (record,) = (tmp_path / "mohge" / "provenance").iterdir()
    assert record.name == f"{prov.package_key()}.json"
    assert set(json.loads(record.read_text())) == {
        "deciding",
        *(f"sources_sha256 {s}" for s in (None, "graded", "facts")),
    }


def test_any_edit_added_or_removed_file_of_the_package_is_another_cache_key(tmp_path, monkeypatch, forget):
    """The key hashes every .py and .yaml file under the package by path and bytes: a cached scope or digest is
    never read for other code, however small the change (a comment, an empty module, a deleted task file)."""
    copy = tmp_path / "mohge"
    shutil.copytree(prov.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(prov, "PACKAGE", copy)
    keys = set()
    for change in (
        lambda: None,
        lambda: (copy / "model" / "routing.py").write_text((copy / "model" / "routing.py").read_text() + "# a\n"),
        lambda: (copy / "model" / "new_module.py").write_text(""),
        lambda: (copy / "tasks" / "mohge_cloze.yaml").unlink(),
        lambda: (copy / "README.txt").write_text("not code"),  # neither .py nor .yaml: the same key
    ):
        change()
        prov.package_key.cache_clear()
        keys.add(prov.package_key())
    assert len(keys) == 4


def test_an_unreadable_or_unwritable_cache_is_skipped(tmp_path, monkeypatch, forget):
    """A record that is not JSON is read as none, and a cache folder that cannot be written leaves the digest to be
    computed: the digest is never wrong for want of a cache."""
    _, digest = _uncached(None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _forget()
    (tmp_path / "mohge" / "provenance").mkdir(parents=True)
    (tmp_path / "mohge" / "provenance" / f"{prov.package_key()}.json").write_text("{not json")
    assert prov.sources_sha256() == digest
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # a file where the folder would be: every write fails
    _forget()
    assert prov.sources_sha256() == digest and prov.deciding_files() == prov._deciding_files()


def test_a_result_records_commit_clean_and_hashes():
    code = prov.code_version({"model": {"d_model": 8}})
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert code["commit"] == head and isinstance(code["clean"], bool)
    assert code["sources_sha256"] == prov.sources_sha256()
    assert code["config_sha256"] == prov.config_sha256({"model": {"d_model": 8}})


def _default_today() -> str:
    """Today's digest of a run of the default study's source (the fake runs' config)."""
    config = json.loads(next((ROOT / "results" / "default" / "runs").glob("*/config.json")).read_text())
    return prov.sources_sha256(prov.source_of(config))


def _fake_run(root: Path, code: dict | None) -> Path:
    run = root / "runs" / "r"
    run.mkdir(parents=True)
    config = json.loads(next((ROOT / "results" / "default" / "runs").glob("*/config.json")).read_text())
    (run / "config.json").write_text(json.dumps(config))
    want = prov.expected_configs(run)
    for name in ("summary.json", "metrics.json"):
        body = {"x": 1} if code is None else {"x": 1, "code": {**code, "config_sha256": want[name][0]}}
        (run / name).write_text(json.dumps(body))
    return run


def test_a_config_key_added_since_at_its_default_is_not_another_config(tmp_path):
    """A run recorded before a config key existed: its config.json lacks the key, its config_sha256 is the file's as
    written; today's read fills the default. Neither a restamp nor the check calls that another config; a changed
    value does."""
    run = _fake_run(tmp_path / "r", {"sources_sha256": _default_today()})
    config = json.loads((run / "config.json").read_text())
    config["model"]["router"].pop("flat_gate", None)  # added after the run, at its default ("logits")
    (run / "config.json").write_text(json.dumps(config))
    for name in ("summary.json", "metrics.json"):
        body = json.loads((run / name).read_text())
        part = config if name == "metrics.json" else {k: v for k, v in config.items() if k != "eval"}
        body["code"]["config_sha256"] = prov.config_sha256(part)
        (run / name).write_text(json.dumps(body))
    assert prov.stale([tmp_path / "r"]) == {}
    config["model"]["router"]["topk"] += 1
    (run / "config.json").write_text(json.dumps(config))
    assert all("another config" in why for why in prov.stale([tmp_path / "r"]).values())


def test_stale_names_results_without_a_record_or_of_other_code_or_config(tmp_path):
    _fake_run(tmp_path / "none", None)
    assert all("no code record" in why for why in prov.stale([tmp_path / "none"]).values())
    run = _fake_run(tmp_path / "old", {"sources_sha256": "0" * 64})
    assert len(prov.stale([tmp_path / "old"])) == 2
    assert prov.main(["check", str(tmp_path / "old")]) == 1
    assert (
        prov.main(["restamp", "--from", "1" * 64, "--reason", "r", str(tmp_path / "old")]) == 0
    )  # as --help orders it
    assert prov.restamp([tmp_path / "old"], "0" * 64, "a move of code; tests/golden exact") == [
        run / "summary.json",
        run / "metrics.json",
    ]
    assert prov.stale([tmp_path / "old"]) == {} and prov.main(["check", str(tmp_path / "old")]) == 0
    assert json.loads((run / "summary.json").read_text())["code"]["restamped_from"] == "0" * 64
    # a second restamp keeps the first one's reason: the history, oldest first
    today = _default_today()
    code = json.loads((run / "summary.json").read_text())["code"]
    code.update(sources_sha256="2" * 64)
    (run / "summary.json").write_text(json.dumps({"code": code}))
    assert prov.restamp([tmp_path / "old"], "2" * 64, "a second move") == [run / "summary.json"]
    assert json.loads((run / "summary.json").read_text())["code"]["restamps"] == [
        {"from": "0" * 64, "to": today, "reason": "a move of code; tests/golden exact"},
        {"from": "2" * 64, "to": today, "reason": "a second move"},
    ]
    with pytest.raises(ValueError, match="reason"):
        prov.restamp([tmp_path / "old"], "0" * 64, " ")
    config = json.loads((run / "config.json").read_text())
    config["train"]["lr"] *= 1.01
    (run / "config.json").write_text(json.dumps(config))
    assert all("another config" in why for why in prov.stale([tmp_path / "old"]).values())


def test_the_command_line_gives_the_digest_results_record():
    """`mohge provenance` prints the digest that importing the package computes."""
    import sys

    done = subprocess.run([sys.executable, "-m", "mohge", "provenance"], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["sources_sha256"] == prov.sources_sha256()


def test_a_knob_newer_than_a_result_counts_only_at_its_default():
    from mohge.config.provenance import without_later_knobs

    config = {"loss": {"expert_aux_coeff": 0.005, "balance_stats": "micro_batch"},
              "model": {"router": {"topk": 4, "expert_bias_rate": 1e-3}}}  # fmt: skip
    out = without_later_knobs(config)
    assert "balance_stats" not in out["loss"]  # at its default: the run before the knob ran as this one
    assert out["model"]["router"]["expert_bias_rate"] == 1e-3  # not at its default: another config
    assert config["loss"]["balance_stats"] == "micro_batch"  # the input is left as it was


def _leaves(config: dict, prefix: tuple = ()) -> set[tuple]:
    """The key paths of ``config``'s values (its sections walked)."""
    out = set()
    for k, v in config.items():
        out |= _leaves(v, (*prefix, k)) if isinstance(v, dict) else {(*prefix, k)}
    return out


def _committed_runs() -> list[Path]:
    return sorted(p.parent for p in (ROOT / "results").glob("*/runs/*/config.json"))


def test_a_committed_run_config_read_today_has_its_recorded_config_hash():
    """Null hypothesis: the config hash today's code computes from a committed run's config.json (read as a
    RunConfig: the renamed values in their new names) differs from the one its summary.json and metrics.json
    recorded. Each hash is today's read, with or without the later knobs at their default (those newer than the
    result); only a config.json that lacks a key today's read fills in may match as the file was written."""
    from mohge.config import RunConfig
    from mohge.core.knobs import to_dict

    renamed = 0
    for run in _committed_runs():
        raw = json.loads((run / "config.json").read_text())
        today = to_dict(RunConfig.from_dict(raw))
        lacks_a_key = bool(_leaves(today) - _leaves(raw))
        renamed += raw["model"]["router"]["gate_mode"] != today["model"]["router"]["gate_mode"]
        for name in ("summary.json", "metrics.json"):
            if not (run / name).is_file():
                continue
            recorded = json.loads((run / name).read_text())["code"]["config_sha256"]
            ours = [c if name == "metrics.json" else {k: v for k, v in c.items() if k != "eval"}
                    for c in (today, *(prov.without_later_knobs(today, i) for i in range(len(prov.LATER_KNOBS))),
                              *([raw] if lacks_a_key else []))]  # fmt: skip
            assert recorded in {prov.config_sha256(c) for c in ours}, run / name
    assert renamed > 100  # the committed configs spell gate_mode as the alias code_exact


def _spelled(config: dict, gate_mode: str, expert_aux_mode: str) -> dict:
    out = json.loads(json.dumps(config))
    out["model"]["router"]["gate_mode"], out["loss"]["expert_aux_mode"] = gate_mode, expert_aux_mode
    return out


def test_the_config_hash_does_not_depend_on_which_name_a_value_is_given_by():
    """Null hypothesis: a config that names a value by its alias hashes differently from one that names it by its
    name (as written, and as today's code reads it); a different value does hash differently."""
    from mohge.config import RunConfig
    from mohge.core.knobs import to_dict

    raw = json.loads(next((ROOT / "results" / "default" / "runs").glob("*/config.json")).read_text())
    named = _spelled(raw, "softmax_topk_probs", "all_experts_sparse")
    aliased = _spelled(raw, "code_exact", "code")
    assert prov.config_sha256(named) == prov.config_sha256(aliased)
    read = to_dict(RunConfig.from_dict(aliased))
    assert read == to_dict(RunConfig.from_dict(named)) and read["model"]["router"]["gate_mode"] == "softmax_topk_probs"
    assert prov.config_sha256(read) == prov.config_sha256(_spelled(read, "code_exact", "code"))
    assert prov.hashed_form(read)["loss"]["expert_aux_mode"] == "code"  # the spelling results were recorded with
    assert read["loss"]["expert_aux_mode"] == "all_experts_sparse"  # the input is left as it was
    assert prov.config_sha256(_spelled(named, "product_renorm", "all_experts_sparse")) != prov.config_sha256(named)
    assert prov.config_sha256(_spelled(named, "softmax_topk_probs", "per_group")) != prov.config_sha256(named)


def test_every_hashed_spelling_is_an_alias_of_its_value():
    """The spellings the config hash uses are the aliases the config accepts for the same values (mohge.core.vocab)."""
    from mohge.core.vocab import EXPERT_AUX_MODE_ALIASES, GATE_MODE_ALIASES

    aliases = {
        ("model", "router", "gate_mode"): GATE_MODE_ALIASES,
        ("loss", "expert_aux_mode"): EXPERT_AUX_MODE_ALIASES,
    }
    assert {path: {v: k for k, v in a.items()} for path, a in aliases.items()} == prov.HASHED_AS


def test_check_and_restamp_end_in_a_one_line_summary(tmp_path, capsys):
    """Silence is no answer: a check that finds nothing says how many results it checked, and of which code."""
    today = _default_today()
    _fake_run(tmp_path / "ok", {"sources_sha256": today})
    assert prov.main(["check", str(tmp_path / "ok")]) == 0
    facts = prov.sources_sha256("facts")
    assert capsys.readouterr().out.splitlines() == [
        f"2 result files in 1 study roots, all made by today's code (sources facts {facts[:12]}, others {today[:12]})"
    ]
    _fake_run(tmp_path / "old", {"sources_sha256": "0" * 64})
    assert prov.main(["check", str(tmp_path / "ok"), str(tmp_path / "old")]) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("2 of 4 result files in 2 study roots are stale")
    assert prov.main(["restamp", "--from", "0" * 64, "--reason", "r", str(tmp_path / "old")]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == f"2 result files restamped from sources {'0' * 12} to today's digest of each run's source"
    assert json.loads((tmp_path / "old" / "runs" / "r" / "summary.json").read_text())["code"]["sources_sha256"] == today


BLOCKED_RUN = """
import importlib.abc, json, sys
from pathlib import Path


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in BLOCKED:
            raise ImportError(f"blocked: {name}")


BLOCKED = set(json.loads(sys.argv[1]))
sys.meta_path.insert(0, Block())
sys.path.insert(0, sys.argv[3])
from conftest import tiny_run, train_tiny
from mohge.evaluate import suite

model, data = train_tiny(Path(sys.argv[2]), tiny_run())
metrics = suite.evaluate(model, data, limit=2, device="cpu", max_loss_batches=1)
print(json.dumps({"code": metrics["code"], "loaded": sorted(m for m in sys.modules if m in BLOCKED)}))
"""


def test_a_run_of_another_source_never_imports_the_code_scoped_to_facts(tmp_path):
    """The facts source's own code is out of every other source's scope: a graded run prepared, trained and
    evaluated with those modules blocked from import completes, and records the digest of its own scope, which
    leaves them out and differs from the facts runs' (a change to them stales no other source's results)."""
    modules = [n for n in prov.SOURCE_SCOPED["facts"] if "/" not in n]
    out = subprocess.run(
        [sys.executable, "-c", BLOCKED_RUN, json.dumps(modules), str(tmp_path), str(ROOT / "tests")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    record = json.loads(out.stdout.strip().splitlines()[-1])
    assert record["loaded"] == []
    assert record["code"]["sources_sha256"] == prov.sources_sha256("graded") != prov.sources_sha256("facts")
    facts_files = {prov._scoped_file(n) for n in prov.SOURCE_SCOPED["facts"]}
    assert facts_files <= set(prov.scope("facts")) and not facts_files & set(prov.scope("graded"))
    assert set(prov.scope("graded")) | facts_files == set(prov.deciding_files())
