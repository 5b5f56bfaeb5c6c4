#!/usr/bin/env bash
# Runs the pilot specs of results/capacity/pilot/specs/ one at a time, in the order listed in queue.txt,
# skipping those with a summary.json; one thread each, niced. Log: work/capacity-pilot/logs/NAME.log
set -u
cd "$(dirname "$0")/../../.."
mkdir -p work/capacity-pilot/logs
while true; do
  next=""
  while read -r name; do
    [ -z "$name" ] && continue
    if [ ! -f "results/capacity/pilot/$name/summary.json" ] && [ ! -f "work/capacity-pilot/logs/$name.failed" ]; then next=$name; break; fi
  done < results/capacity/pilot/queue.txt
  [ -z "$next" ] && break
  OMP_NUM_THREADS=1 PYTHONPATH=src nice -n 5 .venv/bin/python workflow/scripts/capacity_pilot.py \
    "results/capacity/pilot/specs/$next.yaml" "$next" > "work/capacity-pilot/logs/$next.log" 2>&1 \
    || touch "work/capacity-pilot/logs/$next.failed"
done
