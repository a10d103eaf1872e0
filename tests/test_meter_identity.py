"""The meter and the jaxpr cost count give exactly what main's implementation gave (branch
meterfast: the same passes made faster must change no number).

The values in :data:`RECORDED` were recorded once by running main's implementation (commit
a8de577, before the meterfast changes) on these very programs::

    python tests/test_meter_identity.py --root /work/main        # under each interpreter

and pasted here, one table per JAX version (jaxprs differ between versions). For each program
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
    live = costs._dead_code_removed(closed, [True] * len(closed.jaxpr.outvars))
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
            extra[key] = (transients(t, num_p, x.size * x.dtype.itemsize), t.residual_used,
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


def _check(group: str) -> None:
    expected = RECORDED.get(_version(), {}).get(group)
    if expected is None:
        pytest.skip(f"no values recorded for JAX {jax.__version__}")
    found = record(group)
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
    import pprint

    print(f"{_version()!r}: ", end="")
    pprint.pprint({group: record(group) for group in ("small", "models")}, width=100,
                  sort_dicts=True)


RECORDED: dict[str, dict] = {
    '0.10': {
        'small': {
            'block dots derived backward': {
                'counts': ((3712065.0, 4099182.0), 188, 481, 'dbe973f3d3bb', 'a68fcdfe9f58', 'bf65502fc08a'),
                'counts skip 1': ((3712065.0, 4099182.0), 188, 481, 'dbe973f3d3bb', 'a68fcdfe9f58', 'bf65502fc08a'),
                'memory': (351104, ((0, 'remat2'), (83, 'mul')), 26, 'e0d9ad783787'),
                'memory counted': (408576, ((0, 'remat2'), (83, 'mul')), 32, 'e37b88fa601b'),
                'reads': '111111111111111111',
            },
            'block dots derived tape': {
                'counts': ((1260033.0, 1072690.0), 78, 190, '7a93a0c226bb', '9521056051bd', '7780ad01b0f0'),
                'counts skip 1': ((1251841.0, 1007154.0), 77, 188, '091f564ab252', '39683a819566', 'e5517a13ee66'),
                'memory': (61440, ((33, 'jit'), (3, 'select_n')), 5, '1bc79f103ebe'),
                'memory counted': (181760, ((69, 'reduce_precision'),), 18, '1e334fad5f4d'),
                'reads': '1111111111011',
            },
            'block dots derived tape+out': {
                'counts': ((1862145.0, 1828290.0), 92, 228, 'ef30065b73bb', 'f80ca783f783', '1810eaeca474'),
                'counts skip 1': ((1853953.0, 1762754.0), 91, 226, 'cdf26235918d', 'a6f510b3f6db', '2fc0140078e3'),
                'memory': (106496, ((73, 'mul'),), 4, '5bca195b615d'),
                'memory counted': (255616, ((73, 'mul'),), 22, 'c890fa7be413'),
                'reads': '1111111111111',
            },
            'block dots forward': {
                'counts': ((1862145.0, 1828290.0), 92, 228, 'ef30065b73bb', 'f80ca783f783', '1810eaeca474'),
                'counts skip 1': ((1853953.0, 1762754.0), 91, 226, 'cdf26235918d', 'a6f510b3f6db', '2fc0140078e3'),
                'memory': (106496, ((73, 'mul'),), 4, '5bca195b615d'),
                'memory counted': (255616, ((73, 'mul'),), 22, 'c890fa7be413'),
                'reads': '1111111111111',
            },
            'block dots traced backward': {
                'counts': ((3735362.0, 4378114.0), 217, 553, '8c9d700b1657', 'c4d364907a1a', '98ec34b23562'),
                'counts skip 1': ((3735361.0, 4369918.0), 216, 551, '90c71d22f03c', '66e6c79d3586', '2a3f26f12289'),
                'memory': (368384, ((0, 'remat2'), (86, 'mul')), 32, 'd7763f343def'),
                'memory counted': (425856, ((0, 'remat2'), (86, 'mul')), 38, '325a13181734'),
                'reads': '111111111111111111',
            },
            'block dots traced tape': {
                'counts': ((1260033.0, 1072690.0), 78, 190, '7a93a0c226bb', '9521056051bd', '7780ad01b0f0'),
                'counts skip 1': ((1251841.0, 1007154.0), 77, 188, '091f564ab252', '39683a819566', 'e5517a13ee66'),
                'memory': (61440, ((33, 'jit'), (3, 'select_n')), 5, '1bc79f103ebe'),
                'memory counted': (181760, ((69, 'reduce_precision'),), 18, '1e334fad5f4d'),
                'reads': '1111111111011',
            },
            'block dots traced tape+out': {
                'counts': ((1862145.0, 1828290.0), 92, 228, 'ef30065b73bb', 'f80ca783f783', '1810eaeca474'),
                'counts skip 1': ((1853953.0, 1762754.0), 91, 226, 'cdf26235918d', 'a6f510b3f6db', '2fc0140078e3'),
                'memory': (106496, ((73, 'mul'),), 4, '5bca195b615d'),
                'memory counted': (255616, ((73, 'mul'),), 22, 'c890fa7be413'),
                'reads': '1111111111111',
            },
            'block everything derived backward': {
                'counts': ((3553472.0, 2364956.0), 103, 253, 'c1f84e365947', 'd66e0a9d3218', '93c553138694'),
                'counts skip 1': ((3553472.0, 2364956.0), 102, 251, '7cf397960dcd', '43377c970f9e', 'b15bfe379642'),
                'memory': (131072, ((11, 'add_any'),), 4, 'c12e87ded15a'),
                'memory counted': (409356, (), 40, '51481d5058b4'),
                'reads': '1111000000111111011111111111111111111111',
            },
            'block everything derived tape': {
                'counts': ((1338241.0, 1765458.0), 90, 225, '031ca6835e8a', '691d1ba71b2f', '4850b9b65280'),
                'counts skip 1': ((1330049.0, 1667154.0), 89, 222, '7c721734b28f', 'f4b38432955b', '2e431d95e3a6'),
                'memory': (65536, ((72, 'integer_pow'),), 2, 'b9ecb35a49f0'),
                'memory counted': (367488, ((80, 'mul'),), 29, 'c8ecc4b23ac8'),
                'reads': '1111111111011',
            },
            'block everything derived tape+out': {
                'counts': ((1866625.0, 1864146.0), 94, 236, '3ad20a88dc3d', 'c0be083e5c97', 'f178eaba8eaf'),
                'counts skip 1': ((1858433.0, 1765842.0), 93, 233, '2423992af984', 'aa0540130e01', 'd3eabe78642a'),
                'memory': (73728, ((72, 'integer_pow'),), 3, '08f37e07a688'),
                'memory counted': (392192, ((84, 'add'),), 33, 'd455b0fc91ce'),
                'reads': '1111111111111',
            },
            'block everything forward': {
                'counts': ((1868801.0, 1897950.0), 98, 246, 'e83a562bd965', '91843b7d7f53', '3e1b1c4f1045'),
                'counts skip 1': ((1860609.0, 1799646.0), 97, 243, '2b29037b8f9b', 'aaa2bc6701ab', 'af1b8a82708f'),
                'memory': (73728, ((88, 'integer_pow'),), 3, '64fb15d79092'),
                'memory counted': (425856, ((100, 'add'),), 40, '5812f8060a0f'),
                'reads': '1111111111111',
            },
            'block everything traced backward': {
                'counts': ((3574593.0, 2626472.0), 129, 317, '5e17867b3804', '2767376f0388', '63da3f1853f8'),
                'counts skip 1': ((3574592.0, 2618276.0), 128, 315, 'e168ede6b53c', '1c6e0c40b381', '8f69b71fe560'),
                'memory': (131072, ((11, 'add_any'),), 4, 'c12e87ded15a'),
                'memory counted': (425868, ((6, 'mul'),), 41, 'e2be906b6c25'),
                'reads': '1111111111111111011111111111111111111111',
            },
            'block everything traced tape': {
                'counts': ((1340417.0, 1782874.0), 93, 233, '1fa899dc47b9', 'dee59a0574ec', 'd7564792150d'),
                'counts skip 1': ((1332225.0, 1684570.0), 92, 230, '6d62998d1d99', '68a7f31c733e', 'daa422f82556'),
                'memory': (65536, ((75, 'integer_pow'),), 2, '69dc12aaa1fa'),
                'memory counted': (384768, ((83, 'mul'),), 35, 'bc7f16dd1969'),
                'reads': '1111111111011',
            },
            'block everything traced tape+out': {
                'counts': ((1868801.0, 1881562.0), 97, 244, '02a8f69a7c82', '0626fe209a78', '4e9f9eb19d8f'),
                'counts skip 1': ((1860609.0, 1783258.0), 96, 241, 'bf7caf4ec1e1', 'dcd1e3ce192e', '484ad63856e5'),
                'memory': (73728, ((75, 'integer_pow'),), 3, 'a8e2b1d6acf9'),
                'memory counted': (409472, ((87, 'add'),), 39, 'fdf3564c0320'),
                'reads': '1111111111111',
            },
            'block extras': '8f6c67896837',
            'custom_vjp': {
                'counts': ((11203.0, 17446.0), 23, 61, 'e8364fc08811', 'c08d0f435a12', 'd010df4bc339'),
                'counts skip 1': ((10947.0, 14374.0), 22, 58, 'c127464bea4a', '45efde74630b', '19ad7c8b56d3'),
                'memory': (3584, ((24, 'dot_general'),), 5, 'd4b88c0908e6'),
                'memory counted': (4356, ((16, 'dot_general'),), 9, 'a72e78dc59e3'),
                'reads': '11',
            },
            'loop': {
                'counts': ((65.0, 1544.0), 1, 5, '64d39082515f', 'e939cdb1b69f', 'a379c15de692'),
                'counts skip 1': ((65.0, 1544.0), 1, 5, '64d39082515f', 'e939cdb1b69f', 'a379c15de692'),
                'memory': (264, ((0, 'while'), (1, 'dot_general')), 3, 'a256f04e1997'),
                'memory counted': (2056, ((0, 'while'), (2, 'tanh')), 7, '4f5e2da5f71f'),
                'reads': '11',
            },
            'nested': {
                'counts': ((19776.0, 30996.0), 28, 81, '13cfe6941a6a', '02a26424608d', 'db8877d93379'),
                'counts skip 1': ((0.0, 260.0), 1, 2, '05fe40575316', 'e97633deb6db', '8026f1c2e190'),
                'memory': (3328, ((6, 'remat2'), (11, 'remat2'), (2, 'jit'), (2, 'transpose')), 4, 'cfe2ccc99b12'),
                'memory counted': (4608, ((6, 'remat2'), (11, 'remat2'), (2, 'jit'), (2, 'transpose')), 6, '6720ce933e8a'),
                'reads': '11',
            },
            'pytree': {
                'counts': ((21760.0, 34436.0), 38, 113, '84a61a14e43a', 'abc8d835ae94', '40102f434153'),
                'counts skip 1': ((21760.0, 34436.0), 38, 113, '84a61a14e43a', 'abc8d835ae94', '40102f434153'),
                'memory': (1808, ((17, 'remat2'), (4, 'add_any')), 8, 'fa2c709813a4'),
                'memory counted': (5904, ((17, 'remat2'), (9, 'transpose')), 9, 'e78c06cfb86d'),
                'reads': '11111',
            },
            'scan': {
                'counts': ((13696.0, 23564.0), 16, 47, '5ed24fa9ddb0', 'c1125a3305e8', '69157919a985'),
                'counts skip 1': ((13696.0, 23564.0), 16, 47, '5ed24fa9ddb0', 'c1125a3305e8', '69157919a985'),
                'memory': (6656, ((7, 'scan'), (0, 'remat2'), (2, 'mul')), 7, '981e9235f88c'),
                'memory counted': (15872, ((7, 'scan'), (0, 'remat2'), (6, 'transpose')), 9, '9eb03c4ceada'),
                'reads': '11',
            },
        },
        'models': {
            'conv': {
                'counts': ((2085280608.0, 125703216.0), 279, 737, '072226c97997', 'd1d02de276bb', '186e30d2c704'),
                'counts skip 1': ((2085280608.0, 125703216.0), 278, 735, 'd7a955e2db3e', '55cc90abc606', '660ef5cc39f2'),
                'memory': (7798784, ((136, 'select_n'),), 40, '6d4eb81c7b5f'),
                'memory counted': (8978944, ((136, 'select_n'),), 62, '3f5419e04bcb'),
                'reads': '111111111111111111111111111111111111111111',
            },
            'gpt': {
                'counts': ((4230489654.0, 948147059.0), 1330, 3373, '890007452b39', '24c13b041c09', '9d70ef3b0909'),
                'counts skip 1': ((4230489654.0, 948147059.0), 1329, 3371, '36de1798bf03', 'fc66f0653fe5', '022f6f62fcc8'),
                'memory': (71714359, ((495, 'mul'),), 193, 'e0487069857f'),
                'memory counted': (76432951, ((495, 'mul'),), 217, 'dd1d5f6b2c26'),
                'reads': '1111111111111111111111111111111111111111111111111111111',
            },
            'gpt_blocks': {
                'counts': ((10335106.0, 8638448.0), 419, 1039, '047f6764572a', 'ee3bd0c0581e', '792e0ba2369a'),
                'counts skip 1': ((10335106.0, 8638448.0), 418, 1037, '1e1f12d36b36', '8cd459a81bf2', 'de67c4b933b3'),
                'memory': (694912, ((209, 'mul'),), 58, '5f133ce99479'),
                'memory counted': (793344, ((209, 'mul'),), 67, 'd191c9e53a80'),
                'reads': '1111111111111111111111111',
            },
            'gpt_blocks dots': {
                'counts': ((10569604.0, 11378276.0), 575, 1452, '997f9d823d4b', '404ddcbc3a01', 'afbca9be8a03'),
                'counts skip 1': ((10569604.0, 11378276.0), 575, 1452, '997f9d823d4b', '404ddcbc3a01', 'afbca9be8a03'),
                'memory': (466688, ((170, 'remat2'), (86, 'mul')), 38, '0edda3328ec5'),
                'memory counted': (574848, ((170, 'remat2'), (86, 'mul')), 55, '3ac85c53031d'),
                'reads': '1111111111111111111111111',
            },
            'gpt_blocks nothing': {
                'counts': ((11646339.0, 10321970.0), 502, 1272, '2c28c1bccdfb', 'aba1e8776be8', '8529a6e970e9'),
                'counts skip 1': ((11646339.0, 10321970.0), 502, 1272, '2c28c1bccdfb', 'aba1e8776be8', '8529a6e970e9'),
                'memory': (376576, ((160, 'remat2'), (91, 'mul')), 33, 'd6c5c2ed74af'),
                'memory counted': (484736, ((160, 'remat2'), (91, 'mul')), 50, '9f4dceae4d61'),
                'reads': '1111111111111111111111111',
            },
            'mlp': {
                'counts': ((3216643328.0, 428281435.0), 1552, 4013, 'a587e86acca4', '254096270e74', '468676128cbc'),
                'counts skip 1': ((3216643328.0, 428281435.0), 1551, 4011, 'da66799a6b5f', '0c95f7912345', '5e0bdbb0f9de'),
                'memory': (30366283, ((480, 'dot_general'),), 235, '23273e186d6b'),
                'memory counted': (64707147, ((481, 'transpose'),), 267, 'ffe21f4f8ff8'),
                'reads': '111111111111111111111111111111111111111111111111111111111111111111111111111111111',
            },
            'mlp dots': {
                'counts': ((3228121408.0, 571376363.0), 2118, 5586, '259890e2e120', '7d3b199472f2', 'e922d444bce1'),
                'counts skip 1': ((3228121408.0, 571376363.0), 2118, 5586, '259890e2e120', '7d3b199472f2', 'e922d444bce1'),
                'memory': (7800325, ((418, 'remat2'), (27, 'dot_general')), 46, 'df8299459d56'),
                'memory counted': (42298885, ((418, 'remat2'), (28, 'transpose')), 124, '92bada4152c7'),
                'reads': '111111111111111111111111111111111111111111111111111111111111111111111111111111111',
            },
            'mlp nothing': {
                'counts': ((3730290428.0, 578441393.0), 2092, 5520, '32923dc6e0e4', 'ae880bfdf906', 'eff51a821c46'),
                'counts skip 1': ((3730290428.0, 578441393.0), 2092, 5520, '32923dc6e0e4', 'ae880bfdf906', 'eff51a821c46'),
                'memory': (3868165, ((402, 'remat2'), (28, 'dot_general')), 31, '63c4dafed66c'),
                'memory counted': (38366725, ((402, 'remat2'), (29, 'transpose')), 109, '987b2360be83'),
                'reads': '111111111111111111111111111111111111111111111111111111111111111111111111111111111',
            },
        },
    },
    '0.12': {
        'small': {
            'block dots derived backward': {
                'counts': ((3695681.0, 3902570.0), 186, 474, '66e1cfca4665', '4e2a7d599dce', '624c1464eb20'),
                'counts skip 1': ((3695681.0, 3902570.0), 186, 474, '66e1cfca4665', '4e2a7d599dce', '624c1464eb20'),
                'memory': (318336, ((0, 'remat2'), (83, 'mul')), 25, 'f1ce5b642517'),
                'memory counted': (375808, ((0, 'remat2'), (83, 'mul')), 31, '5e90b4edff91'),
                'reads': '111111111111111111',
            },
            'block dots derived tape': {
                'counts': ((1260033.0, 1072690.0), 78, 190, '7a93a0c226bb', '9521056051bd', '7780ad01b0f0'),
                'counts skip 1': ((1251841.0, 1007154.0), 77, 188, '091f564ab252', '39683a819566', 'e5517a13ee66'),
                'memory': (61440, ((33, 'jit'), (3, 'select_n')), 5, '1bc79f103ebe'),
                'memory counted': (181760, ((69, 'reduce_precision'),), 18, '1e334fad5f4d'),
                'reads': '1111111111011',
            },
            'block dots derived tape+out': {
                'counts': ((1862145.0, 1828290.0), 92, 228, 'ef30065b73bb', 'f80ca783f783', '1810eaeca474'),
                'counts skip 1': ((1853953.0, 1762754.0), 91, 226, 'cdf26235918d', 'a6f510b3f6db', '2fc0140078e3'),
                'memory': (106496, ((73, 'mul'),), 4, '5bca195b615d'),
                'memory counted': (255616, ((73, 'mul'),), 22, 'c890fa7be413'),
                'reads': '1111111111111',
            },
            'block dots forward': {
                'counts': ((1862145.0, 1828290.0), 92, 228, 'ef30065b73bb', 'f80ca783f783', '1810eaeca474'),
                'counts skip 1': ((1853953.0, 1762754.0), 91, 226, 'cdf26235918d', 'a6f510b3f6db', '2fc0140078e3'),
                'memory': (106496, ((73, 'mul'),), 4, '5bca195b615d'),
                'memory counted': (255616, ((73, 'mul'),), 22, 'c890fa7be413'),
                'reads': '1111111111111',
            },
            'block dots traced backward': {
                'counts': ((3718978.0, 4181502.0), 215, 546, '295b4a8d6499', '620fa687bd77', '79ea973ab0ca'),
                'counts skip 1': ((3718977.0, 4173306.0), 214, 544, '5adccf19631d', '7e03fdc39981', '4d5032d5fde3'),
                'memory': (335616, ((0, 'remat2'), (86, 'mul')), 31, 'fee3fbf0dff6'),
                'memory counted': (393088, ((0, 'remat2'), (86, 'mul')), 37, '40a308c262ba'),
                'reads': '111111111111111111',
            },
            'block dots traced tape': {
                'counts': ((1260033.0, 1072690.0), 78, 190, '7a93a0c226bb', '9521056051bd', '7780ad01b0f0'),
                'counts skip 1': ((1251841.0, 1007154.0), 77, 188, '091f564ab252', '39683a819566', 'e5517a13ee66'),
                'memory': (61440, ((33, 'jit'), (3, 'select_n')), 5, '1bc79f103ebe'),
                'memory counted': (181760, ((69, 'reduce_precision'),), 18, '1e334fad5f4d'),
                'reads': '1111111111011',
            },
            'block dots traced tape+out': {
                'counts': ((1862145.0, 1828290.0), 92, 228, 'ef30065b73bb', 'f80ca783f783', '1810eaeca474'),
                'counts skip 1': ((1853953.0, 1762754.0), 91, 226, 'cdf26235918d', 'a6f510b3f6db', '2fc0140078e3'),
                'memory': (106496, ((73, 'mul'),), 4, '5bca195b615d'),
                'memory counted': (255616, ((73, 'mul'),), 22, 'c890fa7be413'),
                'reads': '1111111111111',
            },
            'block everything derived backward': {
                'counts': ((3537088.0, 2168348.0), 101, 247, '5c81953524a1', 'a2490c42fbbd', '63b246b6e394'),
                'counts skip 1': ((3537088.0, 2168348.0), 100, 245, 'f16842bf7c8e', '63ceebfdecf2', 'e0ff53ff363f'),
                'memory': (98304, ((7, 'mul'),), 3, 'db9cd0f36edb'),
                'memory counted': (376588, (), 39, '8da05526d6bd'),
                'reads': '111100000011111101111111111111111111111',
            },
            'block everything derived tape': {
                'counts': ((1338241.0, 1765454.0), 90, 224, '031ca6835e8a', '7fcab19e94d5', 'c1fe3daf720b'),
                'counts skip 1': ((1330049.0, 1667150.0), 89, 221, '7c721734b28f', '4a743618a3e3', 'c77ccfdd8810'),
                'memory': (65536, ((72, 'integer_pow'),), 2, 'b9ecb35a49f0'),
                'memory counted': (334720, ((79, 'add'),), 28, '23d7d586279c'),
                'reads': '1111111111011',
            },
            'block everything derived tape+out': {
                'counts': ((1866625.0, 1864142.0), 94, 235, '3ad20a88dc3d', '6f0f96f8383e', 'ee824a3e1444'),
                'counts skip 1': ((1858433.0, 1765838.0), 93, 232, '2423992af984', '61187236a77c', '6c5865cc0fac'),
                'memory': (73728, ((72, 'integer_pow'),), 3, '08f37e07a688'),
                'memory counted': (359424, ((84, 'add'),), 32, 'f2227a4ec32d'),
                'reads': '1111111111111',
            },
            'block everything forward': {
                'counts': ((1868801.0, 1897946.0), 98, 245, 'e83a562bd965', '2aa6a73cbf0b', '2c44f09f6a4e'),
                'counts skip 1': ((1860609.0, 1799642.0), 97, 242, '2b29037b8f9b', '6743fd0b530e', 'b6646556c4f1'),
                'memory': (73728, ((86, 'integer_pow'),), 3, '3cebc56f5484'),
                'memory counted': (393088, ((98, 'add'),), 39, '56eb653ccc1c'),
                'reads': '1111111111111',
            },
            'block everything traced backward': {
                'counts': ((3558209.0, 2429864.0), 127, 311, '967c95e266ce', '5a45546148a6', '233c14ea97f3'),
                'counts skip 1': ((3558208.0, 2421668.0), 126, 309, '397e20782fb8', 'a3eb9fdeac00', 'b0ed28795a46'),
                'memory': (98304, ((7, 'mul'),), 3, 'db9cd0f36edb'),
                'memory counted': (393100, ((6, 'mul'),), 40, 'aa223276d7b3'),
                'reads': '111111111111111101111111111111111111111',
            },
            'block everything traced tape': {
                'counts': ((1340417.0, 1782870.0), 93, 232, '1fa899dc47b9', '4993cc399a23', '759788ea91fc'),
                'counts skip 1': ((1332225.0, 1684566.0), 92, 229, '6d62998d1d99', 'adb29ab68011', '05d533296c2b'),
                'memory': (65536, ((75, 'integer_pow'),), 2, '69dc12aaa1fa'),
                'memory counted': (352000, ((82, 'add'),), 34, '6daab5606eb0'),
                'reads': '1111111111011',
            },
            'block everything traced tape+out': {
                'counts': ((1868801.0, 1881558.0), 97, 243, '02a8f69a7c82', '8fec3d3c8359', 'a3e6dad1ecfa'),
                'counts skip 1': ((1860609.0, 1783254.0), 96, 240, 'bf7caf4ec1e1', '16c0270b8d3e', 'fbff1bdc1201'),
                'memory': (73728, ((75, 'integer_pow'),), 3, 'a8e2b1d6acf9'),
                'memory counted': (376704, ((87, 'add'),), 38, '3b6954e7525b'),
                'reads': '1111111111111',
            },
            'block extras': 'b4e44d974be8',
            'custom_vjp': {
                'counts': ((11203.0, 17446.0), 23, 61, 'e8364fc08811', 'c08d0f435a12', 'd010df4bc339'),
                'counts skip 1': ((10947.0, 14374.0), 22, 58, 'c127464bea4a', '45efde74630b', '19ad7c8b56d3'),
                'memory': (3584, ((24, 'dot_general'),), 5, 'd4b88c0908e6'),
                'memory counted': (4356, ((16, 'dot_general'),), 9, 'a72e78dc59e3'),
                'reads': '11',
            },
            'loop': {
                'counts': ((65.0, 1544.0), 1, 5, '64d39082515f', 'e939cdb1b69f', 'a379c15de692'),
                'counts skip 1': ((65.0, 1544.0), 1, 5, '64d39082515f', 'e939cdb1b69f', 'a379c15de692'),
                'memory': (264, ((0, 'while'), (1, 'dot_general')), 3, 'a256f04e1997'),
                'memory counted': (2056, ((0, 'while'), (2, 'tanh')), 7, '4f5e2da5f71f'),
                'reads': '11',
            },
            'nested': {
                'counts': ((19776.0, 30996.0), 28, 81, '13cfe6941a6a', '02a26424608d', 'db8877d93379'),
                'counts skip 1': ((0.0, 260.0), 1, 2, '05fe40575316', 'e97633deb6db', '8026f1c2e190'),
                'memory': (3328, ((6, 'remat2'), (11, 'remat2'), (2, 'jit'), (2, 'transpose')), 4, 'cfe2ccc99b12'),
                'memory counted': (4608, ((6, 'remat2'), (11, 'remat2'), (2, 'jit'), (2, 'transpose')), 6, '6720ce933e8a'),
                'reads': '11',
            },
            'pytree': {
                'counts': ((21376.0, 29816.0), 32, 92, '1664bec4a1f0', 'c24f1c3a652c', '66ea66ce7c76'),
                'counts skip 1': ((21376.0, 29816.0), 32, 92, '1664bec4a1f0', 'c24f1c3a652c', '66ea66ce7c76'),
                'memory': (1808, ((17, 'remat2'), (6, 'dot_general')), 5, '94b574d61112'),
                'memory counted': (5904, ((17, 'remat2'), (7, 'transpose')), 9, '099f76584266'),
                'reads': '11111',
            },
            'scan': {
                'counts': ((13440.0, 20488.0), 14, 40, '1cd330931a43', '1fb8a42e3c38', '59886cc8cb38'),
                'counts skip 1': ((13440.0, 20488.0), 14, 40, '1cd330931a43', '1fb8a42e3c38', '59886cc8cb38'),
                'memory': (6656, ((7, 'scan'), (0, 'remat2'), (3, 'dot_general')), 6, 'c8d6cc70c069'),
                'memory counted': (15872, ((7, 'scan'), (0, 'remat2'), (4, 'transpose')), 9, '4a23c7b0fac7'),
                'reads': '11',
            },
        },
        'models': {
            'conv': {
                'counts': ((2085280608.0, 125703216.0), 279, 737, '072226c97997', 'd1d02de276bb', '186e30d2c704'),
                'counts skip 1': ((2085280608.0, 125703216.0), 278, 735, 'd7a955e2db3e', '55cc90abc606', '660ef5cc39f2'),
                'memory': (7798784, ((136, 'select_n'),), 40, '6d4eb81c7b5f'),
                'memory counted': (8978944, ((136, 'select_n'),), 62, '3f5419e04bcb'),
                'reads': '111111111111111111111111111111111111111111',
            },
            'gpt': {
                'counts': ((4227343926.0, 910398299.0), 1318, 3331, '5f54e5fae284', 'c5d2e10b8648', '99d53d35a563'),
                'counts skip 1': ((4227343926.0, 910398299.0), 1317, 3329, '60de22039f48', '0e9550719c29', 'bf94536481cb'),
                'memory': (65422903, ((483, 'mul'),), 187, '5c16cfafa27d'),
                'memory counted': (70141495, ((483, 'mul'),), 211, '04f219df6f05'),
                'reads': '1111111111111111111111111111111111111111111111111111111',
            },
            'gpt_blocks': {
                'counts': ((10302338.0, 8245224.0), 415, 1025, '6e019e11ee87', 'f7eaac8c3bcc', 'd7697b03d9a0'),
                'counts skip 1': ((10302338.0, 8245224.0), 414, 1023, 'ec6732011af0', '93fdaee54e73', '4410a82895a1'),
                'memory': (629376, ((205, 'mul'),), 56, '3a6be9dc1657'),
                'memory counted': (727808, ((205, 'mul'),), 65, '2e9550d1988c'),
                'reads': '1111111111111111111111111',
            },
            'gpt_blocks dots': {
                'counts': ((10536836.0, 10985052.0), 571, 1438, '43ae58af6714', 'f77cdae8c23a', '825a12952900'),
                'counts skip 1': ((10536836.0, 10985052.0), 571, 1438, '43ae58af6714', 'f77cdae8c23a', '825a12952900'),
                'memory': (433920, ((170, 'remat2'), (86, 'mul')), 37, '0da6ed79ad72'),
                'memory counted': (542080, ((170, 'remat2'), (86, 'mul')), 54, '41b7c7a38c8e'),
                'reads': '1111111111111111111111111',
            },
            'gpt_blocks nothing': {
                'counts': ((11613571.0, 9928746.0), 498, 1258, '8111895d0052', '92f83e39cd4c', '8730bdfbe7de'),
                'counts skip 1': ((11613571.0, 9928746.0), 498, 1258, '8111895d0052', '92f83e39cd4c', '8730bdfbe7de'),
                'memory': (343808, ((160, 'remat2'), (91, 'mul')), 32, 'bcfde49c92bf'),
                'memory counted': (451968, ((160, 'remat2'), (91, 'mul')), 49, 'f2d253115c02'),
                'reads': '1111111111111111111111111',
            },
            'mlp': {
                'counts': ((3214546176.0, 403115547.0), 1520, 3901, 'b16a016000ed', '83ca174ec15b', '257d0712b447'),
                'counts skip 1': ((3214546176.0, 403115547.0), 1519, 3899, 'a398dcee9120', 'bda5f41ea614', '9b6a0ac8b015'),
                'memory': (26171979, ((480, 'dot_general'),), 219, 'c6858d5158eb'),
                'memory counted': (60512843, ((481, 'transpose'),), 251, '50c08c2f8a09'),
                'reads': '111111111111111111111111111111111111111111111111111111111111111111111111111111111',
            },
            'mlp dots': {
                'counts': ((3226024256.0, 546210475.0), 2086, 5474, '7394eca67185', 'ca90639dcbaf', '8603a925b16d'),
                'counts skip 1': ((3226024256.0, 546210475.0), 2086, 5474, '7394eca67185', 'ca90639dcbaf', '8603a925b16d'),
                'memory': (7538181, ((418, 'remat2'), (27, 'dot_general')), 45, '5227cc9894ed'),
                'memory counted': (42036741, ((418, 'remat2'), (28, 'transpose')), 123, '40c5bed29df0'),
                'reads': '111111111111111111111111111111111111111111111111111111111111111111111111111111111',
            },
            'mlp nothing': {
                'counts': ((3728193276.0, 553275505.0), 2060, 5408, '87662cf329dc', '590e1b4c0619', 'f3b38a0d4b09'),
                'counts skip 1': ((3728193276.0, 553275505.0), 2060, 5408, '87662cf329dc', '590e1b4c0619', 'f3b38a0d4b09'),
                'memory': (3606021, ((402, 'remat2'), (28, 'dot_general')), 30, '0084707e3544'),
                'memory counted': (38104581, ((402, 'remat2'), (29, 'transpose')), 108, 'acdaeb693a3d'),
                'reads': '111111111111111111111111111111111111111111111111111111111111111111111111111111111',
            },
        },
    },
}
