"""mohge mtimes: tracked files get their last commit's time; a study's derived files are dated after their commit and
after the study's per-run files, so that Snakemake finds committed results up to date in a fresh clone."""

import os
import subprocess
from pathlib import Path

from mohge import mtimes


def git(repo: Path, *args: str, when: int | None = None) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    if when is not None:
        env.update(GIT_AUTHOR_DATE=f"@{when} +0000", GIT_COMMITTER_DATE=f"@{when} +0000")
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def commit(repo: Path, files: dict[str, str], when: int) -> None:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"at {when}", when=when)


def test_a_figure_is_newer_than_every_committed_script_and_older_than_an_uncommitted_change(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    commit(repo, {"results/s/runs/a/summary.json": "{}", "results/s/runs.csv": "x"}, 1_000_000)
    commit(repo, {"workflow/scripts/plot.py": "1", "figures/s/F1.png": "1", "results/s/tables/T1.md": "1"}, 1_000_100)
    mtimes.restore(repo)
    mtime = {p: (repo / p).stat().st_mtime for p in ("workflow/scripts/plot.py", "figures/s/F1.png",
                                                     "results/s/tables/T1.md", "results/s/runs.csv")}  # fmt: skip
    assert mtime["workflow/scripts/plot.py"] == 1_000_100
    assert mtime["figures/s/F1.png"] > mtime["workflow/scripts/plot.py"]  # Snakemake asks strictly newer
    assert mtime["results/s/tables/T1.md"] > 1_000_100 and mtime["results/s/runs.csv"] > 1_000_000
    # a committed change of the drawing code that leaves the figure's bytes as they were (the suite redraws every
    # committed figure from a fresh clone and compares: test_readme_commands_in_a_fresh_clone): still up to date
    commit(repo, {"workflow/scripts/plot.py": "2", "studies/s/draw.py": "2"}, 1_000_200)
    mtimes.restore(repo)
    assert (repo / "figures/s/F1.png").stat().st_mtime > (repo / "studies/s/draw.py").stat().st_mtime == 1_000_200
    (repo / "workflow/scripts/plot.py").write_text("3")  # an uncommitted change: newer, Snakemake redraws
    mtimes.restore(repo)
    assert (repo / "workflow/scripts/plot.py").stat().st_mtime > (repo / "figures/s/F1.png").stat().st_mtime
