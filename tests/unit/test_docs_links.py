"""Every path, module, command and config key the docs name resolves.

The docs are README.md, CONTRIBUTING.md, configs/README.md and docs/*.md. What they name is read from inline code
spans (`...`), markdown link targets ([text](target)) and fenced code blocks, by these rules:

* **Paths.** A word holding "/" is a repository path when its first part is an entry of the repository's top level
  or of the doc's own folder (`models/...` in configs/README.md), or is `mohge/` (read as src/mohge/). It must match
  at least one file or folder, tried against the repository root and then the doc's folder. A link target is always
  a path, relative to the doc's folder (as a renderer reads it). Placeholders stand for one path part: `<study>`,
  `<run>`, `{dataset}` and `*` match any part, so the path must have at least one existing instance; `{a,b}` lists
  alternatives that must each exist. A last part without a file extension may be a stem or a prefix
  (`S1_models` matches S1_models.csv). Words with "…" (a range of names) are skipped, and so is a path git ignores
  (`work/`, `results/smoke/`, `hf/`, ...): it is an output of a run, not a file of the repository. A first part
  that is neither (`study/S1_models.csv`, relative to a study root the prose names) is not checked. An output that
  exists only where a run made it (F6, from a GPU measurement) is listed in NOT_YET_MADE with the reason.
* **Modules.** `python -m mohge.X` must be importable (importlib.util.find_spec). A dotted name `mohge.a.b.c` in a
  code span must be a module, or a module followed by a name defined at its top level (a function, class, constant
  or import; one level into a class).
* **Commands.** `make X` needs a target X in the Makefile (the test of make targets skips, saying so, while the
  repository has no Makefile); `mohge X` and `python -m mohge X` need a `mohge` entry in pyproject.toml's
  [project.scripts] and a subcommand X of mohge.cli.
* **Config keys.** A dotted word in a code span whose first part is a top-level section of the workflow config (the
  JSON schema of ``mohge runs schema``, with `datasets.<name>` read as `data`) or of a run's resolved
  config (mohge.config.sections.RunConfig) must be a key there: `model.ffn.ep_size`, `data.num_shards`,
  `train.parallel`. A first part that names a nested section (`ffn`, `router`, `parallel`) must end some key
  (`router.gate_mode`); `datasets.<name>.key` is read as `data.key`. A word ending in a file extension (`train.py`,
  `model.safetensors`) is a file name, not a key.
* **Quoted output.** The cells of a table column whose header says "message" (docs/errors.md) quote what a program
  prints, mistakes included (`model.foo: unknown key`), and are not read.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import tomllib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "configs" / "README.md", *(ROOT / "docs").glob("*.md")]
)
EXTENSIONS = {
    "py", "json", "jsonl", "yaml", "yml", "md", "csv", "tex", "html", "png", "pdf", "smk", "sh", "txt", "npz", "toml",
    "cff", "safetensors", "zip", "tsv", "log", "gz", "whl", "pt", "bin", "cfg", "ini",
}  # fmt: skip
NESTED_SECTIONS = {"ffn", "router", "parallel"}  # sections inside model and train, named by their own name
NOT_YET_MADE = {  # outputs the docs name that exist only where a run made them
    "figures/<study>/F6_kernels.{png,pdf}": "made only from a GPU measurement in results/bench/kernels.csv",
    # the inference rule needs the trained weights, which are not committed: made when a study is run
    "results/<study>/inference/<run>.json": "made by rule inference from a run's trained model",
    "results/<study>/inference.csv": "collected by rule inference_table from the inference records",
}

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
PYTHON_M = re.compile(r"python3?\s+-m\s+([\w.<>]+)")
MAKE = re.compile(r"(?:^|[;&|]\s*)make\s+([A-Za-z][\w.-]*)", re.M)
MOHGE_CMD = re.compile(r"(?:^|[;&|]\s*|python3?\s+-m\s+)mohge\s+([a-z][\w-]*)", re.M)
MODULE = re.compile(r"~?(mohge(?:\.[A-Za-z_]\w*)+)(?:\(\))?")
KEY = re.compile(r"([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+):?")


# ------------------------------------------------------------------------------------------------ reading a doc
def blank_message_columns(text: str) -> str:
    """`text` with the cells of every table column headed "... message ..." blanked (offsets kept)."""
    lines, column = text.split("\n"), None
    for i, row in enumerate(lines):
        if not row.startswith("|"):
            column = None
            continue
        cells = re.split(r"(?<!\\)\|", row)
        if column is None and i + 1 < len(lines) and re.match(r"^\|[\s|:-]+$", lines[i + 1]):
            found = [j for j, cell in enumerate(cells) if "message" in cell]
            column = found[0] if found else -1
        elif column is not None and column > 0 and column < len(cells) and not re.match(r"^\|[\s|:-]+$", row):
            cells[column] = " " * len(cells[column])
            lines[i] = "|".join(cells)
    return "\n".join(lines)


@dataclasses.dataclass
class Named:
    """What one doc names, each with its line."""

    paths: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    links: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    modules: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # python -m targets
    dotted: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # mohge.a.b names in spans
    make: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    commands: list[tuple[str, int]] = dataclasses.field(default_factory=list)  # mohge X
    keys: list[tuple[str, int]] = dataclasses.field(default_factory=list)


def named(text: str) -> Named:
    """Everything `text` names, by the rules of the module docstring."""
    out = Named()

    def line(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    def blank(m: re.Match) -> str:  # keep offsets (and so line numbers) of the rest of the text
        return re.sub(r"[^\n]", " ", m.group(0))

    code: list[tuple[str, int]] = [(m.group(2), m.start(2)) for m in FENCE.finditer(text)]
    prose = blank_message_columns(FENCE.sub(blank, text))
    spans = [(m.group(2), m.start(2)) for m in SPAN.finditer(prose) if "\n\n" not in m.group(2)]
    out.links = [(m.group(1), line(m.start(1))) for m in LINK.finditer(SPAN.sub(blank, prose))]
    for content, start in code + spans:
        is_span = (content, start) in spans
        for m in PYTHON_M.finditer(content):
            out.modules.append((m.group(1), line(start + m.start(1))))
        for m in MAKE.finditer(content):
            out.make.append((m.group(1), line(start + m.start(1))))
        for m in MOHGE_CMD.finditer(content):
            out.commands.append((m.group(1), line(start + m.start(1))))
        for m in re.finditer(r"[^\s=]+", content):
            word, at = m.group(0).strip("'\"").rstrip(".,;:)"), line(start + m.start())
            word = word.rstrip("]") if "[" not in word else word
            if "/" in word and "://" not in word and not word.startswith("-"):
                out.paths.append((word, at))
            elif is_span and (mod := MODULE.fullmatch(word)):
                out.dotted.append((mod.group(1), at))
            elif is_span and (key := KEY.fullmatch(m.group(0))) and key.group(1).rsplit(".", 1)[1] not in EXTENSIONS:
                out.keys.append((key.group(1), at))
    return out


# ------------------------------------------------------------------------------------------------ resolving
def ignored(root: Path, paths: list[str]) -> set[str]:
    """The paths (placeholders already filled) that git ignores in `root`, a path inside an ignored folder included;
    none where git cannot say."""

    def ask(batch: list[str]) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(
                ["git", "-C", str(root), "check-ignore", "--no-index", "--stdin"],
                input="\n".join(batch),
                capture_output=True,
                text=True,
                check=False,
            )
        except FileNotFoundError:
            return None

    queries = {p: [p] if (root / p).exists() else [p, p + "/x"] for p in paths}
    run = ask([q for qs in queries.values() for q in qs])
    if run is None:
        return set()
    if run.returncode > 1:  # one path git refuses (beyond a symbolic link, outside the repository): ask one by one
        answers = [ask([q]) for qs in queries.values() for q in qs]
        said = {line for a in answers if a is not None for line in a.stdout.split("\n")}
    else:
        said = set(run.stdout.split("\n"))
    return {p for p, qs in queries.items() if said & set(qs)}


def instances(base: Path, path: str) -> list[Path]:
    """The existing files or folders `path` names under `base`, placeholders and alternatives expanded."""
    path = path.rstrip("/")
    alternatives = re.search(r"\{([^{}]*,[^{}]*)\}", path)
    if alternatives:  # {a,b}: every alternative must exist
        found = [instances(base, path[: alternatives.start()] + alt + path[alternatives.end() :])
                 for alt in alternatives.group(1).split(",")]  # fmt: skip
        return [p for f in found for p in f] if all(found) else []
    pattern = re.sub(r"<[^<>/]*>|\{[^{}/]*\}", "*", path)
    hits = sorted(base.glob(pattern)) if pattern else []
    last = pattern.rsplit("/", 1)[-1]
    if not hits and "." not in last:  # a stem or a prefix of a file name
        hits = sorted(base.glob(pattern + "*"))
    return hits


def path_problems(root: Path, doc: Path, items: list[tuple[str, int]], links: list[tuple[str, int]]) -> list[str]:
    """Named paths and link targets of `doc` that match nothing."""
    top = {p.name for p in root.iterdir()} | {p.name for p in doc.parent.iterdir()} | {"mohge"}
    candidates: list[tuple[str, int, list[Path], str]] = []  # word, line, bases to try, its path from the root
    for word, at in items:
        if "…" in word or word.startswith("/") or word.split("/", 1)[0] not in top:
            continue
        path = "src/" + word if word.startswith("mohge/") else word
        candidates.append((word, at, [root / path.removesuffix(word), doc.parent], path))
    for target, at in links:
        target = target.split("#", 1)[0]
        if target and not re.match(r"[a-z]+:", target):
            candidates.append((target, at, [doc.parent], os.path.relpath(doc.parent / target, root)))
    fill = {c[3]: re.sub(r"<[^<>/]*>|\{[^{}]*\}|\*", "x", c[3]).rstrip("/") for c in candidates}
    gitignored = ignored(root, sorted(set(fill.values())))
    skip = {rel for rel, f in fill.items() if f in gitignored} | set(NOT_YET_MADE)
    problems = []
    for word, at, bases, rel in candidates:
        if rel in skip:
            continue
        if not any(instances(base, word) for base in bases):
            problems.append(f"{doc.relative_to(root)}:{at}: path `{word}` matches no file")
    return problems


@cache
def top_level_names(origin: str) -> frozenset[str]:
    """Names a module's source defines at its top level (and one level into its classes, as Class.name)."""
    tree = ast.parse(Path(origin).read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(f"{node.name}.{sub.name}")
                    elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                        names.add(f"{node.name}.{sub.target.id}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def find_module(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def dotted_resolves(name: str) -> bool:
    """`name` is a module, or a module followed by a name its source defines (one level into a class)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        spec = find_module(".".join(parts[:i]))
        if spec is None:
            continue
        rest = parts[i:]
        if not rest:
            return True
        if spec.origin is None or not spec.origin.endswith(".py") or len(rest) > 2:
            return False
        return ".".join(rest) in top_level_names(spec.origin)
    return False


def config_keys() -> frozenset[str]:
    """Every key of the workflow config (its JSON schema) and of a run's resolved config, as dotted paths."""
    from mohge_studies.config.runs import workflow_schema

    from mohge.config.data import DataConfig
    from mohge.config.sections import RunConfig

    keys: set[str] = set()

    def walk_schema(node: dict, prefix: str) -> None:
        for key, sub in node.get("properties", {}).items():
            name = f"{prefix}{key}"
            keys.add(name)
            walk_schema(sub, name + ".")
        for alt in node.get("anyOf", []) + node.get("oneOf", []):
            walk_schema(alt, prefix)
        if isinstance(node.get("items"), dict):
            walk_schema(node["items"], prefix)
        if isinstance(node.get("additionalProperties"), dict):
            walk_schema(node["additionalProperties"], "data." if prefix == "datasets." else prefix)

    def walk_dataclass(obj: object, prefix: str) -> None:
        for field in dataclasses.fields(obj):
            if field.name.startswith("_"):
                continue
            keys.add(prefix + field.name)
            value = getattr(obj, field.name)
            if dataclasses.is_dataclass(value):
                walk_dataclass(value, f"{prefix}{field.name}.")

    walk_schema(workflow_schema(), "")
    walk_dataclass(RunConfig(), "")
    walk_dataclass(DataConfig(), "data.")
    return frozenset(keys)


def key_problems(doc: str, items: list[tuple[str, int]], keys: frozenset[str]) -> list[str]:
    sections = {k.split(".", 1)[0] for k in keys}
    problems = []
    for word, at in items:
        word = re.sub(r"^datasets\.[^.]+\.", "data.", word)
        first = word.split(".", 1)[0]
        if first in sections:
            ok = word in keys
        elif first in NESTED_SECTIONS:
            ok = any(k.endswith("." + word) for k in keys)
        else:
            continue
        if not ok:
            problems.append(f"{doc}:{at}: config key `{word}` is no key of the typed config")
    return problems


def module_problems(doc: str, found: Named, root: Path) -> list[str]:
    problems = []
    for name, at in found.modules:
        if name.startswith("mohge") and "<" not in name and find_module(name) is None:
            problems.append(f"{doc}:{at}: `python -m {name}`: no such module")
    for name, at in found.dotted:
        if not dotted_resolves(name):
            problems.append(f"{doc}:{at}: `{name}` is no module, nor a name defined in one")
    from mohge.cli import COMMANDS

    scripts = tomllib.loads((root / "pyproject.toml").read_text()).get("project", {}).get("scripts", {})
    for sub, at in found.commands:
        if "mohge" not in scripts or sub not in COMMANDS:
            problems.append(f"{doc}:{at}: command `mohge {sub}` does not resolve (no mohge script or no subcommand)")
    return problems


def make_targets(makefile: Path) -> set[str]:
    targets = set()
    for text in makefile.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.%/ -]+?)\s*::?(?!=)", text)
        if m and not text.startswith("\t"):
            targets.update(m.group(1).split())
    return targets


