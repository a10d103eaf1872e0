"""The meter and the jaxpr cost count give exactly what main's implementation gave (branch
meterfast: the same passes made faster must change no number).

The values in ``tests/meter_identity.json`` were recorded once by running main's
implementation (commit a8de577, before the meterfast changes) on these very programs::

    python tests/test_meter_identity.py --root /work/main        # under each interpreter

which prints one table per JAX version (jaxprs differ between versions; other versions skip).
The structure digests were recorded again in session 18 (branch newshape7: a checkpoint
barrier's structure entry now carries its operands' ranks, as every equation's does, so
that :attr:`jaxremat.measure.costs.CountTerms.operations` can pair terms); every other
value is still main's at a8de577. For each program
they hold: ``program_memory`` with detail (peak, location, number of live values and a digest
of the live values' locations, avals and sizes) with inputs and outputs not counted and with
both counted; ``inputs_read``; ``count_terms`` (totals, number of terms, digests of the flops
and bytes terms and of the structure list they are hashed from), whole and with the last
output skipped. Programs: the gradients of ``benchmarks/policies.py``'s models (gpt, mlp, conv,
gpt_blocks; plain and under uniform checkpoint policies), a scan of checkpointed layers, nested
checkpoints with policies and a jit inside, a ``custom_vjp`` with a ``cond``, a ``while`` loop,
pytree activations, and the vjp forward, pullback, tape and derived (input gradient removed)
jaxprs of a GPT-2 block as the profiler traces them, with their transients and input
dependencies.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = os.path.join(HERE, "..", "benchmarks")

if __name__ == "__main__" and "--root" in sys.argv:  # record mode: measure another checkout
    sys.path.insert(0, os.path.abspath(sys.argv[sys.argv.index("--root") + 1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from jaxremat import program_memory  # noqa: E402
from jaxremat.measure import costs  # noqa: E402
from jaxremat.measure.meter import inputs_read  # noqa: E402
from jaxremat.measure import trace  # noqa: E402
from jaxremat.measure.trace import (input_deps, tape_jaxpr, trace_layer, transients,  # noqa: E402
                                    without_input_grad)


def _digest(value) -> str:
    data = value.tobytes() if isinstance(value, np.ndarray) else repr(value).encode()
    return hashlib.sha1(data).hexdigest()[:12]


def _memory(closed, **kw) -> tuple:
    report = program_memory(closed, detail=True, **kw)
    assert program_memory(closed, **kw) == report.peak
    live = tuple((v.where, v.aval, v.nbytes) for v in report.live)
    return report.peak, report.location, len(report.live), _digest(live)


def _counts(closed, skip: int) -> tuple:
    terms = costs.count_terms(closed, skip)
    live = trace._dead_code_removed(closed, [True] * len(closed.jaxpr.outvars))
    outvars = live.jaxpr.outvars
    skipped = frozenset(v for v in (outvars[len(outvars) - skip:] if skip else ())
                        if isinstance(v, jax.extend.core.Var))
    flops, nbytes, structure = [], [], []
    costs._terms(live.jaxpr, skipped, flops, nbytes, structure)
    assert terms.structure == hash((tuple(structure), len(nbytes)))
    assert list(terms.flops) == flops and list(terms.bytes) == nbytes
    return (terms.totals, len(terms.flops), len(terms.bytes), _digest(terms.flops),
            _digest(terms.bytes), _digest(structure))


def fingerprint(closed) -> dict:
    """What the meter and the count say about one closed jaxpr."""
    reads = "".join("1" if r else "0" for r in inputs_read(closed))
    return {"memory": _memory(closed),
            "memory counted": _memory(closed, exclude_inputs=False, count_outputs=True),
            "reads": reads, "counts": _counts(closed, 0),
            "counts skip 1": _counts(closed, 1) if closed.jaxpr.outvars else None}


# ------------------------------------------------------------------------------ programs


def _policies_models():
    sys.path.insert(0, BENCHMARKS)
    try:
        from jax_memory import _loss, _plain
        from policies import BUILDERS, uniform
    finally:
        sys.path.remove(BENCHMARKS)
    small = {"gpt": lambda: BUILDERS["gpt"](), "mlp": lambda: BUILDERS["mlp"](),
             "conv": lambda: BUILDERS["conv"](),
             "gpt_blocks": lambda: BUILDERS["gpt_blocks"](n_layer=2, n_embd=32, seq=16)}
    programs = {}
    for name, build in small.items():
        layers, params, x = build()
        programs[name] = jax.make_jaxpr(jax.grad(_loss(functools.partial(_plain, layers))))(
            params, x)
        if name in ("gpt_blocks", "mlp"):
            for policy in ("nothing", "dots"):
                from policies import UNIFORM
                run = uniform(layers, UNIFORM[policy])
                programs[f"{name} {policy}"] = jax.make_jaxpr(jax.grad(_loss(run)))(params, x)
    return programs


def _scan():
    def layer(h, w):
        return jnp.tanh(h @ w) + h, None

    def loss(ws, x):
        body = jax.checkpoint(layer, policy=jax.checkpoint_policies.dots_saveable)
        return jnp.sum(jax.lax.scan(body, x, ws)[0] ** 2)

    ws, x = jnp.ones((4, 16, 16)) * 0.1, jnp.ones((8, 16))
    return jax.make_jaxpr(jax.grad(loss))(ws, x)


def _nested():
    def inner(w, x):
        return jax.jit(lambda a: jnp.sin(a @ w))(x) * 2.0

    def outer(w, x):
        h = jax.checkpoint(inner, policy=jax.checkpoint_policies.nothing_saveable)(w, x)
        h = jax.checkpoint(inner, policy=jax.checkpoint_policies.dots_saveable)(w, h)
        return jnp.cos(h @ w)

    def loss(w, x):
        return jnp.sum(jax.checkpoint(outer, prevent_cse=False)(w, x))

    return jax.make_jaxpr(jax.grad(loss))(jnp.ones((16, 16)) * 0.1, jnp.ones((4, 16)))


def _custom_vjp():
    @jax.custom_vjp
    def f(w, x):
        return jnp.tanh(x @ w)

    def f_fwd(w, x):
        y = jnp.tanh(x @ w)
        return y, (w, x, y)

    def f_bwd(res, g):
        w, x, y = res
        g = g * (1 - y ** 2)
        return x.T @ g, g @ w.T

    f.defvjp(f_fwd, f_bwd)

    def loss(w, x):
        h = f(w, x)
        h = jax.lax.cond(jnp.sum(h) > 0, lambda a: jnp.sin(a), lambda a: a * 2.0, h)
        return jnp.sum(f(w, h))

    return jax.make_jaxpr(jax.grad(loss))(jnp.ones((16, 16)) * 0.1, jnp.ones((4, 16)))


def _while():
    def f(w, x):
        def body(c):
            i, h = c
            return i + 1, jnp.tanh(h @ w)
        return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1]

    return jax.make_jaxpr(f)(jnp.ones((16, 16)), jnp.ones((4, 16)))


def _pytree():
    def layer(p, x):
        h = jnp.tanh(x["h"] @ p)
        return {"h": h, "aux": x["aux"] + jnp.sum(h, axis=-1)}

    def loss(ps, x):
        for p in ps:
            x = jax.checkpoint(layer)(p, x)
        return jnp.sum(x["h"]) + jnp.sum(x["aux"])

    ps = [jnp.ones((16, 16)) * 0.1] * 3
    return jax.make_jaxpr(jax.grad(loss))(ps, {"h": jnp.ones((4, 16)), "aux": jnp.zeros(4)})


def _traced_block():
    """The jaxprs of a GPT-2 block's vjp as the profiler traces them, and its transients."""
    sys.path.insert(0, BENCHMARKS)
    try:
        from policies import gpt_blocks_model
    finally:
        sys.path.remove(BENCHMARKS)
    layers, params, x = gpt_blocks_model(n_layer=1, n_embd=32, seq=16)
    p, num_p, num_x = params[0], len(jax.tree.leaves(params[0])), 1
    programs, extra = {}, {}
    for policy in ("everything", "dots"):
        layer = layers[0] if policy == "everything" else jax.checkpoint(
            layers[0], policy=jax.checkpoint_policies.dots_saveable)
        traced = trace_layer(layer, p, x, 0)
        derived = without_input_grad(traced, num_p, num_x)
        for name, t in (("traced", traced), ("derived", derived)):
            key = f"block {policy} {name}"
            programs[f"{key} backward"] = t.backward
            programs[f"{key} tape"] = tape_jaxpr(t)
            programs[f"{key} tape+out"] = tape_jaxpr(t, with_output=True)
            num_out = len(jax.tree.leaves(t.output))
            # (fwd_tmp, bwd_tmp) as recorded; bwd_tmp_freed is new (tests/test_freed_inputs.py)
            extra[key] = (transients(t, num_p, x.size * x.dtype.itemsize)[:2], t.residual_used,
                          input_deps(t.forward, num_out, t.residual_used, num_x), t.tape_bytes)
        programs[f"block {policy} forward"] = traced.forward
    return programs, extra


