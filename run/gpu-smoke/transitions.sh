#!/usr/bin/env bash
# The transition-overhead runs on a GPU machine (issue 30, item 6), from the repo root there.
# Installs shoprld's dependencies from carried wheels (.gpuwork/whl: transitions, watchdog,
# python-dotenv, structlog, pydantic + pydantic-core, annotated-types, typing-inspection,
# typing-extensions; the device has the rest), lays shoprld out twice without a build (the tree
# as it is = "before"; the tree with .gpuwork/after/{daemon,states} copied over it = "after"),
# then runs tests/bench/bench_engine.py --only floors,transitions for each variant named, in
# order, figures recomputed from the kept journal if the time limit cuts it. JSON to $OUT.
# Usage: bash .gpuwork/run.sh TAG ROUNDS LIMIT_S VARIANT...   (VARIANT: after | before)
set -u; tag=$1; rounds=$2; limit=$3; shift 3
G=.gpuwork
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/deps $G/whl/*.whl || exit 9
# shoprld's layout (pyproject's package-dir) without a build: shoprld = daemon/_root, its
# subpackages linked to the tree's folders.
lay() {  # lay DEST DAEMON_DIR STATES_DIR
    rm -rf "$1"; mkdir -p "$1"; cp -r "$2/_root" "$1/shoprld"
    ln -s "$2" "$1/shoprld/daemon"; ln -s "$3" "$1/shoprld/states"; ln -s "$PWD/run" "$1/shoprld/recipes"
}
rm -rf /tmp/before-daemon /tmp/after-daemon /tmp/before-states /tmp/after-states
cp -r daemon /tmp/before-daemon; cp -r daemon /tmp/after-daemon; cp -r $G/after/daemon/. /tmp/after-daemon/
cp -r states /tmp/before-states; cp -r states /tmp/after-states; cp -r $G/after/states/. /tmp/after-states/
lay /tmp/shop-before /tmp/before-daemon /tmp/before-states; lay /tmp/shop-after /tmp/after-daemon /tmp/after-states
{ echo "date $(date -u +%FT%TZ)"; nvidia-smi -L; nproc; cat /proc/loadavg; uname -r; python3 -V; } > $OUT/machine-$tag.txt 2>&1
cat $OUT/machine-$tag.txt
for v in "$@"; do
  export PYTHONPATH=/tmp/shop-$v:/tmp/deps:$PWD
  python3 -c "import shoprld.daemon.core.engine as e; import shoprld.states.train as t; print('$v', 'files_later' in open(e.__file__).read(), 'round\'s first launch' in open(t.__file__).read())"
  rm -rf /tmp/tb
  timeout $limit python3 tests/bench/bench_engine.py --keep /tmp/tb --only floors,transitions --rounds $rounds > $OUT/transition-$tag-$v.json 2> $OUT/bench-$tag-$v.err
  echo "$v bench rc=$?"
  python3 - "$tag-$v" <<'P'
import json, sys, os
sys.path.insert(0, "tests/bench")
from bench_engine import transition_figures
from common import journal
from pathlib import Path
out = os.environ["OUT"]; tag = sys.argv[1]
p = Path(out) / f"transition-{tag}.json"
try:
    d = json.loads(p.read_text())
except Exception:
    d = {"cut_by_timeout": True}
root = Path("/tmp/tb/transitions")
recs = journal(root)
d["from_kept_journal"] = transition_figures(root, recs)
d["rounds_done_in_journal"] = sum(1 for r in recs if r["event"] == "round.done")
p.write_text(json.dumps(d, indent=1))
f = d["from_kept_journal"]["outcome_to_next_spawn_ms"]
print(tag, "handoffs", f.get("n"), "p50", f.get("p50"), "p95", f.get("p95"), "max", f.get("max"))
print(json.dumps({k: [v.get("p50"), v.get("max")] for k, v in f.get("by_handoff", {}).items()}))
print("floor", d.get("floors", {}).get("atomic_write_fsync_ms", {}).get("p50"))
P
done
