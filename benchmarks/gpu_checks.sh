#!/usr/bin/env bash
# The GPU checks, in parts that each fit one call on a lent GPU machine (10 minutes):
#
#   bash benchmarks/gpu_checks.sh env        # versions, the device, a jaxremat smoke step
#   bash benchmarks/gpu_checks.sh memory     # jax_memory.py: gpt, conv, mlp at GPU sizes
#   bash benchmarks/gpu_checks.sh peak       # the same for gpt with peak_bytes_in_use
#   bash benchmarks/gpu_checks.sh graph      # graph_memory.py at GPU sizes
#   bash benchmarks/gpu_checks.sh memory2    # what session 5's first run of memory left
#   bash benchmarks/gpu_checks.sh profile    # device_profile.py: static vs measured costs
#   bash benchmarks/gpu_checks.sh examples   # the examples with --large
#   bash benchmarks/gpu_checks.sh mlp        # mlp_linen --large alone (after its fix)
#   bash benchmarks/gpu_checks.sh tests      # the JAX-facing tests, on the GPU
#   bash benchmarks/gpu_checks.sh scangpt    # scan_depth.py --gpt: 24 scanned GPT-2 blocks (issue 18.5)
#   bash benchmarks/gpu_checks.sh offload    # offload.py: measured bandwidth, host memory (17.4)
#   bash benchmarks/gpu_checks.sh policies   # policies.py gpt_blocks: step time, compiled temp (17.6)
#   bash benchmarks/gpu_checks.sh policies2  # policies.py gpt and conv, two fractions
#   bash benchmarks/gpu_checks.sh envq       # versions and the device, no demo
#   bash benchmarks/gpu_checks.sh policiesm  # policies.py gpt with costs measured and static (17.6)
#   bash benchmarks/gpu_checks.sh models     # model_budget.py --large: ViT-S/16, ResNet, GPT vs uniform policies
#   bash benchmarks/gpu_checks.sh plus       # policies.py gpt_blocks, default and "dots_plus" menus: step time (17.6)
#
# Each part writes its log to $OUT/<part>.log (or benchmarks/gpu_logs/ when OUT is unset)
# and runs from the repository root with the machine's own JAX (no install: the device has
# no package index). Nothing here changes the device's settings.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/gpu_logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# Several processes share the GPU (the benchmark's fresh-process workers): grow, don't grab.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=${PYTHON:-python3}

step() {  # step <seconds> <command...>: run with a time limit, say how it ended
    local limit=$1
    shift
    echo "+ $*"
    local start=$SECONDS
    timeout "$limit" "$@"
    echo "[exit $? after $((SECONDS - start)) s]"
}

part_env() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    $PY - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("jax", "jaxlib", "flax", "optax", "numpy", "scipy", "numba", "hypothesis"):
    try:
        print(f"{name:<10} {importlib.import_module(name).__version__}")
    except Exception as error:  # noqa: BLE001
        print(f"{name:<10} missing ({error})")
import jax
print("devices", jax.devices(), "memory_stats keys", sorted(jax.devices()[0].memory_stats() or {}))
import jax.numpy as jnp
from jaxremat.measure import costs
f = jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w)))
args = (jnp.ones((256, 256)), jnp.ones((64, 256)))
print("lowered cost_analysis:", jax.jit(f).lower(*args).cost_analysis())
print("compiled cost_analysis flops:", (jax.jit(f).lower(*args).compile().cost_analysis() or {}).get("flops"))
print("lowered_costs:", costs.lowered_costs(f, *args)["flops"], "from", costs.LAST_SOURCE)
EOF
    step 150 $PY -m jaxremat demo
}

