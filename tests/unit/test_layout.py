"""The package layout: dependencies run one way (config <- model, data <- train, evaluate <- analysis, so models
never import the trainer and no subsystem imports one above it). Every import of src/mohge, kernels/ and studies/,
module level and inside functions alike, goes to the importer's own subpackage or a lower layer, the library
(``mohge``) never imports the studies (``mohge_studies``), and no modules import each other in a circle. Also: a
dozen modules at most directly in src/mohge, and a docstring on every subpackage."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "mohge"
KERNELS = ROOT / "kernels"
STUDIES = ROOT / "studies"

# Lowest first; a module may import its own layer and the layers before it. model and data are siblings.
LAYERS = {"core": 0, "config": 1, "kernels": 2, "model": 3, "data": 3, "train": 4, "evaluate": 5, "analysis": 6,
          "bench": 7}  # fmt: skip
TOP = 8  # the command modules directly in src/mohge (and mohge/__init__)
KERNELS_MAY_IMPORT = {"mohge.core.vocab"}  # mohge.kernels runs bare on GPU boxes: nothing else of mohge
NO_MOHGE_IMPORTS = {"mohge.evaluate.modeling_mohge", "mohge.evaluate.configuration_mohge"}  # copied into HF exports
MAX_TOP_MODULES = 12


def module_files() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package __init__)."""
    found = {}
    for base, prefix in ((SRC, ["mohge"]), (KERNELS, ["mohge", "kernels"]), (STUDIES, ["mohge_studies"])):
        for path in sorted(base.rglob("*.py")):
            parts = [*prefix, *path.relative_to(base).with_suffix("").parts]
            is_pkg = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return found


MODULES = module_files()


def imports_of(name: str) -> list[tuple[str, int]]:
    """(imported mohge module, line) for every import statement of the module, relative ones resolved. An
    imported name that is itself a module (``from mohge import kernels``) counts as that module."""
    path, is_pkg = MODULES[name]
    package = name.split(".") if is_pkg else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                assert base, f"{path}:{node.lineno}: relative import beyond the package"
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for a in node.names:
                sub = f"{module}.{a.name}"
                out.append((sub if sub in MODULES else module, node.lineno))
    return [(m, line) for m, line in out if m.split(".")[0] in ("mohge", "mohge_studies")]


def owner(name: str) -> str:
    """The module an import of ``name`` lands in: the longest known module prefix (``mohge.x.Y`` -> ``mohge.x``)."""
    parts = name.split(".")
    while ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts)


def layer(name: str) -> int:
    parts = name.split(".")
    if len(parts) >= 2 and parts[1] in LAYERS and (len(parts) > 2 or MODULES[name][1]):
        return LAYERS[parts[1]]
    return TOP


def graph() -> dict[str, list[tuple[str, int]]]:
    return {m: [(owner(t), line) for t, line in imports_of(m)] for m in MODULES}


def lazy_lines(path: Path) -> frozenset[int]:
    """The lines of a module's ``__getattr__`` (PEP 562): imports there run on first attribute access only."""
    tree = ast.parse(path.read_text(), str(path))
    return frozenset(
        line
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
        for line in range(node.lineno, node.end_lineno + 1)
    )


# `import mohge` imports nothing; the layer API (docs/api.md) is re-exported from mohge.model on first access
LAZY_API = "mohge.model"
PACKAGE_LAZY_LINES = lazy_lines(SRC / "__init__.py")


