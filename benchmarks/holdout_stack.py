"""A stack written for checking the profile, not for the library: dense pre-norm blocks whose
activation is a pytree ``{"h", "skip"}`` (no backward reads ``skip``).

    python benchmarks/holdout_stack.py

Prints, on the running JAX version, the no-remat memory and, for rotor and every_layer at
35/50/75% of it: measured memory (program order, ``activation_memory``) as a share of no remat
and of the plan's prediction, the flops of ``jax.value_and_grad`` (``cost_analysis``) and the
predicted time, both relative to no remat. ``benchmarks/RESULTS.md`` ("JAX versions") compares
JAX 0.10 with 0.12 on it.
"""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import sys, jax, jax.numpy as jnp, numpy as np
import jaxremat
from jaxremat.measure.costs import lowered_costs
jax.config.update("jax_default_matmul_precision", "highest")
B, D, L = 64, 256, 8
rng = np.random.default_rng(0)
def norm(h, g):
    m = h.mean(-1, keepdims=True); v = ((h - m) ** 2).mean(-1, keepdims=True)
    return (h - m) * jax.lax.rsqrt(v + 1e-5) * g
def block(p, xs):
    h, skip = xs["h"], xs["skip"]
    u = jax.nn.gelu(norm(h, p["g"]) @ p["w1"])
    h2 = h + jnp.tanh(u @ p["w2"])
    return {"h": h2, "skip": 0.5 * skip + h2}
params = [{"g": jnp.ones(D), "w1": jnp.asarray(rng.standard_normal((D, 2 * D)) / 16, jnp.float32),
           "w2": jnp.asarray(rng.standard_normal((2 * D, D)) / 22, jnp.float32)} for _ in range(L)]
x = {"h": jnp.asarray(rng.standard_normal((B, D)), jnp.float32), "skip": jnp.zeros((B, D))}
def plain(ps, x):
    for p in ps: x = block(p, x)
    return jnp.sum(x["h"] ** 2) + jnp.sum(x["skip"])
flops = lambda f: lowered_costs(jax.value_and_grad(f), params, x)["flops"]
base_mem, base_flops = jaxremat.activation_memory(plain, params, x), flops(plain)
print(f"JAX {jax.__version__}: no remat {base_mem / 2**20:.2f} MiB (program order)")
for method in ("rotor", "every_layer"):
  for share in (0.35, 0.5, 0.75):
    try:
        seq = jaxremat.remat_sequence([block] * L, int(share * base_mem), method=method)
        plan = seq.plan(params, x)
    except Exception as e:
        print(f"  {method:12s} {share:.0%}: {type(e).__name__}"); continue
    f = lambda ps, x: (lambda y: jnp.sum(y["h"] ** 2) + jnp.sum(y["skip"]))(seq(ps, x))
    m = jaxremat.activation_memory(f, params, x)
    print(f"  {method:12s} {share:.0%}: measured {m / base_mem:.3f} of no remat, measured/predicted "
          f"{m / plan.predicted_peak:.3f}, flops {flops(f) / base_flops:.4f}x, predicted time {plan.predicted_time / plan.no_remat_time:.4f}x")