part_memory() {  # about 5 minutes: the fresh-process peak column is in part_peak
    local methods=rotor,every_layer,sqrt budgets=0.2,0.35,0.5,0.75,1.0
    step 240 $PY benchmarks/jax_memory.py --model gpt --scale 64 --methods $methods --budgets $budgets --no-peak
    step 120 $PY benchmarks/jax_memory.py --model conv --scale 64 --methods $methods --budgets $budgets --no-peak
    step 150 $PY benchmarks/jax_memory.py --model mlp --scale 256 --methods $methods --budgets $budgets --no-peak
}

part_peak() {  # peak_bytes_in_use of a fresh process per row (about 35 s a row on an H100)
    step 300 $PY benchmarks/jax_memory.py --model gpt --scale 64 --methods rotor --budgets 0.2,0.5,0.75
}

part_memory2() {  # what part_memory's first run left (it hit its time limits), no peak column
    step 150 $PY benchmarks/jax_memory.py --model gpt --scale 64 --methods every_layer,sqrt,rotor \
        --budgets 1.0 --no-peak
    step 150 $PY benchmarks/jax_memory.py --model mlp --scale 256 --methods sqrt,every_layer \
        --budgets 1.0 --no-peak
}

part_graph() {
    step 280 $PY benchmarks/graph_memory.py --models gpt,mlp --scale 64 --shares 0,0.25
}

part_examples() {
    step 130 $PY examples/gpt_nnx.py --large --steps 20 --budget 25%
    step 130 $PY examples/resnet_nnx.py --large --steps 20
    step 70 $PY examples/mlp_linen.py --large --steps 20
    step 150 $PY examples/inception_graph.py --large --steps 10
}

part_profile() {
    step 150 $PY benchmarks/device_profile.py --scale 64
}

part_mlp() {
    step 90 $PY examples/mlp_linen.py --large --steps 40
}

part_tests() {
    step 420 $PY -m pytest -q -p no:cacheprovider -n 0 tests/test_sequence.py tests/test_apply.py \
        tests/test_profile.py tests/test_device.py tests/test_flax_nnx.py tests/test_remat_graph.py
}

part_envq() {  # versions and the device only (part_env without the demo)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    $PY -c "import sys, jax, flax, optax, numba, scipy; print(sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'numba', numba.__version__, 'scipy', scipy.__version__); print(jax.devices(), [m.kind for m in jax.devices()[0].addressable_memories()])"
}

part_scangpt() {
    step 200 $PY benchmarks/scan_depth.py --gpt --gpt-shape 24,512,8,8,256
}

part_offload() {
    step 130 $PY benchmarks/offload.py --model gpt --scale 64 --fractions 0.2,0.3,0.5
}

part_policies() {  # the GPT made of whole blocks: what the issue's claims are about
    step 150 $PY benchmarks/policies.py --models gpt_blocks --scale 32
}

part_policies2() {  # the other stacks, fewer budgets (what a 10-minute call leaves)
    step 120 $PY benchmarks/policies.py --models gpt --scale 64 --fractions 0.25,0.6
    step 100 $PY benchmarks/policies.py --models conv --scale 64 --fractions 0.25,0.6
}

part_policiesm() {  # does a plan made from timed (or roofline) costs close the sublayer stack's step gap?
    step 200 $PY benchmarks/policies.py --models gpt --scale 64 --fractions 0.25 --costs measured
    step 120 $PY benchmarks/policies.py --models gpt --scale 64 --fractions 0.25 --costs static
}

part_models() {  # remat_blocks against nnx.remat(policy) on every block, step time at equal memory
    step 240 $PY benchmarks/model_budget.py --large --models vit
    step 150 $PY benchmarks/model_budget.py --large --models resnet
    step 150 $PY benchmarks/model_budget.py --large --models gpt
}

part_plus() {  # do the searched policies' fewer flops (same tape) give a faster step?
    step 300 $PY benchmarks/policies.py --models gpt_blocks --scale 32 --policies default,plus
}

for part in "${@:-env}"; do
    echo "=== $part"
    "part_$part" 2>&1 | tee "$OUT/$part.log"
done
