"""Every ```python block of README.md runs.

The README's snippets use placeholders (``layers``, ``params``, ``x``, ``loss_fn``; a model
class body written as ``...``). Each block is executed in a fresh namespace holding small
stand-ins for them, so that a snippet that no longer matches the API fails here.
"""

from __future__ import annotations

import pathlib
import re

import jax
import jax.numpy as jnp
import pytest

import jaxremat

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _blocks() -> list[str]:
    return _BLOCK.findall(README.read_text())


def _jax_stand_ins() -> dict:
    """A three-layer tanh stack: ``layers[i](params[i], x)``, and a loss of its output."""
    layers = [lambda w, h: jnp.tanh(h @ w)] * 3
    params = [jnp.eye(16) * 0.5 for _ in layers]
    return {"layers": layers, "params": params, "x": jnp.ones((8, 16)),
            "loss_fn": lambda y: jnp.mean(y**2)}


def _scan_stand_ins() -> dict:
    """One block scanned over 32 parameter sets stacked on axis 0, activations larger than
    the parameters (as in a real stack)."""
    return {"block": lambda w, h: jnp.tanh(h @ w), "stacked": jnp.stack([jnp.eye(16) * 0.5] * 32),
            "x": jnp.ones((512, 16)), "loss_fn": lambda y: jnp.mean(y**2)}


def _nnx_stand_ins() -> dict:
    """A small NNX model (remat_blocks over blocks with BatchNorm and Dropout), a batch and
    a training loss."""
    from flax import nnx

    import jaxremat.flax

    class Block(nnx.Module):
        def __init__(self, *, rngs: nnx.Rngs):
            self.up = nnx.Linear(16, 16, rngs=rngs)
            self.norm = nnx.BatchNorm(16, rngs=rngs)
            self.drop = nnx.Dropout(0.2, rngs=rngs)

        def __call__(self, x):
            return x + self.drop(nnx.relu(self.norm(self.up(x))))

    @jaxremat.flax.remat_blocks("blocks", budget="90%")
    class Model(nnx.Module):
        def __init__(self, *, rngs: nnx.Rngs):
            self.embed = nnx.Linear(8, 16, rngs=rngs)
            self.blocks = nnx.List([Block(rngs=rngs) for _ in range(4)])
            self.head = nnx.Linear(16, 3, rngs=rngs)

        def __call__(self, x):
            return self.head(self.run_blocks(self.embed(x)))

    def loss_fn(model, images, labels):
        logits = model(images)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

    return {"nnx": nnx, "Block": Block, "model": Model(rngs=nnx.Rngs(0, dropout=1)),
            "loss_fn": loss_fn,
            "images": jax.random.normal(jax.random.key(0), (32, 8)),
            "labels": jnp.arange(32) % 3}


def test_the_readme_has_python_snippets():
    blocks = _blocks()
    assert len(blocks) >= 3
    assert any("remat_sequence" in block for block in blocks)


@pytest.mark.parametrize("index", [  # the scanned NNX stack's whole-step fit: 8-18 s of CPU
    pytest.param(i, marks=pytest.mark.slow) if "nnx.vmap" in block else i
    for i, block in enumerate(_blocks())])
def test_readme_snippet_runs(index, capsys):
    code = _blocks()[index]
    namespace = {"jax": jax, "jnp": jnp, "jaxremat": jaxremat}
    flax_snippet = "nnx" in code or "model" in code
    namespace.update(_nnx_stand_ins() if flax_snippet
                     else _scan_stand_ins() if "remat_scan" in code else _jax_stand_ins())
    exec(compile(code, f"README.md python block {index}", "exec"), namespace)
    printed = capsys.readouterr().out
    if "roomy" in namespace:  # the budget section: a share over 100% means no remat
        assert "exceeds what the plain sequence needs" in printed
    if "print(seq.plan(" in code:
        assert "jaxremat plan" in printed
    if "fit_blocks" in code:  # the whole step, measured
        assert "the whole training step (loss_fn(model, *batch))" in printed


def test_the_demo_labels_its_synthetic_chains_and_explains_its_marks(capsys):
    from jaxremat.__main__ import _solver_tables

    _solver_tables(3)
    printed = capsys.readouterr().out
    headers = [line for line in printed.splitlines() if line.startswith("== ")]
    assert len(headers) == 3 and all(line.startswith("== Synthetic") for line in headers)
    # at the no-remat peak rotor costs what "none" costs (its own plan since slot refinement,
    # marked * where a baseline's schedule is used); a mark comes with its footnote
    assert re.search(r"100\.0%\s+\+0\.0%\*?\s+\+0\.0%", printed)
    assert ("%*" in printed) == ("* the dynamic program found nothing better than a baseline"
                                 in printed)