def problems_of(root: Path, docs: list[Path]) -> list[str]:
    """Every path, module, command and config key of `docs` that does not resolve (make targets aside)."""
    keys, out = config_keys(), []
    for doc in docs:
        found, rel = named(doc.read_text()), str(doc.relative_to(root))
        out += path_problems(root, doc, found.paths, found.links)
        out += module_problems(rel, found, root)
        out += key_problems(rel, found.keys, keys)
    return out


# ------------------------------------------------------------------------------------------------ the tests
def test_every_path_module_command_and_config_key_the_docs_name_resolves():
    assert {d.name for d in DOCS} >= {"README.md", "CONTRIBUTING.md", "results.md", "study.md"}
    problems = problems_of(ROOT, DOCS)
    assert not problems, "\n".join(problems)


def test_every_make_target_the_docs_name_exists():
    named_targets = [(doc, t, at) for doc in DOCS for t, at in named(doc.read_text()).make]
    if not (ROOT / "Makefile").exists():
        pytest.skip(f"no Makefile in this checkout: {len(named_targets)} make commands named in the docs not checked")
    targets = make_targets(ROOT / "Makefile")
    missing = [f"{d.relative_to(ROOT)}:{at}: `make {t}`" for d, t, at in named_targets if t not in targets]
    assert not missing, "no such Makefile target:\n" + "\n".join(missing)


