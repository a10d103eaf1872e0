"""Bad input gets a ValueError or TypeError whose message names the problem, at the call
that receives it (not deep inside numpy, JAX or HiGHS), and no silent wrong answer."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax import linen as nn

import jaxremat
import solver
from solver.compare import compare_methods
from jaxremat.flax import RematModule, RematSequential, remat_blocks
from jaxremat.flax.linen import RematSequential as LinenSequential

CHAIN = solver.Chain([1.0] * 3, [2.0] * 3, [1.0] * 4, [1.0] * 3)
GRAPH = solver.Graph.chain([1.0, 2.0, 3.0])


def dense(p, x):
    return jnp.tanh(x @ p)


SOLVER_CASES = {
    "exhaustive nan budget": (lambda: solver.exhaustive_optimum(CHAIN, float("nan")), "budget"),
    "exhaustive negative budget": (lambda: solver.exhaustive_optimum(CHAIN, -1.0), "budget"),
    "exhaustive str budget": (lambda: solver.exhaustive_optimum(CHAIN, "abc"), "budget"),
    "exhaustive not a chain": (lambda: solver.exhaustive_optimum([1, 2], 5), "solver.Chain"),
    "chain of strings": (lambda: solver.Chain(["a", 1, 1], [1] * 3, [1] * 4, [1] * 3),
                         r"fwd_time \(one entry per layer\) must be a sequence of real numbers"),
    "chain ragged": (lambda: solver.Chain([1] * 3, [1, [1, 2], 1], [1] * 4, [1] * 3),
                     r"bwd_time \(3 entries\) must be a sequence of real numbers"),
    "chain overflows": (lambda: solver.Chain([1] * 3, [1] * 3, [1e308] * 4, [1e308] * 3),
                        "sum to infinity"),
    "homogeneous float length": (lambda: solver.Chain.homogeneous(2.5), "at least one layer"),
    "min_peak strings": (lambda: solver.min_peak_chain(["a"]), "sequence of real numbers"),
    "min_peak overflow": (lambda: solver.min_peak_chain([1e308, 1e308]), "sum to infinity"),
    "simulate short op": (lambda: solver.simulate(CHAIN, [("F_all",)]), "pair"),
    "simulate not a chain": (lambda: solver.simulate([1, 2], []), "solver.Chain"),
    "search str budget": (lambda: solver.checkpoint_search(GRAPH, budget="abc"), "budget"),
    "search bool budget": (lambda: solver.checkpoint_search(GRAPH, budget=True), "budget"),
    "search str gap": (lambda: solver.checkpoint_search(GRAPH, budget=10, gap="x"), "gap"),
    "search nan time": (lambda: solver.checkpoint_search(GRAPH, budget=10, time_limit=float("nan")),
                        "time_limit"),
    "search gap without budget": (lambda: solver.checkpoint_search(GRAPH, gap=0.1), "pass a budget"),
    "ilp str time": (lambda: solver.solve_ilp(GRAPH, 10, time_limit="x"), "time_limit"),
    "ilp none time": (lambda: solver.ilp_min_peak(GRAPH, time_limit=None), "time_limit"),
    "ilp negative gap": (lambda: solver.solve_ilp(GRAPH, 10, mip_gap=-1), "mip_gap"),
    "ilp nan gap": (lambda: solver.solve_ilp(GRAPH, 10, mip_gap=float("nan")), "mip_gap"),
    "compare str budget": (lambda: compare_methods(CHAIN, ["abc"]), "every budget"),
    "graph edges None": (lambda: solver.Graph.from_edges(None, [1, 1]), "edges must be"),
    "graph string edge": (lambda: solver.Graph.from_edges(["ab"], {"a": 1, "b": 1}),
                          "not a \\(u, v\\) pair"),
    "graph bool size": (lambda: solver.Graph.from_edges([("a", "b")], {"a": True, "b": 1}),
                        "not a number"),
}


@pytest.mark.parametrize("case", SOLVER_CASES.values(), ids=SOLVER_CASES.keys())
def test_solver_rejects(case):
    call, message = case
    with pytest.raises((ValueError, TypeError), match=message):
        call()


class Tower(nnx.Module):
    def __init__(self, blocks):
        self.blocks = blocks

    def __call__(self, x):
        return self.run_blocks(x)


FRONTEND_CASES = {
    "slots float": (lambda: jaxremat.remat_sequence([dense], 500, slots=2.5), "slots"),
    "huge int budget": (lambda: jaxremat.remat_sequence([dense], 10**400), "sensible range"),
    "share of nan": (lambda: jaxremat.resolve_budget("40%", float("nan")), "no-remat memory"),
    "share of zero": (lambda: jaxremat.resolve_budget("40%", 0), "no-remat memory"),
    "device fraction str": (lambda: jaxremat.budget_from_device(None, fraction="0.5"), "fraction"),
    "device nan limit": (lambda: jaxremat.budget_from_device(
        None, memory_stats={"bytes_limit": float("nan")}),
                         "bytes_limit"),
    "graph max_vertices": (lambda: jaxremat.remat_graph(dense, max_vertices="x"), "max_vertices"),
    "graph time_limit": (lambda: jaxremat.remat_graph(dense, "60%", time_limit="x"), "time_limit"),
    "graph nan time_limit": (lambda: jaxremat.remat_graph(dense, "60%", time_limit=float("nan")),
                             "time_limit"),
    "module time_limit": (lambda: RematModule(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), time_limit=-1),
                          "time_limit"),
    "nnx unknown method": (lambda: RematSequential(nnx.relu, budget="1MiB", method="bogus"), "method"),
    "nnx not callable": (lambda: RematSequential(nnx.relu, 3, budget="1MiB"), r"layers\[1\]"),
    "blocks unknown costs": (lambda: remat_blocks("blocks", budget="1MiB", costs="x"), "costs"),
    "blocks bad budget": (lambda: remat_blocks("blocks", budget="garbage"), "memory budget"),
    "linen empty": (lambda: LinenSequential(layers=[], budget="1MiB"), "at least one layer"),
    "linen not callable": (lambda: LinenSequential(layers=[nn.relu, 3], budget="1MiB"),
                           r"layers\[1\]"),
    "linen bad budget": (lambda: LinenSequential(layers=[nn.relu], budget="garbage"),
                         "memory budget"),
    "linen bad slots": (lambda: LinenSequential(layers=[nn.relu], budget="1MiB", slots=0), "slots"),
    "scan of no layers": (lambda: jaxremat.remat_scan(dense, "50%")(jnp.ones((0, 4, 4)), jnp.ones((2, 4))),
                          r"stacks no layers: stacked_params has shape \(0, 4, 4\)"),
    # an integer carry carries no gradient: this was JAX's "grad requires real-valued outputs"
    "scan of an integer carry": (lambda: jaxremat.remat_scan(
        lambda p, c: (c[0] + 1, ~c[1]), "50%")(jnp.ones((3, 2)), (jnp.zeros(2, int), jnp.zeros(2, bool))),
                                 r"no floating-point leaf.*jax\.lax\.scan\("),
    "scan of unstacked parameters": (lambda: jaxremat.remat_scan(dense, "50%")(
        jnp.ones((4, 4)), jnp.ones((2, 4))), r"stacks the L layers' parameters on axis 0"),
}


@pytest.mark.parametrize("case", FRONTEND_CASES.values(), ids=FRONTEND_CASES.keys())
def test_frontend_rejects(case):
    call, message = case
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_remat_blocks_instance_budget_is_not_ignored():
    # remat_budget = 0 used to fall back silently to the decorator's budget (`or`).
    cls = remat_blocks("blocks", budget="1MiB")(type("Tower", (Tower,), {}))
    model = cls(nnx.List([nnx.Linear(4, 4, rngs=nnx.Rngs(0))]))
    model.remat_budget = 0
    with pytest.raises(ValueError, match="is zero"):
        model(jnp.ones((2, 4)))


class Positional(nnx.Module):
    """A block taking a side input beside the activation, as Llama-style blocks take their
    positions or rotary tables."""

    def __init__(self):
        self.linear = nnx.Linear(4, 4, rngs=nnx.Rngs(0))

    def __call__(self, x, positions):
        return self.linear(x) * positions


def test_blocks_given_side_inputs_say_how_to_pass_them():
    # run_blocks(h, positions): only the first block gets positions (Sequential's
    # convention); the error named the missing argument without saying why
    model = RematSequential(Positional(), Positional(), budget="1MiB")
    with pytest.raises(TypeError, match=r"missing 1 required positional argument.*\n.*"
                                        r"layer 0 is called with the 2 arguments given.*"
                                        r"return h, positions"):
        model(jnp.ones((2, 4)), jnp.ones((2, 4)))


def test_remat_blocks_attribute_must_be_a_list():
    cls = remat_blocks("blocks", budget="1MiB")(type("Tower", (Tower,), {}))
    model = cls(nnx.Linear(4, 4, rngs=nnx.Rngs(0)))
    # read as a scanned stack of 4 blocks (kernel and bias have 4 rows), which cannot carry h
    with pytest.raises(ValueError, match=r"Tower\.blocks is one Linear, not a list of modules.*"
                                         r"nnx\.List"):
        model(jnp.ones((2, 4)))
    model = cls(nnx.Linear(4, 3, rngs=nnx.Rngs(0)))  # not a stack: axes 0 disagree
    with pytest.raises(ValueError, match=r"Tower\.blocks is not a scanned stack.*"
                                         r"Tower\.blocks\.bias has L = 3.*Tower\.blocks\.kernel "
                                         r"has L = 4.*nnx\.List"):
        model(jnp.ones((2, 4)))


def test_revolve_min_budget_works_on_matmul_layers():
    # Matmul layers keep their input, not their output, so output_in_tape is false: the
    # smallest budget an InfeasibleBudget names must then be accepted.
    params, x = [jnp.eye(8)] * 4, jnp.ones((2, 8))
    layers = [lambda p, h: h @ p] * 4
    with pytest.raises(solver.InfeasibleBudget) as info:
        jaxremat.remat_sequence(layers, 1, method="revolve")(params, x)
    least = int(np.ceil(info.value.min_budget))
    out = jaxremat.remat_sequence(layers, least, method="revolve")(params, x)
    np.testing.assert_allclose(out, x)


def test_a_share_budget_on_an_empty_batch_says_the_batch_is_empty():
    layers = [lambda p, h: jnp.tanh(h @ p)] * 3
    params, empty = [jnp.eye(4)] * 3, jnp.ones((0, 4))
    said = r"input is empty \(an array of shape \(0, 4\).*at least one example, or give the budget in bytes"
    with pytest.raises(solver.InfeasibleBudget, match=said):
        jaxremat.remat_sequence(layers, "40%").plan(params, empty)
    with pytest.raises(solver.InfeasibleBudget, match=said):
        jaxremat.remat_graph(lambda p, h: jnp.tanh(h @ p[0]) @ p[1], "40%").plan(params[:2], empty)
    model = RematSequential(*[nnx.Linear(4, 4, rngs=nnx.Rngs(0)) for _ in range(3)], budget="40%")
    with pytest.raises(solver.InfeasibleBudget, match=said):
        model.plan(empty)
    # In bytes, or with examples in the batch, the message has no such note.
    with pytest.raises(solver.InfeasibleBudget) as info:
        jaxremat.remat_sequence(layers, 8).plan(params, empty)
    assert "empty" not in str(info.value)
    with pytest.raises(solver.InfeasibleBudget) as info:
        jaxremat.remat_sequence(layers, "10%").plan(params, jnp.ones((64, 4)))
    assert "empty" not in str(info.value)


def test_remat_blocks_runs_a_scanned_stack_as_nnx_scan_does():
    # The blocks of a scanned stack are one module whose parameters are stacked by nnx.vmap;
    # remat_blocks runs them with remat_scan (tests/test_flax_scanned.py).
    @nnx.split_rngs(splits=3)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def stacked(rngs):
        return nnx.Linear(4, 4, rngs=rngs)

    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def plain(h, block):
        return block(h)

    cls = remat_blocks("blocks", budget="1MiB", scope="blocks")(type("Tower", (Tower,), {}))
    model = cls(stacked(nnx.Rngs(0)))
    assert model.blocks.kernel.shape == (3, 4, 4)
    x = jnp.arange(8.0).reshape(2, 4)
    np.testing.assert_allclose(model(x), plain(x, model.blocks), rtol=1e-6)
