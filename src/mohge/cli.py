"""The ``mohge`` command: one entry point, a subcommand per user-facing action, each dispatching to the ``main(argv)``
of the module that owns it (importable, so tests call it directly).

    mohge --help                       # every subcommand, one line each
    mohge <command> --help             # the command's own options
    python -m mohge <command> ...       # the same, where the ``mohge`` script is not on PATH

``python -m mohge.train`` stays as it is: torchrun and the training rule launch it by module name.
Every command reports a user mistake in one line with status 2 and lets a bug keep its traceback (status 1);
the codes are mohge.core.cli's (docs/errors.md).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from mohge import __version__
from mohge.core.cli import EXIT_USER, user_errors

# subcommand -> (module owning its main, one line of help); in the order of a study: data, train, evaluate, analyse
COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("mohge.data.prepare", "prepare a data source: tokenizer, token shards, held-out splits"),
    "train": ("mohge.train.trainer", "train one resolved run config (torchrun: python -m mohge.train)"),
    "evaluate": ("mohge.evaluate.suite", "lm-eval tasks and held-out loss of a trained model; build-tasks"),
    "lm-eval": ("mohge.evaluate.harness", "lm-eval's own command line with --model mohge registered"),
    "traces": ("mohge.evaluate.traces", "the routing trace of a trained model on held-out data"),
    "export": ("mohge.evaluate.hf_export", "a trained model folder as a Hugging Face model"),
    "params": (
        "mohge_studies.config.param_report",
        "total and activated parameters of a model, or of a run of a config",
    ),
    "runs": ("mohge_studies.config.runs", "the runs a workflow config plans, and its JSON schema"),
    "sizing": (
        "mohge_studies.analysis.sizing",
        "per-GPU memory, whether it fits, days to finish of a cluster config",
    ),
    "utilization": ("mohge_studies.analysis.utilization", "per-GPU load of expert placements, from a routing trace"),
    "collect": ("mohge_studies.analysis.collect", "the per-run summaries gathered into the study's tables"),
    "study": ("mohge_studies.claims.analysis", "the paired tests and claims of a study (docs/study.md)"),
    "verdicts": (
        "mohge_studies.analysis.verdicts",
        "each claim's verdict, estimate and interval (committed tables)",
    ),
    "bench": ("mohge_studies.bench", "benchmarks: layer, kernels, train, data, eval, inference, peers, ..."),
    "slot": ("mohge_studies.workflow.slot", "the next runs of a study for one GPU slot, and the files that make them"),
    "provenance": ("mohge.config.provenance", "which code made the committed results"),
    "mtimes": ("mohge.mtimes", "date tracked files by their last commit (a fresh clone)"),
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="mohge",
        description="Mixture of Heterogeneous Grouped Experts: data, training, evaluation and analysis commands.",
        epilog="Exit status: 0 done, 1 a bug (with its traceback), 2 a user mistake (one line), 3-6 and 128+N "
        "as docs/errors.md lists. MOHGE_DEBUG=1 shows the traceback of every error.",
    )
    ap.add_argument("--version", action="version", version=f"mohge {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="<command>", title="commands")
    for name, (_, text) in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return ap


def run(command: str, argv: Sequence[str]) -> int:
    """``main(argv)`` of the module that owns ``command``, under the exit-code policy of mohge.core.cli."""
    try:
        module = importlib.import_module(COMMANDS[command][0])
    except ModuleNotFoundError as err:  # a command of an extra the install lacks: one line, not a traceback
        if (err.name or "mohge").split(".")[0] in ("mohge", "mohge_studies"):
            raise  # a module of ours missing is a bug
        print(f"mohge {command}: needs {err.name}, which is not installed here (the bare library installs torch alone;"
              " pip install 'mohge[all]', or the checkout's setup.sh)", file=sys.stderr)  # fmt: skip
        return EXIT_USER
    return user_errors(module.main)(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    ap = build_parser()
    if not args or args[0].startswith("-"):  # --help, --version, or nothing: the listing
        ap.parse_args(args or ["--help"])
        return 0
    if args[0] not in COMMANDS:
        ap.error(f"unknown command {args[0]!r} (choose from {', '.join(COMMANDS)})")
    # everything after the command, --help included, goes to the command's own parser unchanged
    return run(args[0], args[1:])
