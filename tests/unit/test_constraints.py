"""pyproject.toml asks for ranges, torch alone at the core; constraints.txt pins the artifact's exact stack, each pin
inside those ranges; setup.sh, environment.yml and the per-rule conda envs install that stack."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT_EXTRAS = {"train", "eval", "analysis", "workflow", "kernels"}  # what `all` gathers
UNPINNED_EXTRAS = {"gpu": "nvidia-ml-py comes with the GPU machine's own image, never with setup.sh"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirements() -> dict[str, list[Requirement]]:
    """The core requirements (under "") and each extra's, the extras' references to mohge's own extras left out."""
    groups = {"": project()["dependencies"], **project()["optional-dependencies"]}
    return {group: [r for r in map(Requirement, lines) if r.name != "mohge"] for group, lines in groups.items()}


def pins(lines: list[str]) -> dict[str, Version]:
    """``name==version`` lines (comments and blank lines skipped) as {canonical name: version}, each name once."""
    out: dict[str, Version] = {}
    for line in lines:
        line = line.partition("#")[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep and re.fullmatch(r"[\w.-]+", name) and re.fullmatch(r"[\w.]+", version), line
        assert canonical(name) not in out, f"{name} pinned twice"
        out[canonical(name)] = Version(version)
    return out


def constraints() -> dict[str, Version]:
    return pins((ROOT / "constraints.txt").read_text().splitlines())


def test_the_library_asks_for_ranges_only_and_for_torch_alone_at_its_core():
    groups = requirements()
    assert not [
        f"{g}: {r}" for g, reqs in groups.items() for r in reqs if {s.operator for s in r.specifier} & {"==", "==="}
    ]
    (torch,) = groups[""]
    assert torch.name == "torch" and {s.operator for s in torch.specifier} == {">="} and "2.11" in torch.specifier


def test_all_gathers_every_extra_the_artifact_runs():
    (gathered,) = map(Requirement, project()["optional-dependencies"]["all"])
    assert gathered.name == "mohge" and gathered.extras == ARTIFACT_EXTRAS
    assert ARTIFACT_EXTRAS <= set(requirements())


def test_every_requirement_is_pinned_in_constraints_txt_inside_its_range():
    pinned = constraints()
    for group, reqs in requirements().items():
        for req in reqs:
            if group in UNPINNED_EXTRAS:
                assert canonical(req.name) not in pinned, req
                continue
            assert canonical(req.name) in pinned, f"{req} ({group or 'core'}) has no pin in constraints.txt"
            assert req.specifier.contains(pinned[canonical(req.name)], prereleases=True), (
                str(req),
                str(pinned[canonical(req.name)]),
            )


def test_setup_sh_and_environment_yml_install_the_artifact_with_constraints_txt():
    setup = (ROOT / "setup.sh").read_text()
    install = re.search(r'^\.venv/bin/python -m pip install (.*)-c constraints\.txt -e "\.\[all,test\]"$', setup, re.M)
    assert install
    if "--no-compile" in install[1]:  # what pip leaves uncompiled, compileall compiles (the installed packages' root)
        rest = setup[install.end() :]
        assert re.search(r"^\.venv/bin/python -m compileall .*sysconfig\.get_path\(\"purelib\"\)", rest, re.M), rest
    env_lines = [line.strip() for line in (ROOT / "environment.yml").read_text().splitlines()]
    assert any(line.startswith("- -c constraints.txt") for line in env_lines), env_lines
    assert "- -e .[all,test]" in env_lines, env_lines


def test_the_rule_envs_pin_what_constraints_txt_pins():
    """workflow/envs/*.yaml (their own files: Snakemake copies an env file alone) pin the versions of constraints.txt
    and their ranges admit them."""
    pinned = constraints()
    for path in sorted((ROOT / "workflow" / "envs").glob("*.yaml")):
        pip_section = path.read_text().split("- pip:\n", 1)[1]
        items = re.findall(r"^\s+- ([A-Za-z][^\s#]*)\s*(?:#.*)?$", pip_section, re.M)
        assert items, path
        for item in items:
            req = Requirement(item)
            if canonical(req.name) in pinned:
                assert req.specifier.contains(pinned[canonical(req.name)]), f"{path.name}: {item}"
            else:
                assert not any(s.operator == "==" for s in req.specifier), f"{path.name}: {item} not in constraints.txt"
