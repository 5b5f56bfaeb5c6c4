"""What the Snakefile plans from one merged config: its validated runs (mohge_studies.config.runs.plan and the JSON
schema generated from the same sections), its output roots, the runs a growing study has committed, what the rules make,
the targets of `all`, and per job its resolved config and sizes.

Every refusal is a :class:`mohge.config.ConfigError` naming the key and value, raised while the workflow is
parsed, before any job runs; :func:`plan_or_refuse`, which workflow/rules/common.smk calls, prints it as one line and
exits 2.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import reprlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mohge_studies.config.runs import ClusterConfig, plan
from mohge_studies.design import design

from mohge.config import ConfigError, DataConfig, RunConfig, load_run_config, load_yaml_or_json, to_dict

from . import resources, settings, targets
from .checkout import committed_studies, git_tracked, measured_kernels, study_config_file


def schema_message(err) -> str:
    """One line from a jsonschema error, built from its parts: never repr(instance), which for a shared (aliased)
    structure is the whole expansion."""
    where = ".".join(str(p) for p in err.absolute_path) or "config"
    short = reprlib.Repr()  # its attributes, not keywords: Python 3.11's Repr takes none
    short.maxlevel, short.maxlist, short.maxdict, short.maxstring, short.maxother = 2, 4, 4, 40, 40
    allowed = short.repr(err.validator_value)
    return f"{where}={short.repr(err.instance)}: fails the schema's {err.validator!r} ({allowed})"


def validated_runs(config: dict, schema: dict) -> dict[str, RunConfig]:
    """mohge_studies.config.runs.plan, the validator `mohge runs list` runs, then the JSON ``schema`` generated
    from the same declarations (which must then agree; tests/workflow feed the same configs to both)."""
    import jsonschema

    runs = plan(config)
    err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(config))
    if err is not None:
        raise ConfigError(schema_message(err))
    return runs


def check_configfiles(paths: Sequence[str], cli_config: dict | None) -> None:
    """Every --configfile read again by mohge's bounded loader (size, depth, expanded aliases, duplicate keys)
    before anything walks Snakemake's copy: an alias bomb or a 1 GB file is refused in one line. A config given
    with --configfile names its own `study` (here or in --config), else its runs would land in results/default."""
    datas = []
    for path in paths:
        try:
            datas.append(load_yaml_or_json(path))
        except ConfigError:
            raise
        except ValueError as err:
            raise ConfigError(str(err)) from err
    if paths and not any("study" in d for d in datas) and "study" not in (cli_config or {}):
        raise ConfigError(
            f"study: {os.fspath(paths[-1])!r} sets no top-level `study:`; name one so its results do "
            "not overwrite results/default"
        )


def digest(obj: Any) -> str:
    """A short hash of a config section: a params entry, so a change reruns the job and the reason stays short."""
    blob = json.dumps(obj, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def resolved(cfg: RunConfig) -> dict:
    """A run config as the code reads it: a key added since a run was recorded counts at its default."""
    return {**to_dict(cfg), "data": to_dict(cfg.data_config)}


def committed_diff(config: dict, recorded: dict | None) -> list[str]:
    """The top-level keys in which ``config`` differs from the ``recorded`` one, its `cluster` section aside
    (where a study runs, not what it computes)."""

    def strip(c: dict) -> dict:
        return {k: v for k, v in c.items() if k != "cluster"}

    if recorded is not None and strip(recorded) == strip(config):
        return []
    ours, theirs = strip(config), strip(recorded or {})
    return sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)) or ["its source"]


class WorkflowPlan:
    """The plan of one merged workflow ``config`` run from the working directory, whose checkout (configs/, studies/,
    the committed benchmark CSV) is ``checkout``. ``from_results``: only tables and figures are asked for (the `figures`
    target), from the committed CSVs. ``tracked``: the files git tracks under a folder. ``rerun_committed``: make every
    run again (MOHGE_RERUN_COMMITTED=1, a reproduction)."""

    def __init__(
        self,
        config: dict,
        runs: dict[str, RunConfig],
        *,
        checkout: str = ".",
        from_results: bool = False,
        tracked: Callable[[str], list[str]] = git_tracked,
        rerun_committed: bool = False,
    ) -> None:
        self.config, self.runs = config, runs
        self.checkout = checkout
        self.configs = os.path.normpath(os.path.join(checkout, "configs"))  # and the studies' folders: studies/
        self.from_results, self.tracked, self.rerun_committed = from_results, tracked, rerun_committed
        # one root per config (its `study`): no config can write over another's committed results
        self.study = config.get("study", "default")
        self.res, self.work, self.logs = (f"{root}/{self.study}" for root in ("results", "work", "logs"))
        self.datasets = sorted({cfg.dataset for cfg in runs.values()})
        self.util = settings.utilization(config)
        self.cluster = ClusterConfig.from_dict(config.get("cluster") or {}, "cluster")
        self.traced = settings.trace_runs(runs, self.util)
        self._settings: dict[str, dict] = {}
        self._mem_mb: dict[str, int] = {}

    # ------------------------------------------------------------ committed results

    def guard_committed_study(self) -> None:
        """A study whose results/<study>/ git tracks is only run with the config that made it (the `cluster`
        section aside: where it runs, not what): any other config is refused before any job is planned."""
        files = self.tracked(self.res)
        if not files:
            return
        recorded, source = study_config_file(self.checkout, self.study)
        differs = committed_diff(self.config, recorded)
        if not differs:
            return
        made_by = os.path.relpath(source) if source else "a config in neither configs/ nor studies/"
        raise ConfigError(
            f"study={self.study!r}: {self.res}/ holds {len(files)} committed files, made by {made_by}, and this "
            f"config differs from it (in {', '.join(differs)}); name another study (a top-level `study:` in your "
            "config, or --config study=NAME) so that the committed results stay as they are"
        )

    @functools.cached_property
    def committed(self) -> set[str]:
        """The runs of a pre-declared study (a config with an `analysis` section: it grows over sittings) whose
        results git tracks, all of per_run_results, with a committed config.json that is today's resolved config
        of the run (as today's code reads it: a key added since, at its default, is no change). They are sources:
        no rule makes them, so a clone extends the study (new arms, their data prepared again) without retraining
        them. A run whose config changed is not committed and reruns; ``rerun_committed`` makes every run again
        (`git diff results/` then shows what moved)."""
        if self.from_results or "analysis" not in self.config or self.rerun_committed:
            return set()
        have, kept = set(self.tracked(self.res)), set()
        for run, cfg in self.runs.items():
            if not all(f in have for f in targets.per_run_results(self.res, run, self.traced)):
                continue
            try:
                recorded = load_run_config(f"{self.res}/runs/{run}/config.json")
            except (OSError, ValueError):  # ConfigError included: a key the config schema does not know
                continue
            if resolved(recorded) == resolved(cfg):
                kept.add(run)
        return kept

    @property
    def made(self) -> list[str]:
        """The runs the rules make: every run but the committed ones, in plan order."""
        return [r for r in self.runs if r not in self.committed]

    def pending_run_outputs(self) -> list[str]:
        """Evaluated results of a growing study's declared runs not yet committed, as targets of `all`: its plan
        trains them even while its collected CSVs, made from the committed runs, are up to date."""
        if not self.committed or self.from_results:
            return []
        return [f"{self.res}/runs/{run}/metrics.json" for run in self.made]

    # ------------------------------------------------------------ studies: this config's and the committed ones

    def study_config(self, study: str) -> dict:
        """The config of ``study``: this one, or its own (its folder's in studies/, else the file in configs/ that
        names it) merged over the default ({"study": study} when none does)."""
        if study == self.study:
            return self.config
        return self.study_settings(study)["config"]

    def study_settings(self, study: str) -> dict:
        """What the tables and figures of ``study`` take from its config: its merged config and F6's benchmark CSV
        (`bench_csv`); F4/T3's routing trace is :meth:`study_source`."""
        if study not in self._settings:
            cfg = self.config if study == self.study else study_config_file(self.checkout, study)[0]
            cfg = cfg or {"study": study}
            self._settings[study] = {"config": cfg, "bench_csv": settings.figures(cfg).bench_csv}
        return self._settings[study]

    def study_source(self, study: str) -> str:
        """F4/T3's routing trace of ``study`` (the run its config names, else the first traced MoHGE run); planned
        when a job of those figures asks, so that parsing the workflow plans no other study's runs."""
        found = self.study_settings(study)
        if "source" not in found:
            cfg = found["config"]
            # another study's runs only name its trace source: its inputs are not checked here (nothing of it runs)
            runs = self.runs if study == self.study else plan(cfg, preflight=False) if "experiments" in cfg else {}
            found["source"] = settings.util_source(runs, cfg) if runs else ""
        return found["source"]

    def in_checkout(self, path: str) -> str:
        """A relative path from the config, read from the workdir when it is there, else from the checkout."""
        if os.path.isabs(path) or os.path.exists(path):
            return path
        return os.path.normpath(os.path.join(self.checkout, path))

    def study_param(self, study: str, key: str) -> Any:
        return settings.study_param(self.study_config(study), key)

    def design_settings(self, study: str) -> dict[str, Any]:
        """What the rules of ``study``'s declared analysis take from its config (its design's ``settings``)."""
        return design(settings.design(self.study_config(study))).settings(self.study_config(study))

    # ------------------------------------------------------------ targets

    def tables(self, study: str | None = None) -> list[str]:
        return targets.tables(study or self.study)

    def figures(self, study: str | None = None) -> list[str]:
        study = study or self.study
        kernels = measured_kernels(self.in_checkout(self.study_settings(study)["bench_csv"]))
        return targets.figures(study, kernels)

    def study_outputs(self, study: str | None = None) -> list[str]:
        """The tables and figures of ``study``'s declared analysis (its design's outputs); none without one."""
        study = study or self.study
        name = settings.design(self.study_config(study))
        return design(name).outputs(study) if name else []

    def inference_runs(self) -> list[str]:
        """The runs with an inference record: every run this config makes, when its config has an enabled
        `inference` section (a committed run's weights are not in the checkout)."""
        asked = "inference" in self.config and settings.inference(self.config).enabled
        return list(self.made) if asked and not self.from_results else []

    def inference_outputs(self, study: str | None = None) -> list[str]:
        """T4 and F13 of this config's study when it makes inference records, else nothing."""
        if (study or self.study) != self.study or not self.inference_runs():
            return []
        return targets.inference_outputs(self.study, bool(self.frontier_test()))

    def frontier_test(self) -> dict[str, str | float]:
        """The declared served-frontier test's params (trained, served, alpha), or {} when the config declares none."""
        test = settings.inference(self.config).frontier_test
        if not test.trained:
            return {}
        return {"trained": test.trained, "served": test.served, "alpha": settings.analysis(self.config).alpha}

    def all_targets(self) -> list[str]:
        """What `all` asks for: this study's tables, figures, declared analysis, inference records and the
        results of its declared runs not yet committed."""
        return (
            self.tables()
            + self.figures()
            + self.study_outputs()
            + self.inference_outputs()
            + self.pending_run_outputs()
        )

    def committed_outputs(self, root: str = ".") -> list[str]:
        """The `figures` target: every committed study's tables and figures (under ``root``)."""
        return [f for s in committed_studies(root) for f in self.tables(s) + self.figures(s) + self.study_outputs(s)]

    def study_traces(self, study: str, listed: Callable[[str], list[str]]) -> list[str]:
        """Every traced run's routing summary of ``study``: the planned ones in a full run of this config, the
        ones ``listed`` (a glob) finds under its results otherwise."""
        if study == self.study and not self.from_results:
            return [f"{self.res}/runs/{run}/trace.json" for run in self.traced]
        return sorted(listed(f"results/{study}/runs/*/trace.json"))

    def study_logs(self, study: str, listed: Callable[[str], list[str]]) -> list[str]:
        """Every run's training log of ``study``: the planned runs' in a full run of this config, the ones
        ``listed`` (a glob) finds under its results otherwise."""
        if study == self.study and not self.from_results:
            return [f"{self.res}/runs/{run}/train_log.jsonl" for run in self.runs]
        return sorted(listed(f"results/{study}/runs/*/train_log.jsonl"))

    # ------------------------------------------------------------ per run and dataset

    def train_section(self, run: str) -> dict:
        """What a training result depends on: everything but the eval section."""
        return {k: v for k, v in to_dict(self.runs[run]).items() if k != "eval"}

    def run_config_json(self, run: str) -> str:
        return json.dumps(to_dict(self.runs[run]), sort_keys=True, indent=2) + "\n"

    def dataset_section(self, dataset: str) -> dict:
        cfg = next(c for c in self.runs.values() if c.dataset == dataset)
        return {"data": cfg.data}

    def data_config(self, dataset: str) -> DataConfig:
        """The DataConfig of a dataset (its shard count and source size the data jobs)."""
        return DataConfig.from_dict(self.dataset_section(dataset)["data"])

    def data_parts(self, dataset: str) -> list[str]:
        """The shard jobs' manifests of a dataset: one data_shard job per shard (data.num_shards)."""
        n = self.data_config(dataset).num_shards
        return [f"{self.work}/data/{dataset}/shards/part-{i:05d}.json" for i in range(n)]

    def data_dir(self, run: str) -> str:
        return f"{self.work}/data/{self.runs[run].dataset}"

    # ------------------------------------------------------------ resources

    def data_job_minutes(self, dataset: str, attempt: int, hub_minutes: int) -> int:
        return resources.data_job_minutes(self.data_config(dataset), attempt, hub_minutes)

    def utilization_nproc(self, run: str) -> int:
        return resources.utilization_nproc(self.runs[run], self.util)

    def utilization_measure(self, run: str) -> list:
        """The measurement flags of a run's utilization job ([] for the analytic placement alone): every token of
        the trace, timed on utilization.measure_nproc ranks (in turns on one GPU where the node has fewer GPUs)."""
        nproc = self.utilization_nproc(run)
        if not nproc:
            return []
        return ["--measure", "--nproc", nproc] + (["--one-device"] if self.utilization_on_one_gpu(run) else [])

    def utilization_on_one_gpu(self, run: str) -> bool:
        return resources.utilization_one_device(self.cluster, self.utilization_nproc(run))

    def utilization_threads(self, run: str) -> int:
        """Threads of a run's utilization job: its measured ranks as processes, else one (the analytic placement, or
        every rank in turns in one process on one GPU)."""
        return 1 if self.utilization_on_one_gpu(run) else (self.utilization_nproc(run) or 1)

    def utilization_gpus(self, run: str) -> int:
        """GPUs of a run's utilization job: one where it times the ranks on a GPU, else none."""
        return 1 if self.utilization_on_one_gpu(run) else 0

    def train_launcher(self) -> str:
        return resources.train_launcher(self.cluster)

    def train_resources(self) -> dict[str, int | str]:
        return resources.train_resources(self.cluster)

    def eval_gpus(self) -> int:
        return resources.eval_gpus(self.cluster)

    def eval_mem_mb(self, run: str) -> int:
        if run not in self._mem_mb:  # counts the model's parameters: once per run
            self._mem_mb[run] = resources.eval_mem_mb(self.runs[run], self.cluster)
        return self._mem_mb[run]

    def eval_runtime(self, attempt: int) -> int:
        return resources.eval_runtime(self.cluster, attempt)

    def inference_args(self) -> list[str]:
        return settings.inference_args(self.config)


def from_snakemake(
    config: dict,
    configfiles: Sequence[str],
    cli_config: dict | None,
    schema: dict,
    checkout: str,
    from_results: bool,
    tracked: Callable[[str], list[str]] = git_tracked,
    environ: Mapping[str, str] | None = None,
) -> WorkflowPlan:
    """The plan of the Snakefile: the config files checked, the runs validated, a committed study guarded."""
    env = os.environ if environ is None else environ
    check_configfiles(configfiles, cli_config)
    runs = validated_runs(config, schema)
    wp = WorkflowPlan(
        config,
        runs,
        checkout=checkout,
        from_results=from_results,
        tracked=tracked,
        rerun_committed=env.get("MOHGE_RERUN_COMMITTED", "") not in ("", "0"),
    )
    if not from_results:
        wp.guard_committed_study()
    return wp


def plan_or_refuse(config: dict, **kwargs: Any) -> WorkflowPlan:
    """:func:`from_snakemake` for the Snakefile: a config mistake (a :class:`ConfigError`) is one line
    ``config error: ...`` on stderr and exit 2, with no stack frames and no schema dump; any other exception,
    ``ValueError`` included, is a bug and keeps its traceback."""
    try:
        return from_snakemake(config, **kwargs)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
