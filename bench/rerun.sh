#!/usr/bin/env bash
# Every figure of docs/performance.md's "Two ways to count" and "Throughput under a real
# server", in one command, for re-measuring after a change (e.g. new accounting in the core):
#
#   bash bench/rerun.sh OUT_DIR [BEFORE_TREE]
#
# BEFORE_TREE: another checkout, built (git worktree add /tmp/before COMMIT && cd /tmp/before
# && make build), measured in the same rounds where a script can (throughput.py --before) and
# right after otherwise. Each result goes to OUT_DIR as JSON, the load average before and after
# each command to OUT_DIR/load.txt. Takes ~30 minutes (the instruction counts ~15 of them).
# Needs wrk (throughput) and valgrind (instructions).
set -euo pipefail
out=${1:?usage: bash bench/rerun.sh OUT_DIR [BEFORE_TREE]}
before=${2:-}
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PY:-$here/.venv/bin/python}
mkdir -p "$out"
run() {  # name, tree, command...
    local name=$1 tree=$2
    shift 2
    echo "$name: $(uptime)" >> "$out/load.txt"
    (cd "$here/bench" && PYTHONPATH=$tree "$@") > "$out/$name.log" 2>&1
    echo "$name done: $(uptime)" >> "$out/load.txt"
}
trees=("$here")
[ -n "$before" ] && trees+=("$before")
for tree in "${trees[@]}"; do
    tag=$([ "$tree" = "$here" ] && echo this || echo before)
    run "process-$tag" "$tree" "$py" overhead_process.py --split --rounds 5 --json "$out/process-$tag.json"
    run "overhead-$tag" "$tree" "$py" overhead.py --requests 3000 --rounds 7 --soak 0 --json "$out/overhead-$tag.json"
    run "instructions-cold-$tag" "$here" "$py" overhead_instructions.py --cold --requests 1500 --tree "$tree"
done
variants=bare,otel,tracekit,tracekit-unbuilt
drop_variants=bare,tracekit,tracekit-unbuilt
extra=()
if [ -n "$before" ]; then
    variants=$variants,tracekit@before
    drop_variants=$drop_variants,tracekit@before
    extra=(--before "$before")
fi
run throughput-otlp "$here" "$py" throughput.py --rounds 5 --duration 10 --variants "$variants" "${extra[@]}" --json "$out/throughput-otlp.json"
run throughput-drop "$here" "$py" throughput.py --rounds 3 --duration 10 --exporter drop --variants "$drop_variants" "${extra[@]}" --json "$out/throughput-drop.json"
echo "results in $out"
