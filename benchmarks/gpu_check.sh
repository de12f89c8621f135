#!/usr/bin/env bash
# One short script for a session that is lent a GPU: the GPU tests, then the benchmarks whose targets need a
# GPU, printed as short tables. Run from the repository root: bash benchmarks/gpu_check.sh
set -euo pipefail
# the repo's .venv where there is one; else a python3 that has torch (a GPU image), with the source on the path
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"; fi
fi
mkdir -p "${OUT:-benchmarks/results}"
OUT=${OUT:-benchmarks/results}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
# GPU tests: the sync-debug test runs only with CUDA; the rest must pass on the GPU as on the CPU
$PY -m pytest -q tests/train/steps/test_sync.py tests/kinds tests/layers tests/test_model.py -x  # every kind and module
# every module family against the plain torch module on CUDA (issue 8): transformer block, embedding, norms, ...
$PY benchmarks/module_speed.py --device cuda --repeats 20 --json "$OUT/modules_cuda.json" | sed -n '/^| module/,$p'
# layer tables on CUDA (the seed's sizes, P = 1024)
$PY benchmarks/layer_speed.py --device cuda --repeats 50 --json "$OUT/layers_cuda.json" --markdown "$OUT/layers_cuda.md" \
  | sed -n '/Time multiplier/,/Noise memory/p'
# low-rank vs plain inference throughput and bf16 vs fp32 for a low-rank MLP forward (issue 2 and 4 targets)
$PY - <<'PYEOF'
import statistics, torch, nesgpu
from torch import nn
def t(fn, n=50):
    for _ in range(10): fn()
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts)
P, d = 8192, 4096
x = torch.randn(P, d, device="cuda")
lowrank_ms = {}
for dtype in (torch.float32, torch.bfloat16):
    plain = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d)).cuda()
    net = nesgpu.convert(nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d)), "lowrank").cuda()
    pm = nesgpu.PerturbedModel(net, P, sigma=0.01); pm.set_noise()
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        base = t(lambda: plain(x)); lr = t(lambda: pm(x))
        # the other path of LowRank.apply_: two batched matmuls instead of r elementwise passes
        nesgpu.kinds.lowrank.ELEMENTWISE_MAX_RANK, saved = 0, nesgpu.kinds.lowrank.ELEMENTWISE_MAX_RANK
        lr_bmm = t(lambda: pm(x))
        nesgpu.kinds.lowrank.ELEMENTWISE_MAX_RANK = saved
    print(f"{dtype}: plain {base:.3f} ms, low-rank population {lr:.3f} ms ({100 * base / lr:.0f}% of plain); "
          f"batched-matmul path {lr_bmm:.3f} ms ({100 * base / lr_bmm:.0f}%)")
    lowrank_ms[dtype] = lr
print(f"bf16 low-rank population forward: {lowrank_ms[torch.float32] / lowrank_ms[torch.bfloat16]:.2f}x fp32 (target >= 1.5)")
PYEOF
# throughput against population and chunk size, and bf16 vs fp32 for whole ES steps (issue 4)
$PY benchmarks/scale.py --device cuda --quick --json "$OUT/scale_cuda.json" > /dev/null
$PY - "$OUT/scale_cuda.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
print("members/s by population:", {row["population"]: round(row["members_per_s"]) for row in r["population"]})
print("chunk vs unchunked:", {row["chunk"]: round(row["vs_unchunked"], 2) for row in r["chunk"]})
p = r["precision"]
print(f"ES step, P = {p['population']}: bf16 {p['bf16_speed_vs_fp32']:.2f}x fp32")
PYEOF
# issue 9/10: config, compiled rollouts (inductor on CUDA) and the shared-input path on the GPU
$PY -m pytest -q tests/train/setup/test_config.py tests/tasks/test_compiled.py tests/test_noise.py -x
$PY benchmarks/population_floor.py --device cuda --rounds 9 | tail -3
$PY benchmarks/iid_noise.py --device cuda --rounds 7 | tail -4
# issue 13: low-bit layers (binary / int8) against the float layer, and the int8 / XNOR products, on CUDA
$PY benchmarks/lowbit.py layers --device cuda --rounds 7 --json "$OUT/lowbit_layers_cuda.json" | grep -v '^|---'
# Hugging Face models (issue 19): a Llama-style population against plain inference of the same rows, bf16
$PY -m pytest -q tests/layers/test_hf.py tests/layers/test_hf_generate.py tests/test_master_weights.py -x
$PY benchmarks/hf_population.py --device cuda --bf16 --hidden 512 1024 --layers 4 --directions 64 \
  --json "$OUT/hf_population_cuda.json" | sed -n '/^| hidden/,/members\/s/p'
