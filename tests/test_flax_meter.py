"""jaxremat.flax.activation_memory: an NNX model's training step, BatchNorm and Dropout
included, measured as jaxremat.activation_memory measures the equivalent pure function."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import errors as flax_errors
from flax import nnx
from flax.nnx.nn.normalization import _compute_stats, _normalize

import jaxremat
import jaxremat.flax

BATCH, IN, HIDDEN, OUT, RATE = 64, 8, 32, 4, 0.25


class Model(nnx.Module):
    def __init__(self, *, rngs: nnx.Rngs):
        self.up = nnx.Linear(IN, HIDDEN, rngs=rngs)
        self.norm = nnx.BatchNorm(HIDDEN, rngs=rngs)
        self.drop = nnx.Dropout(RATE, rngs=rngs)
        self.down = nnx.Linear(HIDDEN, OUT, rngs=rngs)

    def __call__(self, x):
        return self.down(self.drop(nnx.relu(self.norm(self.up(x)))))


def loss_fn(model, x, target):
    return jnp.mean((model(x) - target) ** 2)


def _linear(x, kernel, bias):
    y = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
    y += jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
    return y


def pure_loss(params, state, x, target):
    """The same step by hand: arrays in, loss out; the state updates are computed and
    dropped, as they are when the gradient alone is kept."""
    h = _linear(x, params["up"]["kernel"], params["up"]["bias"])
    mean, var = _compute_stats(h, (0,), dtype=None)
    jax.lax.stop_gradient(0.99 * state["mean"] + 0.01 * mean)  # running statistics
    jax.lax.stop_gradient(0.99 * state["var"] + 0.01 * var)
    h = _normalize(h, mean, var, params["norm"]["scale"], params["norm"]["bias"], (0,), (1,),
                   None, 1e-5)
    h = nnx.relu(h)
    key = jax.random.fold_in(state["key"], state["count"])
    state["count"] + 1  # the RNG counter moves on
    mask = jnp.broadcast_to(jax.random.bernoulli(key, p=1 - RATE, shape=h.shape), h.shape)
    h = jax.lax.select(mask, h / (1 - RATE), jnp.zeros_like(h))
    y = _linear(h, params["down"]["kernel"], params["down"]["bias"])
    return jnp.mean((y - target) ** 2)


@pytest.fixture(scope="module")
def setup():
    model = Model(rngs=nnx.Rngs(0, dropout=1))
    x = jax.random.normal(jax.random.key(2), (BATCH, IN))
    target = jax.random.normal(jax.random.key(3), (BATCH, OUT))
    return model, x, target


def _arrays(model):
    params = {name: {"kernel": getattr(model, name).kernel[...], "bias": getattr(model, name).bias[...]}
              for name in ("up", "down")}
    params["norm"] = {"scale": model.norm.scale[...], "bias": model.norm.bias[...]}
    state = {"mean": model.norm.mean[...], "var": model.norm.var[...],
             "key": model.drop.rngs.key[...], "count": model.drop.rngs.count[...]}
    return params, state


def test_equals_the_meter_on_the_equivalent_pure_function(setup):
    model, x, target = setup
    params, state = _arrays(model)
    # the hand-written step computes what the model computes
    expected = nnx.value_and_grad(loss_fn)(nnx.clone(model), x, target)[0]
    np.testing.assert_allclose(pure_loss(params, state, x, target), expected, rtol=1e-6)
    measured = jaxremat.flax.activation_memory(model, loss_fn, x, target)
    assert measured == jaxremat.activation_memory(pure_loss, params, state, x, target)
    # more than the batch and the activations of one layer: the step is really measured
    assert measured > 3 * BATCH * HIDDEN * 4


def _numpy(leaf):
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    return np.asarray(leaf)


def test_the_model_is_not_changed_and_works_inside_jit(setup):
    model, x, target = setup
    before = jax.tree.map(_numpy, nnx.state(model))
    measured = jaxremat.flax.activation_memory(model, loss_fn, x, target)
    after = jax.tree.map(_numpy, nnx.state(model))
    jax.tree.map(np.testing.assert_array_equal, before, after)  # statistics, RNG counter

    @nnx.jit
    def inside(model, x, target):
        return jnp.asarray(jaxremat.flax.activation_memory(model, loss_fn, x, target))

    assert int(inside(model, x, target)) == measured
    with_aux = lambda m, x, t: (loss_fn(m, x, t), m(x))  # noqa: E731
    assert jaxremat.flax.activation_memory(model, with_aux, x, target, has_aux=True) >= measured


def test_the_naive_route_fails_where_the_helper_does_not(setup):
    # What the helper replaces: merging captured state inside the loss cannot write to it.
    model, x, target = setup
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def naive(params, x, target):
        return loss_fn(nnx.merge(graphdef, params, rest), x, target)

    with pytest.raises(flax_errors.TraceContextError):
        jaxremat.activation_memory(naive, params, x, target)


def test_eval_mode_holds_less_than_train_mode(setup):
    model, x, target = setup
    trained = jaxremat.flax.activation_memory(model, loss_fn, x, target)
    evaluated = nnx.clone(model)
    evaluated.eval()  # running averages, no dropout mask
    assert jaxremat.flax.activation_memory(evaluated, loss_fn, x, target) < trained


def test_rejects_what_is_not_a_module():
    with pytest.raises(TypeError, match=r"jaxremat\.activation_memory\(fn, params"):
        jaxremat.flax.activation_memory(lambda p, x: x, loss_fn, jnp.ones(3))
