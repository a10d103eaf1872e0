"""``profile_sequence`` on activations that are pytrees whose leaves are read in part:
``Chain.x_read_size`` (what a backward reads of its input) and ``Chain.x_rec_size`` (what a
checkpoint keeps for its recomputation), checked against the program-order meter."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

import solver
from jaxremat import activation_memory
from jaxremat.sequence.apply import apply_plan
from jaxremat.sequence.profile import profile_sequence
from solver.chain.baselines import every_layer_plan, none_plan, sqrt_plan

B, D_IN = 8, 16
F32 = 4


def _array(seed, shape, scale=0.5):
    return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _skip_block(p, xs):  # B reads h (x @ w needs x for w's gradient), never skip
    h = jnp.tanh(xs["h"] @ p)
    return {"h": h, "skip": 0.5 * xs["skip"] + h}


def _skip_stack():
    """Three ``_skip_block`` layers, their parameters and a ``{h, skip}`` input."""
    xs = {"h": _array(30, (B, D_IN)), "skip": _array(31, (B, D_IN))}
    return [_skip_block] * 3, [_array(32 + i, (D_IN, D_IN)) for i in range(3)], xs


def test_x_read_size_is_the_part_of_the_input_the_backward_reads():
    """``Chain.x_read_size``: the leaves of ``x[i]`` that ``B(i)`` (or ``B(i-1)``, through its
    output) reads; the simulator frees the rest after ``F_all(i)``, as JAX does, and no plan
    is predicted below the meter. ``Chain.x_rec_size``: a checkpoint holds only the leaves
    its recomputation reads (not ``skip``: the tape-only forwards do not read it), as JAX's
    checkpoint keeps only those. (Every plan is still 1 KiB above the meter: ``B(2)`` is
    charged both leaves of ``g[2]`` beside ``g[3]``, where JAX frees ``g[3]``'s as it goes,
    the clamped ``bwd_tmp`` of the profile's docstring; without ``x_rec_size``
    ``every_layer`` measured 0.67 of its prediction.)"""
    layers, params, xs = _skip_stack()
    profile = profile_sequence(layers, params, xs, policies=())
    chain = profile.chain
    leaf = B * D_IN * F32
    assert chain.x_size.tolist() == [2 * leaf] * 4
    # h of x[0] read by B(0); x[1], x[2] are also outputs whose h B(i-1) reads (tanh's y on
    # JAX 0.10, not on 0.11+), never their skip
    assert chain.x_read_size.tolist() == [leaf] * 3
    assert profile.layers[0].input_read == (True, False)  # leaves in order: h, skip
    assert chain.x_rec_size.tolist() == [leaf] * 3  # h: no recomputation reads skip
    loss = lambda y: jnp.sum(y["h"]) + jnp.sum(y["skip"])  # noqa: E731
    for plan_name, plan in (("none", none_plan(3)), ("every_layer", every_layer_plan(3)),
                            ("sqrt", sqrt_plan(3))):
        predicted = solver.make_schedule(chain, plan).peak
        measured = activation_memory(
            lambda p, x: loss(apply_plan(plan, layers, p, x)), params, xs)
        assert predicted - 2 * leaf <= measured <= predicted, (plan_name, measured, predicted)
    # without the field every skip leaf is held until its backward: storing everything
    # peaks at B(2) with the three skips of x[0..2] more
    whole = dataclasses.replace(chain, x_read_size=None, x_rec_size=None, x_own_read_size=None)
    assert solver.make_schedule(whole, none_plan(3)).peak == solver.make_schedule(
        chain, none_plan(3)).peak + 3 * leaf


def test_rotor_fits_at_every_layer_measured_memory_of_a_pytree_stack():
    """At the memory every_layer measures on a ``{h, skip}`` stack, the chain predicts it
    exactly up to the clamped ``bwd_tmp`` (checkpoints hold ``h`` only, Chain.x_rec_size),
    so solve's plan fits that memory and is no slower than every_layer (with checkpoints
    held whole every_layer was predicted 1 KiB per checkpoint above it and did not fit)."""
    layers, params, xs = _skip_stack()
    chain = profile_sequence(layers, params, xs, policies=()).chain
    loss = lambda y: jnp.sum(y["h"]) + jnp.sum(y["skip"])  # noqa: E731
    every = every_layer_plan(3)
    budget = activation_memory(lambda p, x: loss(apply_plan(every, layers, p, x)), params, xs)
    budget += B * D_IN * F32 * 2  # the clamped bwd_tmp (test above)
    schedule = solver.solve(chain, budget)
    assert schedule.time <= solver.make_schedule(chain, every).time
    measured = activation_memory(lambda p, x: loss(apply_plan(schedule.plan, layers, p, x)),
                                 params, xs)
    assert measured <= schedule.peak <= budget
    whole = dataclasses.replace(chain, x_rec_size=None)
    assert solver.make_schedule(whole, every).peak > budget
