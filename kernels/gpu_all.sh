#!/usr/bin/env bash
# The one prepared GPU command, for one GPU slot (a device command runs at most 10 minutes): every step under its own
# timeout, all of them under BUDGET_S (570 s), every record under OUTDIR with the device it was measured on.
#
#   kernels/gpu_all.sh [--dry-run] [--steps "STEP ..."] OUTDIR
#
# Steps, in this order (default: all of them; --steps runs a subset, e.g. "install env ladder" for a ladder slot):
#   install      the checkout (pip --no-deps, offline) and the wheels of WHEELS (default .whl: kernels/gpu_wheels.sh
#                makes it on a machine with an index; carry it) into SITE (/tmp/mohge-site) on PYTHONPATH
#   env          nvidia-smi's name, PCI bus, driver, memory, clocks (now and at most), power, temperature, compute
#                mode, and the versions of Python and every package: OUTDIR/env.json (kernels/device_record.py),
#                again at the end
#   kernels      the GPU kernel tests (pytest -m gpu tests/kernels)
#   bench        the kernel benchmark with its torch.mm roofline of the same M, N, K (python -m mohge.kernels.bench)
#   profile      kernel time against wall time of a forward+backward (python -m mohge.kernels.gpu_profile)
#   train_check  20 bf16 steps, Triton vs torch experts vs FSDP2 (python -m mohge.train.distributed.gpu_check)
#   study        the one-GPU study's whole DAG (studies/gpu/config.yaml: train, evaluate, trace, measured load, tables,
#                figures), STUDY_GPU_JOBS (3) GPU jobs at once
#   ladder       the next LADDER_AT_ONCE (2) runs of the GPU capacity ladder (studies/gpu_capacity/config.yaml; mohge slot
#                picks them, seed by seed, skipping those whose results are in the checkout), only with LADDER_MIN_S
#                (480 s) left; with every run in, nothing (the analysis runs on a CPU from the committed runs)
#
# Caps (seconds; each step gets its cap or the time left, whichever is less): install 120, env 30, kernels 100,
# bench 100, profile 45, train_check 120, study 360, ladder the rest. On an H200 the first six took 108 s in all
# (results/bench/gpu_env.log's run); studies/gpu/config.yaml and docs/study.md ("The GPU capacity ladder") estimate theirs.
#
# OUTDIR gets gpu_all.log (everything printed), env.json, steps.tsv (step, exit status, seconds, timeout),
# kernels_bench.csv, train_check.json and records.tar.gz (every step's log and output, results/, figures/ and logs/
# of both studies), packed again after each step: at most 8 files, as a device command returns them.
#
# --dry-run (or DRY_RUN=1) runs nothing on a GPU: it prints every step's command and checks that every file, module
# and Snakemake target the steps name exists (snakemake -n of both studies), that WHEELS holds every pin of
# kernels/gpu_wheels.txt, and exits 1 naming what is missing.
#
# Environment: PYTHON (python3), WHEELS, SITE, BUDGET_S, STUDY_GPU_JOBS, LADDER_AT_ONCE, LADDER_MIN_S, CORES (nproc).
# Exit status: 0 when every step ran and passed, 1 otherwise.
set -uo pipefail

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; }
DRY=${DRY_RUN:-0}
STEPS="install env kernels bench profile train_check study ladder"
OUT=
while [ $# -gt 0 ]; do
    case $1 in
    --dry-run) DRY=1 && shift ;;
    --steps) STEPS=${2:?--steps needs a list} && shift 2 ;;
    -h | --help) usage && exit 0 ;;
    -*) echo "gpu_all: unknown option $1" >&2 && exit 2 ;;
    *) [ -z "$OUT" ] || { echo "gpu_all: one OUTDIR, not $OUT and $1" >&2 && exit 2; } && OUT=$1 && shift ;;
    esac
done
[ -n "$OUT" ] || { echo 'usage: kernels/gpu_all.sh [--dry-run] [--steps "STEP ..."] OUTDIR' >&2 && exit 2; }
for s in $STEPS; do
    case " install env kernels bench profile train_check study ladder " in
    *" $s "*) ;;
    *) echo "gpu_all: unknown step $s" >&2 && exit 2 ;;
    esac