def test_the_checker_fails_on_a_removed_path_and_on_unknown_names(tmp_path):
    """The checker itself, on a synthetic repository: everything named resolves, then a named file is removed and
    bad module, command and key names are added, and each is reported."""
    files = ("results/claims/study/S1_models.csv", "results/claims/study/S2_tests.md", "workflow/scripts/x.py",
             "configs/models/a.yaml", "configs/paper.yaml", "figures/claims/F8.png", "work/a/runs/b/c")  # fmt: skip
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[project.scripts]\nmohge = "mohge.cli:main"\n')
    (tmp_path / ".gitignore").write_text("/work/\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    doc = tmp_path / "docs" / "page.md"
    doc.parent.mkdir()
    good = (
        "Tables in `results/<study>/study/S1_models` and `results/claims/study/S2_tests.md`, made by\n"
        "`workflow/scripts/x.py`; ![F8](../figures/claims/F8.png); outputs in `work/<study>/runs/<run>/`;\n"
        "`results/<study>/study/S1_models.{csv}`, `configs/models/*.yaml`, keys `model.ffn.ep_size`,\n"
        "`router.gate_mode`, `data.num_shards`, `train.parallel: {dp_shard: -1}`; `mohge.config.matched`,\n"
        "`mohge_studies.config.runs.plan`, `mohge.kernels.reference.row_bucket`; files `train.py`,\n"
        "`model.safetensors`.\n\n"
        "```bash\nmohge sizing configs/paper.yaml\n```\n"
    )
    doc.write_text(good)
    assert problems_of(tmp_path, [doc]) == []

    (tmp_path / "workflow" / "scripts" / "x.py").unlink()
    doc.write_text(
        good
        + "`results/claims/regen/` `mohge/distributed/memory.py` [gone](missing.md) `results/<study>/T9_*.csv`\n"
        + "`mohge.runs.nothing` `train.no_such_key` `ffn.no_such_key`\n\n"
        + "```bash\npython -m mohge.no_such_module\nmohge no-such-command --config x\n```\n"
    )
    problems = problems_of(tmp_path, [doc])
    for expect in ("`workflow/scripts/x.py`", "`results/claims/regen/`", "`mohge/distributed/memory.py`",
                   "`missing.md`", "`results/<study>/T9_*.csv`", "`mohge.runs.nothing`", "`train.no_such_key`",
                   "`ffn.no_such_key`", "python -m mohge.no_such_module", "`mohge no-such-command`"):  # fmt: skip
        assert any(expect in p for p in problems), (expect, problems)
    assert len(problems) == 10, problems


def test_make_targets_are_read_from_a_makefile(tmp_path):
    (tmp_path / "Makefile").write_text(
        ".PHONY: run test\nrun: .venv\n\tsnakemake\ntest lint: .venv\n\tpytest\nX := 1\n"
    )
    assert make_targets(tmp_path / "Makefile") == {".PHONY", "run", "test", "lint"}
    assert [t for t, _ in named("```bash\nmake run   # the DAG\nmake test\n```\nto make the run\n").make] == [
        "run",
        "test",
    ]


def test_the_readme_answers_on_its_first_screen():
    """README at most 220 lines; its first 40 hold the two commands and each claim's verdict (its bold lead)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    first = "\n".join(lines[:40])
    assert len(lines) <= 220, len(lines)
    assert "make run" in first and "make test" in first
    for claim in ("Claim 1", "Claim 2", "Claim 3"):
        lead = next((line for line in lines[:40] if line.startswith(f"- **{claim},")), "")
        assert lead and any(word in lead for word in ("not ", "supported", "refuted")), claim


def test_readme_times_are_the_recorded_fresh_clone_measurements():
    """README's times of its two commands, formatted from the fresh-clone records (`mohge bench front-door`: a fresh
    clone of a commit, each make target timed with the CPU time of every process it waited for): `make run` on the
    slowest host kind (results/bench/front_door_avx2_run.json), `make test` there and on the AMX host
    (results/bench/front_door_{avx2_test,amx}.json), each with the host kind it names; every quoted suite passed."""
    from mohge_studies.bench.front_door import host_kind

    bench = ROOT / "results" / "bench"
    run_rec = json.loads((bench / "front_door_avx2_run.json").read_text())
    amx = json.loads((bench / "front_door_amx.json").read_text())
    test_rec = json.loads((bench / "front_door_avx2_test.json").read_text())
    text = " ".join((ROOT / "README.md").read_text().replace("**", "").split())
    run, fast, slow = run_rec["make_run"], amx["make_test"], test_rec["make_test"]
    assert f"On 2 idle cores of {host_kind(run_rec['machine'])}, the slowest host kind seen, in a fresh clone," in text
    assert host_kind(run_rec["machine"]) == host_kind(test_rec["machine"]) == "an AMD EPYC with AVX2 only"
    assert run["exit_status"] == fast["exit_status"] == slow["exit_status"] == 0
    jobs = run["job_seconds"]
    minutes = f"{run['wall_s'] / 60:.1f} min ({(run['user_s'] + run['system_s']) / 60:.1f} min of CPU time)"
    expect = [
        f"make run` took {minutes}, set-up included",
        f"| {minutes}, set-up included |",
        f"{host_kind(amx['machine'])} `make test` took {fast['wall_s'] / 60:.1f} min, of which the suite "
        f"{fast['pytest_wall_s'] / 60:.1f} min",
        f"on {host_kind(test_rec['machine'])} it took {slow['wall_s'] / 60:.1f} min, of which the suite "
        f"{slow['pytest_wall_s'] / 60:.1f} min",
        f"{jobs['train']['jobs']} trainings take {jobs['train']['wall_s']:.0f} s of job time (two at a time, "
        f"{jobs['train']['wall_s'] / 2 / 60:.1f} min",
        f"{jobs['evaluate']['jobs']} evaluations {jobs['evaluate']['wall_s']:.0f} s and {jobs['inference']['jobs']} "
        f"inference records {jobs['inference']['wall_s']:.0f} s",
    ]
    for t in (fast, slow):
        assert f"in {t['pytest_wall_s']:.2f}s" in t["pytest_summary"] and t["failed"] == 0
    missing = [x for x in expect if x not in text]
    assert not missing, missing


def test_speed_bounds_rows_quote_the_fresh_clone_records_of_the_slowest_host_kind():
    """docs/speed.md's `make run` and `make test` rows: the AVX2 host's times, job seconds and test counts are the
    ones its fresh-clone records hold (`mohge bench front-door`, one record a target), with the host kind they name,
    the ratio of its suite to the AMX host's, and each row's verdict the one its record and bound give."""
    from mohge_studies.bench.front_door import host_kind

    bench = ROOT / "results" / "bench"
    run = json.loads((bench / "front_door_avx2_run.json").read_text())
    test = json.loads((bench / "front_door_avx2_test.json").read_text())
    amx = json.loads((bench / "front_door_amx.json").read_text())["make_test"]
    text = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    assert host_kind(run["machine"]) == host_kind(test["machine"]) == "an AMD EPYC with AVX2 only"
    r, t, jobs = run["make_run"], test["make_test"], run["make_run"]["job_seconds"]
    cpu, passed = (r["user_s"] + r["system_s"]) / 60, f"{t['passed']:,}".replace(",", " ")
    expect = [
        f"on an AMD EPYC with AVX2 only **{r['wall_s'] / 60:.1f} min** wall, {cpu:.1f} min of CPU time, set-up "
        f"included (fresh clone of {run['commit']}; `results/bench/front_door_avx2_run.json`)",
        f"{jobs['train']['jobs']} trainings take {jobs['train']['wall_s']:.0f} s of job time "
        f"({jobs['train']['wall_s'] / jobs['train']['jobs']:.0f} s each,",
        f"{jobs['evaluate']['jobs']} evaluations {jobs['evaluate']['wall_s']:.0f} s "
        f"({jobs['evaluate']['wall_s'] / jobs['evaluate']['jobs']:.0f} s each) and {jobs['inference']['jobs']} "
        f"inference records {jobs['inference']['wall_s']:.0f} s",
        f"the jobs alone are {sum(j['wall_s'] for j in jobs.values()) / 2 / 60:.1f} min on two cores",
        f"on an AMD EPYC with AVX2 only **{t['wall_s'] / 60:.1f} min** wall: the suite "
        f"{t['pytest_wall_s'] / 60:.1f} min ({passed} passed, {t['failed']} failed), set-up "
        f"{t['setup_and_startup_s'] / 60:.1f} min; "
        f"{(t['user_s'] + t['system_s']) / 60:.1f} min of CPU time (fresh clone of {test['commit']}; "
        "`results/bench/front_door_avx2_test.json`)",
        f"the same suite takes {t['pytest_wall_s'] / amx['pytest_wall_s']:.1f}× the AMX host's wall time there",
        f"| {'met' if r['wall_s'] <= 15 * 60 else 'missed'} on the slowest host kind",
        f"| {'met' if t['wall_s'] <= 10 * 60 else 'missed'} on the slowest host kind",
    ]
    failed = f"{t['failed']} failed, " if t["failed"] else ""
    assert t["pytest_summary"].startswith(f"{failed}{t['passed']} passed")
    missing = [x for x in expect if x not in text]
    assert not missing, missing


def test_speed_bounds_row_quotes_the_avx512_hosts_make_test_record():
    """The `make test` row's AMD EPYC with avx512_bf16: its fresh-clone record's times and counts, and the verdict
    its wall time gives against the 10-minute bound."""
    from mohge_studies.bench.front_door import host_kind

    rec = json.loads((ROOT / "results" / "bench" / "front_door_avx512_test.json").read_text())
    t = rec["make_test"]
    assert host_kind(rec["machine"]) == "an AMD EPYC with avx512_bf16" and t["exit_status"] == 0
    assert t["pytest_summary"].startswith(f"{t['passed']} passed") and t["failed"] == 0
    passed = f"{t['passed']:,}".replace(",", " ")
    text = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    assert (
        f"on an AMD EPYC with avx512_bf16 **{t['wall_s'] / 60:.1f} min** wall: the suite {t['pytest_wall_s'] / 60:.1f} "
        f"min ({passed} passed, {t['failed']} failed), set-up {t['setup_and_startup_s'] / 60:.1f} min (fresh clone of "
        f"{rec['commit']}; `results/bench/front_door_avx512_test.json`)"
    ) in text
    verdict = "met" if t["wall_s"] <= 10 * 60 else "missed"
    assert f"met on an Intel Xeon with AMX; {verdict} on the AMD EPYC with avx512_bf16." in text


def test_speed_doc_quotes_the_avx512_hosts_record_of_the_suite_without_its_slow_and_multiprocess_tests():
    """docs/speed.md's sentence on the suite by marker: the selection, times and counts of its fresh-clone record."""
    from mohge_studies.bench.front_door import host_kind

    rec = json.loads((ROOT / "results" / "bench" / "front_door_avx512_test_fast.json").read_text())
    t = rec["make_test"]
    assert host_kind(rec["machine"]) == "an AMD EPYC with avx512_bf16" and t["exit_status"] == 0 and t["failed"] == 0
    assert t["command"] == """make test 'PYTEST_ARGS=-m "not slow and not multiprocess"'"""
    assert t["pytest_summary"].startswith(f"{t['passed']} passed")
    passed = f"{t['passed']:,}".replace(",", " ")
    text = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    assert (
        f"""on an AMD EPYC with avx512_bf16: `make test PYTEST_ARGS='-m "not slow and not multiprocess"'`, the suite """
        f"without its end-to-end workflow runs (`slow`) and its torchrun and gloo worlds (`multiprocess`), took "
        f"**{t['wall_s'] / 60:.1f} min** wall: the suite {t['pytest_wall_s'] / 60:.1f} min ({passed} passed, "
        f"{t['failed']} failed), set-up {t['setup_and_startup_s'] / 60:.1f} min (fresh clone of {rec['commit']}; "
        f"`results/bench/front_door_avx512_test_fast.json`)"
    ) in text
    whole = json.loads((ROOT / "results" / "bench" / "front_door_avx512_test.json").read_text())["make_test"]
    assert f"where the whole suite took {whole['wall_s'] / 60:.1f} min on that host kind" in text


