#!/usr/bin/env bash
# Reference runs for a change that must not change results: every strategy, kind, chunking, schedule,
# precision, low-bit, RL, sequence and CNN setting, backprop, resume and torchrun (2 processes), each a few
# steps. Run it with the code before and after the change, then compare the two trees:
#
#   PYTHONPATH=OLD_CHECKOUT/src bash benchmarks/identical_runs.sh /tmp/before   # the code before
#   bash benchmarks/identical_runs.sh /tmp/after                                # this checkout
#   python benchmarks/identical_runs.py /tmp/before /tmp/after                  # weights and metrics.csv
#
# About 6 minutes on 2 CPU cores (33 runs). A line "FAIL name" is a run that did not finish.
set -u
DEST=$1
mkdir -p "$DEST"
NOLOG=$(mktemp --suffix .yaml)
echo "log: none" > "$NOLOG"  # (torchrun's own parser takes --log as one of its options)
N="python -m nesgpu train --config $NOLOG --progress-every 0"
run() { name=$1; shift; rm -rf "$DEST/$name"; $N --out "$DEST/$name" "$@" >/dev/null 2>"$DEST/$name.err" || echo "FAIL $name"; }
again() { name=$1; shift; $N --resume "$DEST/$name" "$@" >/dev/null 2>>"$DEST/$name.err" || echo "FAIL $name (resume)"; }
dist() { name=$1; shift; rm -rf "$DEST/$name"; OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m nesgpu train \
  --config "$NOLOG" --progress-every 0 --out "$DEST/$name" "$@" >/dev/null 2>"$DEST/$name.err" || echo "FAIL $name"; }
S="--steps 6 --population 32 --eval-every 3 --checkpoint-every 3"
run es_lowrank --task digits $S
run es_gauss --task digits $S --layer gaussian
run es_sparse --task digits $S --layer sparse
run es_perm --task digits $S --layer permuted
run es_flip --task digits $S --layer flipout
run es_chunk --task digits $S --chunk-size 4
run es_sched --task digits $S --lr-schedule cosine --sigma-schedule linear --sigma-final 0.5 --weight-decay 0.01
run es_zscore --task digits $S --shaping z_score --no-antithetic --layer gaussian
run es_bf16 --task digits $S --precision bf16
run es_bits --task digits $S --bits 1
run ars_pend --task pendulum --strategy ars --steps 4 --population 16 --top-b 4
run ars_v1 --task pendulum --strategy ars --ars-version v1 --steps 4 --population 16
run pgpe_cart --task cartpole --steps 4 --population 16
run pgpe_chunk --task cartpole --steps 4 --population 16 --chunk-size 2
run es_acro --task acrobot --steps 3 --population 16
run ars_linear --task pendulum --strategy ars --hidden 0 --steps 3 --population 16
run rl_options --task cartpole --episodes 2 --start-states independent --reward-shift 0.5 --observation-clip 2 \
  --steps 3 --population 16
run gym_cart --task gym:CartPole-v1 --steps 2 --population 8 --eval-episodes 2
run es_reverse --task reverse --steps 3 --population 16
run es_mnist_cnn --task mnist1d --model cnn --steps 3 --population 16
run bp_digits --task digits --strategy backprop --steps 6 --eval-every 3
run bp_acc --task digits --strategy backprop --steps 6 --accumulate 2 --lr-schedule cosine
run es_resume --task digits $S --steps 3 && again es_resume --steps 6
run pgpe_resume --task cartpole --steps 2 --population 16 && again pgpe_resume --steps 4
run bp_resume --task digits --strategy backprop --steps 3 --lr-schedule cosine && again bp_resume --steps 6
# the strategies that adapt their distribution: a sigma per parameter, a covariance (each resumed once)
run snes_resume --task pendulum --strategy snes --layer gaussian --steps 2 --population 16 && again snes_resume --steps 4
run cem_pend --task pendulum --strategy cem --layer gaussian --steps 3 --population 16
run sep_cma_pend --task pendulum --strategy sep_cma_es --layer gaussian --steps 3 --population 16
run cma_resume --task pendulum --strategy cma_es --layer gaussian --steps 2 --population 16 && again cma_resume --steps 4
run xnes_pend --task pendulum --strategy xnes --layer gaussian --steps 3 --population 16
run pgpe_scales --task pendulum --strategy pgpe --layer gaussian --sigma-lr 0.1 --per-parameter --steps 3 --population 16
dist es_dist --task digits $S --chunk-size 8
dist pgpe_dist --task cartpole --steps 4 --population 16
rm -f "$NOLOG"
echo done
