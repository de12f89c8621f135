#!/usr/bin/env bash
# The training speed of two checkouts side by side: digits ES by default (400 steps, population 64, one thread; RUN
# sets another run), the two
# sides interleaved round by round on a noisy machine; prints each run's training seconds (summary.json) and
# the median of the paired ratios (this checkout / the other).
#
#   bash benchmarks/step_speed_ab.sh OTHER_CHECKOUT/src [ROUNDS]
#   RUN="--task pendulum --strategy snes --layer gaussian --steps 200" bash benchmarks/step_speed_ab.sh ...
set -eu
OTHER=$1; ROUNDS=${2:-5}
RUN=${RUN:---task digits --steps 400 --population 64}  # the run both sides time
HERE=$(cd "$(dirname "$0")/.." && pwd)/src
PY=${PYTHON:-python}
OUT=$(mktemp -d)
for r in $(seq "$ROUNDS"); do
  for side in other here; do
    src=$OTHER; [ $side = here ] && src=$HERE
    rm -rf "$OUT/$side"
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 PYTHONPATH=$src $PY -m nesgpu train $RUN \
      --eval-every 1000000 --checkpoint-every 1000000 --progress-every 0 --log none --out "$OUT/$side" > /dev/null
    echo "$side $($PY -c "import json, sys; print(json.load(open(sys.argv[1]))['seconds'])" "$OUT/$side/summary.json")"
  done
done | tee "$OUT/times.txt"
$PY - "$OUT/times.txt" <<'PYEOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
other = [float(r[1]) for r in rows if r[0] == "other"]
here = [float(r[1]) for r in rows if r[0] == "here"]
print(f"median seconds: other {statistics.median(other):.3f}, here {statistics.median(here):.3f}; paired ratio "
      f"here/other {statistics.median([h / o for h, o in zip(here, other)]):.3f}")
PYEOF
rm -rf "$OUT"