done

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REC=$(mktemp -d "${TMPDIR:-/tmp}/gpu_all-records.XXXXXX") # packed into OUT/records.tar.gz: OUT holds 6 files
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-$ROOT/.whl}
SITE=${SITE:-/tmp/mohge-site}
BUDGET=${BUDGET_S:-570}
RESERVE=20 # seconds kept for the last record and the archive
STUDY_GPU_JOBS=${STUDY_GPU_JOBS:-3}
LADDER_AT_ONCE=${LADDER_AT_ONCE:-2}
LADDER_MIN_S=${LADDER_MIN_S:-480}
CORES=${CORES:-$(nproc)}
T0=$(date +%s)
STUDY=(configs/config.yaml studies/gpu/config.yaml)
LADDER=(configs/config.yaml studies/gpu_capacity/config.yaml)
PINS="$HERE/gpu_wheels.txt"
export PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
# the wheels' packages first on the path, and `python` (what the workflow's jobs call) the interpreter given
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH"
cd "$ROOT" || exit 1

# The command of each step: one shell line, run under `timeout` (printed as it is by --dry-run).
snake="$PY -m snakemake --cores $CORES --keep-going --rerun-incomplete --printshellcmds"
# targets come first on a snakemake line: --configfile takes every word after it
declare -A CMD CAP
# the checkout first (the kernel steps need only it, torch, triton, numpy and pytest), then the workflow's wheels
# `python` a wrapper, not a link: a linked interpreter outside its venv would not find the venv's packages
CMD[install]="mkdir -p '$SITE/bin' && printf '#!/bin/sh\\nexec %s \"\$@\"\\n' \"\$(command -v '$PY')\" >'$SITE/bin/python'"
CMD[install]+=" && chmod +x '$SITE/bin/python'"
CMD[install]+=" && (cd / && $PY -c 'import mohge.kernels' 2>/dev/null || $PY -m pip install --quiet --no-deps --no-build-isolation --no-index -e '$ROOT')"
CMD[install]+=" && $PY -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target '$SITE' '$WHEELS'/*.whl"
CMD[install]+=" && $PY -c 'import snakemake, lm_eval, datasets, mohge_studies.workflow; print(\"install: snakemake\", snakemake.__version__)'"
CMD[env]="$PY '$HERE/device_record.py' --out '$OUT/env.json' --label start"
CMD[kernels]="$PY -m pytest -m gpu tests/kernels -q -p no:cacheprovider --confcutdir=tests/kernels"
CMD[bench]="$PY -m mohge.kernels.bench --out '$REC/kernels_bench.csv' && cp '$REC/kernels_bench.csv' '$OUT/'"
CMD[profile]="$PY -m mohge.kernels.gpu_profile --out '$REC/kernels_profile.json'"
CMD[train_check]="$PY -m mohge.train.distributed.gpu_check --out '$REC/train_check' --steps 20"
CMD[train_check]+=" && cp '$REC/train_check/train_check.json' '$OUT/'"
CMD[study]="$snake --resources gpu=$STUDY_GPU_JOBS --configfile ${STUDY[1]}"
ladder_targets="\$($PY -m mohge slot ${LADDER[*]} --runs $LADDER_AT_ONCE)"
ladder_opts="--resources gpu=$LADDER_AT_ONCE --set-threads data_shard=1 --configfile ${LADDER[1]}"
CMD[ladder]="t=$ladder_targets; if [ -z \"\$t\" ]; then echo 'ladder: every run is in; its analysis needs no GPU:"
CMD[ladder]+=" snakemake --cores 1 --configfile ${LADDER[1]} on a CPU, from the committed runs'; exit 0; fi;"
CMD[ladder]+=" ${snake/snakemake/snakemake \$t} $ladder_opts"
CAP=([install]=120 [env]=30 [kernels]=100 [bench]=100 [profile]=45 [train_check]=120 [study]=360 [ladder]=100000)

left() { echo $((BUDGET - ($(date +%s) - T0) - RESERVE)); }

# pack: every record, and what both studies made, into OUT/records.tar.gz (whole or not at all)
pack() {
    local have=() p
    for p in results/gpu figures/gpu logs/gpu results/gpu_capacity figures/gpu_capacity logs/gpu_capacity; do
        [ -e "$ROOT/$p" ] && have+=("$p")
    done
    tar czf "$OUT/records.tar.gz.tmp" -C "$REC" . ${have[@]+-C "$ROOT" "${have[@]}"} &&
        mv "$OUT/records.tar.gz.tmp" "$OUT/records.tar.gz"
}