# language models on a reward (issue 21): the ES step's generation against plain generate() and against one
# member at a time, bf16 on CUDA; then a short bf16 ES run of the arithmetic task on the demo's small model
# issue 32: eager and compiled (static KV cache, CUDA graphs) decode, population against plain, bf16
$PY -m pytest -q tests/test_decode.py -x
$PY benchmarks/lm_reward_speed.py --device cuda --bf16 --sizes 64x2 256x4 512x4 1024x8 --population 64 --repeats 5 \
  --compiled --json "$OUT/lm_reward_speed_cuda.json" | sed -n '/^| model/,$p'
$PY examples/lm_reward_demo.py --out "$OUT/lm-demo" --pretrain-steps 300 --es-seconds 0
$PY -m nesgpu train --task arithmetic --model "hf:$OUT/lm-demo/model" --device cuda --precision bf16 --steps 50 \
  --population 256 --out "$OUT/lm-demo/es-bf16" --overwrite --log none | tail -1
# issue 30: our side of the GPU-scale comparison: a Qwen2.5-0.5B-shaped population of 1,024 rows (128 members x 8
# prompts, 64 + 64 tokens) in one generate() against plain generate() and ES at Scale's one member at a time, bf16
$PY benchmarks/lm_population_scale.py --device cuda --bf16 --shape 0.5b --members 128 --prompts 8 --repeats 3 \
  --compiled --json "$OUT/lm_population_0.5b_cuda.json" | tail -2
$PY benchmarks/lm_population_scale.py --device cuda --bf16 --shape 1.5b --members 128 --prompts 8 --repeats 3 \
  --json "$OUT/lm_population_1.5b_cuda.json" | tail -1
# issue 54: an ES step's GPU memory (torch.cuda.max_memory_allocated) against plain inference, Qwen2-0.5B-shaped, bf16
$PY benchmarks/lm_memory_gpu.py --size 0.5B --out runs/mem_gpu
# issue 58: the population on vLLM (each member a LoRA adapter) against plain vLLM on the same rows and against
# transformers' generate(), at 0.5B and 1.5B (Qwen2's shapes, random weights), bf16; where vLLM is installed (the
# GPU build: pip install 'nesgpu[vllm]'; VLLM_PY names another interpreter that has it)
VLLM_PY=${VLLM_PY:-$PY}
if $VLLM_PY -c "import vllm" 2>/dev/null; then
  for size in 0.5b 1.5b; do
    $VLLM_PY benchmarks/vllm_population.py --make-model "$OUT/vllm_$size" --size "$size"
    for population in 32 256; do
      for mode in plain vllm hf; do
        $VLLM_PY benchmarks/vllm_population.py --model "$OUT/vllm_$size" --mode $mode --population $population \
          --dtype bfloat16 --kv-cache-gib 16 --repeats 3 | tail -1 | tee -a "$OUT/vllm_population_cuda.jsonl"
      done
    done
  done
else
  echo "vLLM is not installed for $VLLM_PY: no vLLM rows (pip install 'nesgpu[vllm]')"
fi