def record(group: str) -> dict:
    """Every program's fingerprint in ``group``: ``"small"`` (hand-written programs and the
    traced block, with its transients and dependencies) or ``"models"`` (the benchmark
    models' gradients)."""
    if group == "models":
        programs = _policies_models()
        return {name: fingerprint(closed) for name, closed in programs.items()}
    programs = dict(scan=_scan(), nested=_nested(), custom_vjp=_custom_vjp(), loop=_while(),
                    pytree=_pytree())
    block, extra = _traced_block()
    programs.update(block)
    found = {name: fingerprint(closed) for name, closed in programs.items()}
    found["block extras"] = _digest(sorted(extra.items()))
    return found


def _version() -> str:
    return ".".join(jax.__version__.split(".")[:2])


def _recorded() -> dict:
    with open(os.path.join(HERE, "meter_identity.json")) as f:
        return json.load(f)


def _check(group: str) -> None:
    expected = _recorded().get(_version(), {}).get(group)
    if expected is None:
        pytest.skip(f"no values recorded for JAX {jax.__version__}")
    found = json.loads(json.dumps(record(group)))  # tuples as the file holds them: lists
    assert set(found) == set(expected)
    for name in expected:
        assert found[name] == expected[name], name


def test_meter_and_counts_identical_to_main():
    """Hand-written programs (scan, nested checkpoints with policies, custom_vjp with a cond,
    while, pytree activations) and a traced GPT-2 block: every number equals main's."""
    _check("small")


@pytest.mark.slow
def test_meter_and_counts_identical_to_main_on_models():
    """The gradients of benchmarks/policies.py's models (gpt, mlp, conv, gpt_blocks; plain
    and under uniform policies): every number equals main's."""
    _check("models")


if __name__ == "__main__":
    print(json.dumps({_version(): {group: record(group) for group in ("small", "models")}},
                     indent=1, sort_keys=True))