# run_step NAME: the step's command under timeout min(cap, time left), its output in REC/NAME.log and on the screen,
# a row of steps.tsv, the archive packed again
status=0
run_step() {
    local name=$1 t s rc
    t=$(left)
    [ "${CAP[$name]}" -lt "$t" ] && t=${CAP[$name]}
    if [ "$name" = ladder ] && [ "$(left)" -lt "$LADDER_MIN_S" ]; then
        echo "gpu_all: ladder not started: $(left) s left, a slot of its runs needs LADDER_MIN_S=$LADDER_MIN_S"
        printf '%s\tskipped\t0\t%s\n' "$name" "$t" >>"$OUT/steps.tsv"
        return
    fi
    if [ "$t" -lt 10 ]; then
        echo "gpu_all: $name skipped: the budget is spent"
        printf '%s\tskipped\t0\t%s\n' "$name" "$t" >>"$OUT/steps.tsv"
        status=1
        return
    fi
    echo "=== gpu_all: $name (timeout ${t} s, $(left) s left): ${CMD[$name]}"
    s=$(date +%s)
    timeout --kill-after=10 "$t" bash -c "${CMD[$name]}" 2>&1 | tee "$REC/$name.log"
    rc=${PIPESTATUS[0]}
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - s))" "$t" >>"$OUT/steps.tsv"
    [ "$rc" -eq 0 ] || status=1
    pack
}

# --dry-run: every step's command, then whether what it names is here
dry_run() {
    local missing=() f m pin name ver n
    for s in $STEPS; do printf '[dry-run] %-11s (cap %6s s): %s\n' "$s" "${CAP[$s]}" "${CMD[$s]}"; done
    for f in Snakefile "${STUDY[@]}" "${LADDER[@]}" kernels/device_record.py kernels/bench.py kernels/gpu_profile.py \
        kernels/gpu_wheels.txt tests/kernels/test_triton_gpu.py src/mohge/train/distributed/gpu_check.py; do
        [ -f "$ROOT/$f" ] || missing+=("file $f")
    done
    for m in mohge.kernels.bench mohge.kernels.gpu_profile mohge.train.distributed.gpu_check mohge_studies.workflow.slot; do
        "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('$m') is None)" 2>/dev/null ||
            missing+=("module $m")
    done
    n=0
    while read -r pin; do
        pin=${pin%%#*} && pin=${pin// /}
        [ -n "$pin" ] || continue
        n=$((n + 1))
        name=${pin%%==*} ver=${pin#*==}
        # a wheel's file name spells its project with _ for - (PEP 427), in any case
        if ! ls "$WHEELS" 2>/dev/null | grep -qi "^${name//-/_}-${ver}-"; then
            missing+=("wheel $pin in $WHEELS (kernels/gpu_wheels.sh $WHEELS makes them)")
        fi
    done <"$PINS"
    echo "[dry-run] wheels: $n pins of kernels/gpu_wheels.txt looked for in $WHEELS"
    if ! $snake -n --quiet rules --resources gpu=$STUDY_GPU_JOBS --configfile "${STUDY[1]}" >"$OUT/dry_study.log" 2>&1; then
        missing+=("study targets: snakemake -n --configfile ${STUDY[1]} failed ($OUT/dry_study.log)")
    fi
    local targets
    targets=$("$PY" -m mohge slot "${LADDER[@]}" --runs "$LADDER_AT_ONCE" 2>>"$OUT/dry_ladder.log")
    echo "[dry-run] ladder: next runs $("$PY" -m mohge slot "${LADDER[@]}" --runs "$LADDER_AT_ONCE" --names | tr '\n' ' ')"
    # shellcheck disable=SC2086
    if ! ${snake/snakemake/snakemake $targets} -n --quiet rules $ladder_opts >>"$OUT/dry_ladder.log" 2>&1; then
        missing+=("ladder targets: snakemake -n --configfile ${LADDER[1]} failed ($OUT/dry_ladder.log)")
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        printf '[dry-run] missing: %s\n' "${missing[@]}"
        return 1
    fi
    echo "[dry-run] every file, module, wheel and target is here"
}

if [ "$DRY" = 1 ]; then
    dry_run
    rc=$?
    rm -rf "$REC"
    exit $rc
fi

exec > >(tee -a "$OUT/gpu_all.log") 2>&1
printf 'step\tstatus\tseconds\ttimeout\n' >"$OUT/steps.tsv"
echo "gpu_all: steps $STEPS, budget $BUDGET s, OUT $OUT"
for s in $STEPS; do run_step "$s"; done
"$PY" "$HERE/device_record.py" --out "$OUT/env.json" --label end || status=1
cp "$OUT/env.json" "$OUT/steps.tsv" "$REC/" && pack
echo "gpu_all: exit status $status after $(($(date +%s) - T0)) s (everything in $OUT)"
sleep 1 # the log's tee drains before the command returns
exit $status
