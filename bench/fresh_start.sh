#!/bin/bash
# The first `make run` on fresh clones: time from `make run` to /readyz 200, the virtualenv's size
# and package count, and whether torch imports; a baseline ref and the candidate, back to back.
#
#   bench/fresh_start.sh BASELINE_REPO CANDIDATE_REPO [PORT]
#   bench/fresh_start.sh /work/main .          # what README "The first start" reports
#
# Each clone goes to a scratch directory; pip uses the machine's cache as any install would.
set -u
measure() {
  local src=$1 dest=$2 port=$3
  rm -rf "$dest"; git clone -q "$src" "$dest" || return 1
  cd "$dest" || return 1
  local start; start=$(date +%s.%N)
  setsid env SHORTLIST_PORT="$port" make run > make-run.log 2>&1 &
  local pid=$!
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/readyz")" = 200 ]; do
    kill -0 $pid 2> /dev/null || { echo "make run stopped:"; tail -20 make-run.log; return 1; }
    sleep 1
  done
  local end; end=$(date +%s.%N)
  echo "$src ($(git rev-parse --short HEAD)): ready after $(echo "$end - $start" | bc) s," \
    "$(grep -o 'ready in [0-9.]* s' make-run.log) in the server;" \
    ".venv $(du -sh .venv | cut -f1), $(.venv/bin/pip list 2> /dev/null | tail -n +3 | wc -l) packages," \
    "torch: $(.venv/bin/python -c 'import torch' 2>&1 | tail -1 || true)"
  kill -- -$pid
  wait $pid 2> /dev/null
  cd - > /dev/null || return 1
}
base=$(realpath "$1"); candidate=$(realpath "$2"); port=${3:-18931}
scratch=$(mktemp -d)
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
measure "$base" "$scratch/baseline" "$port"
measure "$candidate" "$scratch/candidate" "$((port + 1))"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
rm -rf "$scratch"
