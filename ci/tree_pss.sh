#!/bin/bash
# Memory of a run's whole process tree: every 10 s, the summed PSS (kB) of the oldest process whose
# command line matches PATTERN (lowest pid) and of its descendants (DataLoader workers), and the main process's
# RSS, with the running maxima; PSS counts a page shared by several processes once in the sum.
# Usage: bash ci/tree_pss.sh PATTERN LOG   (stop it with kill when the run ends)
pattern="$1"; log="$2"; max_pss=0; max_rss=0
while true; do
  main=$(pgrep -f "$pattern" | grep -vx "$$" | head -1)  # lowest pid: the oldest (not this script)
  [ -z "$main" ] && { sleep 5; continue; }
  pids="$main"; frontier="$main"
  while [ -n "$frontier" ]; do
    frontier=$(for p in $frontier; do pgrep -P "$p"; done | tr '\n' ' ')
    pids="$pids $frontier"
  done
  pss=0; n=0
  for p in $pids; do
    v=$(awk '/^Pss:/{print $2}' "/proc/$p/smaps_rollup" 2>/dev/null)
    [ -n "$v" ] && pss=$((pss + v)) && n=$((n + 1))
  done
  rss=$(awk '/^VmRSS:/{print $2}' "/proc/$main/status" 2>/dev/null); rss=${rss:-0}
  [ "$pss" -gt "$max_pss" ] && max_pss=$pss
  [ "$rss" -gt "$max_rss" ] && max_rss=$rss
  echo "$(date +%T) procs $n tree_pss $pss main_rss $rss | max tree_pss $max_pss max main_rss $max_rss" >> "$log"
  sleep 10
done
