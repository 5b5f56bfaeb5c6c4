"""Which code made a result: the git commit, whether the deciding sources were clean, a hash of those sources and
one of the run config, recorded as ``"code"`` in every run's ``summary.json`` (training) and ``metrics.json``
(evaluation).

    mohge provenance                 # today's digest and its scope (the files it reads)
    mohge provenance check [ROOT...] # the committed run results not made by today's code (exit 1)
    mohge provenance restamp --from OLD --reason TEXT [ROOT...]   # after a change that alters no result

``sources_sha256``, the deciding sources: every module of the package that the entry points of data preparation,
training, evaluation and tracing (``mohge.data``, ``mohge.train``, ``mohge.evaluate``, ``mohge.evaluate.traces``)
import, transitively, imports inside functions included, and the local task definitions (``mohge/tasks``, package data:
the YAMLs and ``mohge_task_data.py``), less the code :data:`SOURCE_SCOPED` to another data source than the run's (the
facts source's own modules and task, for every other source's runs): each run's scope is the code that made it, so a
change to one source's own code stales no other source's results. ``mohge.kernels`` is outside it (CPU results run the
pure-torch reference, which the kernels are tested against), and so is this module, which only records. The hash is of a
normalized form, so that only what can change a number changes it:

* each file's AST, which drops comments and formatting, without docstrings (any bare string statement),
  import statements (wherever they are), ``__all__``/``__version__`` and ``logging.getLogger`` assignments;
* the top-level statements of all files together, as a sorted multiset of their AST dumps: moving a function to
  another module, or a module to another package, leaves the digest as it was (imports are what such a move
  changes), while any change of a function body, a constant or a default moves it;
* the task YAMLs as parsed data (key order, comments and quoting do not count).

Documentation (README, docs/, configs/README.md) is outside it. ``config_sha256`` is the sha256 of the run
config as the code reads it (``to_dict(RunConfig)``, keys sorted, a value with two names in the spelling of
:data:`HASHED_AS`): without its ``eval`` section for training, whole for evaluation. ``commit`` is ``git rev-parse
HEAD`` and ``clean`` whether ``git status`` shows none of the hashed files changed (both null outside a git
checkout). tests/unit/test_provenance.py fails when a committed result's
``sources_sha256`` or ``config_sha256`` differs from today's.
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from mohge.core.atomic import write_json_atomic
from mohge.core.cli import user_errors
from mohge.core.knobs import ConfigError
from mohge.core.resources import TASKS

PACKAGE = Path(__file__).resolve().parent
while (PACKAGE.parent / "__init__.py").is_file():  # the top of the mohge package, wherever this module sits in it
    PACKAGE = PACKAGE.parent
ENTRY_POINTS = ("mohge.data", "mohge.train", "mohge.evaluate", "mohge.evaluate.traces")
# not in the scope: the kernels (module docstring) and this bookkeeping (named by its path: under python -m it
# runs as __main__)
OUTSIDE = ("mohge.kernels", ".".join(Path(__file__).resolve().relative_to(PACKAGE.parent).with_suffix("").parts))
DROPPED_NAMES = {"__all__", "__version__"}


# ----------------------------------------------------------------------------------------------------
# The deciding modules: the import closure of the entry points
# ----------------------------------------------------------------------------------------------------


def _module_file(name: str) -> Path | None:
    """The source file of package module ``name`` (a module or a package's ``__init__``), None if not ours."""
    parts = name.split(".")
    if parts[0] != "mohge" or any(name == o or name.startswith(o + ".") for o in OUTSIDE):
        return None
    base = PACKAGE.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _name_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> set[str]:
    """Package modules that ``path`` imports anywhere in its code (relative imports resolved)."""
    here = _name_of(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)  # `from pkg import module`
    return {m for m in out if m.startswith("mohge")}


def _with_parents(name: str) -> list[str]:
    """``a.b.c`` and the packages whose ``__init__`` importing it runs: ``a``, ``a.b``."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


# ----------------------------------------------------------------------------------------------------
# A cache across processes: every job of a study computes the same scope and digest from the same files (about half a
# second of AST work in each process). It is keyed by the content of the whole package, so it cannot go stale.
# ----------------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """Where the scope and digests of each package content are kept: ``$XDG_CACHE_HOME/mohge/provenance`` (default
    ``~/.cache``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mohge" / "provenance"


@functools.cache
def package_key() -> str:
    """sha256 of every ``.py`` and ``.yaml`` file under the package (relative path and bytes) and of the Python and
    PyYAML versions (whose ``ast.dump`` and parser spell the units): what the scope and the digests are a function of.
    Any edit, added or removed file, or another interpreter is another key."""
    h = hashlib.sha256(f"python {sys.version_info[:3]} yaml {yaml.__version__}\0".encode())
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix in (".py", ".yaml") and "__pycache__" not in path.parts and path.is_file():
            h.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _cached() -> dict[str, Any]:
    """This package content's cache record (empty if there is none, or it cannot be read)."""
    try:
        rec = json.loads((cache_dir() / f"{package_key()}.json").read_text())
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def _cache(key: str, value: Any) -> None:
    """Add ``key`` to this package content's record, written whole (a record that cannot be written is skipped)."""
    try:
        write_json_atomic(cache_dir() / f"{package_key()}.json", {**_cached(), key: value})
    except OSError:
        pass


@functools.cache
def deciding_files() -> tuple[Path, ...]:
    """The source files in the scope of ``sources_sha256`` (module docstring), sorted."""
    known = _cached().get("deciding")
    if isinstance(known, list):
        return tuple(PACKAGE.parent / p for p in known)
    files = _deciding_files()
    _cache("deciding", [str(f.relative_to(PACKAGE.parent)) for f in files])
    return files


def _deciding_files() -> tuple[Path, ...]:
    todo = [m for e in ENTRY_POINTS for m in (*_with_parents(e), f"{e}.__main__")]
    seen: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        if name in seen or (path := _module_file(name)) is None:
            continue
        seen[name] = path
        todo.extend(p for m in _imported(path) for p in _with_parents(m))
    files = set(seen.values()) | set(TASKS.glob("*.py")) | set(TASKS.glob("*.yaml"))
    return tuple(sorted(files))


# ----------------------------------------------------------------------------------------------------
# The normalized form
# ----------------------------------------------------------------------------------------------------


def _dropped(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
        return True  # a docstring, or any bare string
    if isinstance(stmt, ast.Assign | ast.AnnAssign):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if all(isinstance(t, ast.Name) and t.id in DROPPED_NAMES for t in targets):
            return True
        call = stmt.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "getLogger":
            return True
    return False


class _Normalize(ast.NodeTransformer):
    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and all(isinstance(s, ast.stmt) for s in stmts):
                kept = [s for s in stmts if not _dropped(s)]
                setattr(node, field, kept or [ast.Pass()])
        return super().generic_visit(node)


def python_units(source: str, where: str = "<source>") -> list[str]:
    """The top-level statements of a Python source, normalized (module docstring), as AST dumps."""
    tree = _Normalize().visit(ast.parse(source, where))
    return [ast.dump(stmt) for stmt in tree.body if not isinstance(stmt, ast.Pass)]


class _TagLoader(yaml.SafeLoader):
    """Safe YAML that keeps lm-eval's tags (``!function``) as text."""


_TagLoader.add_multi_constructor("!", lambda loader, tag, node: f"!{tag} {loader.construct_scalar(node)}")


def _units(path: Path) -> list[str]:
    if path.suffix == ".py":
        return python_units(path.read_text(), str(path))
    return [json.dumps({path.name: yaml.load(path.read_text(), _TagLoader)}, sort_keys=True)]


def digest_units(units: Iterable[str]) -> str:
    h = hashlib.sha256()
    for unit in sorted(units):
        h.update(unit.encode())
        h.update(b"\0")
    return h.hexdigest()


# Code that decides only the runs of one data source (``data.source``): a run of another source never runs it
# (tests/unit/test_provenance.py trains and evaluates one with these modules blocked from import), so it is out of
# that run's scope, and a change to it leaves every other source's results as they were.
SOURCE_SCOPED = {
    "facts": ("mohge.data.facts", "mohge.evaluate.bits_stored", "mohge/tasks/mohge_facts.yaml"),
}


def _scoped_file(name: str) -> Path:
    """The file of a :data:`SOURCE_SCOPED` entry: a module, or a path under the package's parent folder."""
    path = PACKAGE.parent / name if "/" in name else _module_file(name)
    if path is None or not path.is_file():
        raise FileNotFoundError(f"provenance: SOURCE_SCOPED names {name}, which is not a file of the package")
    return path


def source_of(config: dict[str, Any] | None) -> str | None:
    """The data source a run config (``to_dict`` of a RunConfig, or its config.json) reads; None without one."""
    from .data import DataConfig

    data = (config or {}).get("data")
    return data.get("source", DataConfig.__dataclass_fields__["source"].default) if isinstance(data, dict) else None


def scope(source: str | None = None) -> tuple[Path, ...]:
    """The deciding files of a run of ``source``: every deciding file but those scoped to another source (None:
    every deciding file, the scope of a run of each source at once)."""
    if source is None:
        return deciding_files()
    other = {_scoped_file(n) for s, names in SOURCE_SCOPED.items() if s != source for n in names}
    return tuple(f for f in deciding_files() if f not in other)


@functools.cache
def sources_sha256(source: str | None = None) -> str:
    """The digest of today's deciding sources (module docstring) in the scope of a run of ``source``."""
    name = f"sources_sha256 {source}"
    known = _cached().get(name)
    if isinstance(known, str):
        return known
    digest = digest_units(u for path in scope(source) for u in _units(path))
    _cache(name, digest)
    return digest


def config_sha256(config: dict[str, Any]) -> str:
    """The sha256 of ``config`` in its hashed form (:func:`hashed_form`), keys sorted."""
    blob = json.dumps(hashed_form(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=PACKAGE, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def code_version(config: dict[str, Any]) -> dict[str, Any]:
    """The ``code`` record of a result made now from ``config`` (``to_dict`` of the RunConfig the code read)."""
    commit = _git("rev-parse", "HEAD")
    source = source_of(config)
    status = _git("status", "--porcelain", "--", *map(str, scope(source))) if commit else None
    return {
        "commit": commit.strip() if commit else None,
        "clean": None if status is None else status.strip() == "",
        "sources_sha256": sources_sha256(source),
        "config_sha256": config_sha256(config),
    }


# ----------------------------------------------------------------------------------------------------
# Committed results
# ----------------------------------------------------------------------------------------------------


# Knobs of the run config newer than some committed results, oldest first, with their defaults: a result recorded
# before a knob existed ran as its default does, so today's resolved config without the knob (where it is at its
# default) is also that result's config. The code that reads a knob is the sources hash's business.
LATER_KNOBS = {
    ("loss", "balance_stats"): "micro_batch",
    ("model", "router", "expert_bias_rate"): 0.0,
    ("model", "router", "group_bias_rate"): 0.0,
    ("train", "adamw"): "auto",
    ("train", "fused"): False,
    ("eval", "heldout_batches"): 0,
}


# Values with more than one name (mohge.core.vocab's aliases): the config hash is over the first spelling, the one
# the committed results were recorded with, so a config that names a value either way keeps their hash.
HASHED_AS = {
    ("model", "router", "gate_mode"): {"softmax_topk_probs": "code_exact"},
    ("loss", "expert_aux_mode"): {"all_experts_sparse": "code"},
}


def _section(config: dict[str, Any], parents: Sequence[str]) -> Any:
    for part in parents:
        config = config.get(part) if isinstance(config, dict) else None
    return config


def hashed_form(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with each :data:`HASHED_AS` value in its hashed spelling (the input is left as it was)."""
    out = json.loads(json.dumps(config))
    for (*parents, key), spelling in HASHED_AS.items():
        section = _section(out, parents)
        if isinstance(section, dict) and isinstance(section.get(key), str) and section[key] in spelling:
            section[key] = spelling[section[key]]
    return out


def without_later_knobs(config: dict[str, Any], first: int = 0) -> dict[str, Any]:
    """``config`` without the :data:`LATER_KNOBS` that are at their default, from the ``first`` one on (they are
    listed oldest first, so ``first`` = i is the config of a result recorded when only the first i existed)."""
    out = json.loads(json.dumps(config))
    for (*parents, key), default in list(LATER_KNOBS.items())[first:]:
        section = _section(out, parents)
        if isinstance(section, dict) and key in section and section[key] == default:
            del section[key]
    return out


def expected_configs(run_dir: Path) -> dict[str, tuple[str, ...]]:
    """The ``config_sha256`` values that ``summary.json`` and ``metrics.json`` of a run folder may hold: from its
    ``config.json`` as today's code reads it (with or without the :data:`LATER_KNOBS` at their defaults), or from
    the file as written (what the run read, when a key was added to the config since, at its default)."""
    from mohge.core.knobs import to_dict

    from .sections import RunConfig

    raw = json.loads((run_dir / "config.json").read_text())
    today = to_dict(RunConfig.from_dict(raw))
    out: dict[str, tuple[str, ...]] = {}
    for config in (today, *(without_later_knobs(today, i) for i in range(len(LATER_KNOBS))), raw):
        for name, part in (
            ("summary.json", {k: v for k, v in config.items() if k != "eval"}),
            ("metrics.json", config),
        ):
            out[name] = tuple(dict.fromkeys((*out.get(name, ()), config_sha256(part))))
    return out


def _run_source(run_dir: Path) -> str | None:
    """The data source of the run in ``run_dir`` (its config.json; None without one: every deciding file)."""
    config = run_dir / "config.json"
    return source_of(json.loads(config.read_text())) if config.is_file() else None


def result_files(roots: Sequence[Path]) -> list[Path]:
    """Every ``ROOT/runs/*/{summary,metrics}.json``: the results whose code :func:`stale` checks."""
    return [
        run_dir / name
        for root in roots
        for run_dir in sorted(Path(root).glob("runs/*"))
        for name in ("summary.json", "metrics.json")
        if (run_dir / name).is_file()
    ]


def stale(roots: Sequence[Path]) -> dict[str, str]:
    """``{result file: why}`` for every result of :func:`result_files` not made by today's code from its run's
    config.json."""
    out: dict[str, str] = {}
    configs: dict[Path, dict[str, tuple[str, ...]]] = {}
    for path in result_files(roots):
        run_dir = path.parent
        if run_dir not in configs:
            configs[run_dir] = expected_configs(run_dir) if (run_dir / "config.json").is_file() else {}
        today = sources_sha256(_run_source(run_dir))
        code = json.loads(path.read_text()).get("code")
        if not isinstance(code, dict):
            out[str(path)] = "no code record (made before results recorded their code)"
        elif code.get("sources_sha256") != today:
            out[str(path)] = f"made by other code: sources {str(code.get('sources_sha256'))[:12]}, today {today[:12]}"
        elif path.name in configs[run_dir] and code.get("config_sha256") not in configs[run_dir][path.name]:
            out[str(path)] = "made from another config than its run's config.json"
    return out


def restamp(roots: Sequence[Path], old: str, reason: str) -> list[Path]:
    """Give today's ``sources_sha256`` to the results recorded with ``old`` (and the right config), noting
    ``restamped_from`` and ``restamp_reason`` (the latest) and appending ``{from, to, reason}`` to ``restamps``
    (every restamp, oldest first: a result restamped twice keeps both reasons): for a change shown not to alter
    any result (a move or rename of code, with tests/golden exact and the lm-eval routes equal), never for one that
    may."""
    if not reason.strip():
        raise ConfigError("restamp needs --reason: what shows the change leaves every result as it was")
    done = []
    for root in roots:
        for run_dir in sorted(Path(root).glob("runs/*")):
            configs = expected_configs(run_dir) if (run_dir / "config.json").is_file() else {}
            today = sources_sha256(_run_source(run_dir))
            for name in ("summary.json", "metrics.json"):
                path = run_dir / name
                result = json.loads(path.read_text()) if path.is_file() else {}
                code = result.get("code")
                if not isinstance(code, dict) or code.get("sources_sha256") != old or old == today:
                    continue  # not recorded with old, or old is this run's digest today: nothing to restamp
                if code.get("config_sha256") not in configs.get(name, ()):
                    continue
                history = code.get("restamps")
                if history is None:  # recorded before the history was kept: its one restamp, if any, first
                    history = (
                        [{"from": code["restamped_from"], "to": old, "reason": code.get("restamp_reason", "")}]
                        if "restamped_from" in code
                        else []
                    )
                history.append({"from": old, "to": today, "reason": reason})
                code.update(sources_sha256=today, restamped_from=old, restamp_reason=reason, restamps=history)
                path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
                done.append(path)
    return done


def _roots(given: Sequence[str]) -> list[Path]:
    return [Path(r) for r in given] or sorted(p.parent for p in (PACKAGE.parents[1] / "results").glob("*/runs"))


@user_errors
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="mohge provenance",
        description="The digest of the sources that decide a result, and the committed results it no longer matches.",
        epilog="restamp --from OLD --reason TEXT [ROOT...]: results recorded with digest OLD get today's (only for a "
        "change shown to leave every result as it was, e.g. a move of code with tests/golden exact).",
    )
    ap.add_argument("command", nargs="?", choices=["digest", "check", "restamp"], default="digest")
    ap.add_argument("roots", nargs="*", help="study roots (default: every results/<study> with runs/)")
    ap.add_argument("--from", dest="old", help="restamp: the digest the results were recorded with")
    ap.add_argument("--reason", default="", help="restamp: why the change leaves every result as it was")
    args = ap.parse_intermixed_args(argv)  # the epilog's order: options before the roots
    if args.command == "digest":
        by_source = {s: sources_sha256(s) for s in SOURCE_SCOPED}
        by_source["every other source"] = sources_sha256("")  # one digest: no scoped file is theirs
        record = {"sources_sha256": sources_sha256(), "by_source": by_source, "source_scoped": SOURCE_SCOPED}
        print(json.dumps({**record, "files": [str(p) for p in deciding_files()]}, indent=2))
        return 0
    if args.command == "restamp":
        if not args.old:
            ap.error("restamp needs --from OLD_DIGEST")
        done = restamp(_roots(args.roots), args.old, args.reason)
        for path in done:
            print(path)
        print(f"{len(done)} result files restamped from sources {args.old[:12]} to today's digest of each run's source")
        return 0
    roots = _roots(args.roots)
    found = stale(roots)
    for path, why in found.items():
        print(f"{path}: {why}")
    checked = len(result_files(roots))
    today = ", ".join(f"{s} {d[:12]}" for s, d in (("facts", sources_sha256("facts")), ("others", sources_sha256(""))))
    if found:
        print(f"{len(found)} of {checked} result files in {len(roots)} study roots are stale, as listed (today's "
              f"sources {today})")  # fmt: skip
        return 1
    print(f"{checked} result files in {len(roots)} study roots, all made by today's code (sources {today})")
    return 0
