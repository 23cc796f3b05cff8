#!/bin/bash
# Probe: old code (a worktree at /tmp/old) against this checkout, processes alternating. usage: ab_proc.sh ROUNDS method batch
cd "$(dirname "$0")/../.."
for r in $(seq 1 $1); do
  if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for w in $order; do
    if [ $w = old ]; then PYTHONPATH=/tmp/old .venv/bin/python docs/bench-batch32/one_run.py 2 $2 $3 2>/dev/null | sed "s/^/old /"; else .venv/bin/python docs/bench-batch32/one_run.py 2 $2 $3 2>/dev/null | sed "s/^/new /"; fi
  done
done