def test_contributing_loop_times_are_the_recorded_measurements():
    """CONTRIBUTING's fast loop and distributed-tests rows: their commands and times are the ones
    results/bench/front_door.json recorded (pytest's own summary line)."""
    rec = json.loads((ROOT / "results" / "bench" / "front_door.json").read_text())
    rows = (ROOT / "CONTRIBUTING.md").read_text().splitlines()
    for key in ("fast_loop", "distributed_tests"):
        run = rec[key]
        assert f"in {run['pytest_wall_s']:.2f}s" in run["pytest_summary"] and run["failed"] == 0, key
        assert run["pytest_summary"].startswith(f"{run['passed']} passed"), key
        (row,) = [r for r in rows if f"`{run['command']}`" in r]
        assert f"{run['pytest_wall_s'] / 60:.1f} min on 2 idle cores, {run['passed']} tests" in row, key
    assert rec["fast_loop"]["pytest_wall_s"] < 180  # the contributor's loop stays under 3 minutes


DEFAULT_LABELS = {
    "mohge": "MoHGE",
    "moe": "MoE (width 256)",
    "hmoe": "HMoE",
    "modse": "MoDSE",
    "dense": "dense (MoHGE's activated FFN width)",
}


def default_study_rows() -> list[str]:
    """docs/results.md's table of the default study: T1's Shakespeare rows (results/default/tables/T1_main.csv)."""
    import pandas as pd

    def mega(x: float) -> str:
        return f"{x / 1e6:.3g} M"

    def ppl(mean: float, ci: float, n: int) -> str:
        return f"{mean:.2f} ± {ci:.2f}" if n > 1 else f"{mean:.2f}"

    t1 = pd.read_csv(ROOT / "results" / "default" / "tables" / "T1_main.csv").query("dataset == 'shakespeare'")
    return [
        f"| {DEFAULT_LABELS[r.family]} | {r.n_seeds} | {mega(r.total_params)} | {mega(r.activated_params)} "
        f"({mega(r.activated_params_uniform)}) | {ppl(r.val_ppl_mean, r.val_ppl_ci95, r.n_seeds)} | "
        f"{ppl(r.test_ppl_mean, r.test_ppl_ci95, r.n_seeds)} | {100 * r['task:mohge_cloze:acc_mean']:.1f} % | "
        f"{r['task:mohge_ppl:bits_per_byte_mean']:.3f} |"
        for _, r in t1.iterrows()
    ]