def upward_imports(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    bad = []
    for importer, targets in edges.items():
        sub = importer.split(".")[1] if "." in importer else ""
        for target, line in targets:
            if target in ("mohge", "mohge_studies") and importer != target:
                continue  # the package itself (its __init__ imports nothing of ours; mohge_studies' is the registry)
            if importer.split(".")[0] == "mohge" and target.split(".")[0] == "mohge_studies":
                bad.append(f"{MODULES[importer][0].relative_to(ROOT)}:{line}: {importer} imports {target} (the library"
                           " never imports the studies)")  # fmt: skip
                continue
            tsub = target.split(".")[1] if "." in target else ""
            where = f"{MODULES[importer][0].relative_to(ROOT)}:{line}: {importer} imports {target}"
            if sub == "kernels" and tsub != "kernels" and target not in KERNELS_MAY_IMPORT:
                bad.append(f"{where} (mohge.kernels may import only {sorted(KERNELS_MAY_IMPORT)})")
            elif importer in NO_MOHGE_IMPORTS and target not in NO_MOHGE_IMPORTS:
                bad.append(f"{where} (copied into exported model folders: no mohge import)")
            elif tsub != sub and layer(target) >= layer(importer) and not (layer(importer) == TOP == layer(target)):
                bad.append(f"{where} (layer {layer(target)} from layer {layer(importer)})")
            elif importer == "mohge" and target != "mohge" and (line not in PACKAGE_LAZY_LINES or target != LAZY_API):
                bad.append(f"{where} (this __init__ imports nothing but {LAZY_API}, inside __getattr__)")
            elif importer == "mohge.core":
                bad.append(f"{where} (this __init__ imports nothing)")
    return bad


def cycles(edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing itself (Tarjan)."""
    succ = {m: sorted({t for t, _ in ts if t in edges and t != "mohge"}) for m, ts in edges.items()}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in succ[v]:
                found.append(sorted(comp))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return found


def test_no_upward_import():
    assert upward_imports(graph()) == []


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_top_level_stays_small():
    top = sorted(p.name for p in SRC.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


def test_core_init_imports_nothing():
    tree = ast.parse((SRC / "core" / "__init__.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


@pytest.mark.parametrize(
    "init", sorted(str(p.relative_to(ROOT)) for b in (SRC, STUDIES) for p in b.rglob("__init__.py"))
)
def test_subpackage_has_docstring(init):
    assert ast.get_docstring(ast.parse((ROOT / init).read_text())), f"{init}: say what it owns and may import"


def test_checks_catch_a_bad_layout():
    """The checks themselves: an upward import, a lazy circle and a kernels import are each caught."""
    edges = graph()
    edges["mohge.model.moe"] = [*edges["mohge.model.moe"], ("mohge.train.trainer", 99)]  # model -> train
    edges["mohge.data.shards"] = [*edges["mohge.data.shards"], ("mohge.data.prepare", 99)]  # prepare -> shards
    edges["mohge.kernels.swiglu"] = [*edges["mohge.kernels.swiglu"], ("mohge.config", 99)]
    edges["mohge"] = [*edges["mohge"], ("mohge.model", 1)]  # a module-level import in the package's __init__
    edges["mohge.evaluate.suite"] = [*edges["mohge.evaluate.suite"], ("mohge_studies.analysis.collect", 99)]
    bad = upward_imports(edges)
    assert any("mohge.evaluate.suite imports mohge_studies.analysis.collect (the library" in b for b in bad), bad
    assert any("mohge imports mohge.model (this __init__" in b for b in bad), bad
    assert any("mohge.model.moe imports mohge.train.trainer" in b for b in bad), bad
    assert any("mohge.kernels.swiglu imports mohge.config" in b for b in bad), bad
    assert any({"mohge.data.prepare", "mohge.data.shards"} <= set(c) for c in cycles(edges))


def test_every_subpackage_is_installed():
    """A regular (non-editable) install ships the packages pyproject.toml lists, and only those."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {m for m, (_, is_pkg) in MODULES.items() if is_pkg}
    # a folder of the library's modules without an __init__ (mohge/tasks: the module its task YAMLs name) is a
    # namespace package, shipped; the studies' tests/ and scripts/ folders are not
    found |= {m.rpartition(".")[0] for m, (_, is_pkg) in MODULES.items() if not is_pkg and m.startswith("mohge.")}
    assert listed == found
