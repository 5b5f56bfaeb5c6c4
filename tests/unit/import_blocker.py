"""Run Python as on a bare GPU box: only the standard library, mohge, and the distributions named on the command
line (with everything they require, read from their metadata) can be imported; any other top-level import
fails as if the package were not installed, and is recorded.

    python tests/unit/import_blocker.py [--allow DIST ...] [--report FILE] -c CODE
    python tests/unit/import_blocker.py [--allow DIST ...] [--report FILE] -m MODULE [ARGS ...]

torch, triton and numpy are always allowed. ``--report`` writes the blocked names, one a line. The exit status
is the code's own (an ImportError of a blocked name is a traceback, status 1).
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.metadata as md
import re
import runpy
import sys
import sysconfig

BASE = ("torch", "triton", "numpy")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_closure(names: list[str]) -> set[str]:
    """Canonical names of the installed distributions ``names`` and all they require (extras left out;
    environment markers are not evaluated, which can only allow more)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = canonical(todo.pop())
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen.add(name)
        for req in dist.requires or []:
            if "extra ==" in req.replace('"', "").replace("'", ""):
                continue
            todo.append(re.split(r"[\s;<>=!~\[(]", req.strip(), maxsplit=1)[0])
    return seen


class Blocker:
    """Decides which top-level modules may be found; :class:`Filtered` asks it before each finder of sys.meta_path,
    so a blocked module is simply not found (``import`` raises ModuleNotFoundError, ``find_spec`` gives None)."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed, self.blocked = allowed, []
        paths = sysconfig.get_paths()
        self.stdlib = tuple({paths["stdlib"], paths["platstdlib"]})

    def hides(self, fullname: str) -> bool:
        top = fullname.partition(".")[0]
        if top in self.allowed or top in sys.builtin_module_names:
            return False
        spec = importlib.machinery.PathFinder.find_spec(top)
        origin = (spec.origin or "") if spec is not None else ""
        if origin.startswith(self.stdlib) and "-packages" not in origin:  # _sysconfigdata_*, lib-dynload
            return False
        if top not in self.blocked:
            self.blocked.append(top)
        return True


class Filtered(importlib.abc.MetaPathFinder):
    def __init__(self, finder, blocker: Blocker) -> None:
        self.finder, self.blocker = finder, blocker

    def find_spec(self, fullname, path=None, target=None):
        if self.blocker.hides(fullname):
            return None
        find = getattr(self.finder, "find_spec", None)
        return None if find is None else find(fullname, path, target)

    def invalidate_caches(self) -> None:
        if hasattr(self.finder, "invalidate_caches"):
            self.finder.invalidate_caches()


def allowed_modules(dists: set[str]) -> set[str]:
    mods = {m for m, owners in md.packages_distributions().items() if any(canonical(d) in dists for d in owners)}
    return mods | set(sys.stdlib_module_names) | {"mohge", "__main__", "_distutils_hack"}


def main(argv: list[str]) -> None:
    """``argv``: options, then ``-c CODE`` or ``-m MODULE``, then the program's own arguments (kept whole)."""
    cut = next((i for i, a in enumerate(argv) if a in ("-c", "-m")), None)
    if cut is None or cut + 1 >= len(argv):
        sys.exit("usage: import_blocker.py [--allow DIST ...] [--report FILE] (-c CODE | -m MODULE) [ARGS ...]")
    ap = argparse.ArgumentParser()
    ap.add_argument("--allow", action="append", default=[], help="a distribution that may be imported too")
    ap.add_argument("--report", help="write the blocked top-level names here")
    args = ap.parse_args(argv[:cut])
    kind, target, rest = argv[cut], argv[cut + 1], argv[cut + 2 :]
    blocker = Blocker(allowed_modules(requirement_closure([*BASE, *args.allow])))
    sys.meta_path[:] = [Filtered(f, blocker) for f in sys.meta_path]
    try:
        if kind == "-c":
            sys.argv = ["-c", *rest]
            exec(compile(target, "<import_blocker -c>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = [target, *rest]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    finally:
        if args.report:
            with open(args.report, "w") as fh:
                fh.write("".join(f"{n}\n" for n in blocker.blocked))


if __name__ == "__main__":
    main(sys.argv[1:])