def test_results_doc_quotes_the_default_studys_committed_tables():
    """H0 'docs/results.md's default study is stale against its committed tables' fails when its table is T1's
    Shakespeare rows, the held-out tokens those of the runs' metrics.json, and its 'decides nothing' has T1 behind it:
    no Shakespeare cell is bold (no row wins a test). Its load paragraph: studies/claims/tests/test_study.py."""
    text = (ROOT / "docs" / "results.md").read_text()
    section = text[text.index("## The default study") : text.index("## The ablations")]
    missing = [row for row in default_study_rows() if row not in section]
    assert not missing, missing
    tokens = {
        json.loads(p.read_text())[split]["tokens"]
        for p in (ROOT / "results" / "default" / "runs").glob("shakespeare-*/metrics.json")
        for split in ("val", "test")
    }
    assert len(tokens) == 1 and f"({tokens.pop():,} tokens of each" in " ".join(section.split())
    t1 = (ROOT / "results" / "default" / "tables" / "T1_main.md").read_text()
    assert not [line for line in t1.splitlines() if line.startswith("| shakespeare") and "**" in line]


def suite_process_lines(rec: dict, top: int = 8) -> list[str]:
    """docs/speed.md's account of where `make test`'s CPU time went, process by process, formatted from a
    `mohge bench front-door --processes` record: its summary sentence and the rows of its two tables."""
    from mohge_studies.bench.front_door import host_kind

    t = rec["make_test"]
    p, passed = t["processes"], f"{t['passed']:,}".replace(",", " ")
    lines = [
        f"on {host_kind(rec['machine'])} (fresh clone of {rec['commit']}; "
        "`results/bench/front_door_avx2_test_processes.json`)",
        f"**{p['logged']}** Python processes exited normally, **{p['logged_cpu_s'] / 60:.1f} min** of their own CPU "
        f"time of the target's {(t['user_s'] + t['system_s']) / 60:.1f} min",
        f"{p['importing_torch']} of them imported torch (the suite {t['pytest_wall_s'] / 60:.1f} min wall, "
        f"{passed} passed, in this run)",
    ]
    for key in ("by_command", "by_test_file"):
        lines += [f"| `{r['name']}` | {r['processes']} | {r['cpu_s'] / 60:.1f} |" for r in p[key][:top]]
    return lines


def test_speed_md_says_where_the_suites_cpu_time_went_as_its_process_record_holds():
    """docs/speed.md's breakdown of `make test`'s CPU time on the slowest host kind: the counts, minutes and the
    largest rows by command and by test file are the ones results/bench/front_door_avx2_test_processes.json holds."""
    rec = json.loads((ROOT / "results" / "bench" / "front_door_avx2_test_processes.json").read_text())
    text = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    assert rec["make_test"]["exit_status"] == 0 and rec["make_test"]["failed"] == 0
    missing = [x for x in suite_process_lines(rec) if x not in text]
    assert not missing, missing
