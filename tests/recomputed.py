"""How often a block's marker primitive (``tanh``) runs in a differentiated program, as
counted in its jaxpr and as a plan's schedule predicts it (test_flax_nnx, test_flax_linen)."""

from __future__ import annotations

import jax

from solver import Checkpoint, Layer


def count_primitive(jaxpr, name: str) -> int:
    """Occurrences of primitive ``name`` in a jaxpr, counting each use of a sub-jaxpr
    (printing shares repeated sub-jaxprs, so the text undercounts)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0
    for eqn in jaxpr.eqns:
        total += eqn.primitive.name == name
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(sub, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
                    total += count_primitive(sub, name)
    return total


def expected_marks(plan, blocks: int) -> int:
    """The marker's runs in the differentiated program of ``plan`` (layers ``0 .. blocks-1``
    are blocks with one marker each, whose derivative reads the marker's output).

    Each forward the schedule runs (``plan.forward_counts``), plus one for each block whose
    tape is kept under a checkpoint policy (an option other than ``"everything"``, e.g.
    ``dots``: the policy saves the matrix product, so the block's backward recomputes the
    marker from it), less one for each such block that ends a checkpoint's body: when that
    checkpoint is recomputed in the backward, the block's output (the checkpoint's output)
    is not used and its policy does not save the marker, so JAX's partial evaluation of the
    recomputation drops the marker as dead code (the same on JAX 0.10 and 0.12; only the
    plans differ: JAX 0.12's 40% plans choose such a ``dots`` block).
    """
    policies = sum(option != "everything" for option in plan.options[:blocks])
    dead, items = 0, list(plan.schedule.plan)
    while items:
        item = items.pop()
        if isinstance(item, Checkpoint):
            last = item.body[-1]
            dead += isinstance(last, Layer) and last.index < blocks and last.option != 0
            items.extend(item.body)
    return sum(plan.forward_counts[:blocks]) + policies - dead
