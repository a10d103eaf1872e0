"""Flax integration: rematerialize Flax modules under a memory budget.

NNX (first class; :mod:`jaxremat.flax.nnx`):

* :class:`RematSequential` -- drop-in for ``nnx.Sequential``.
* :func:`remat_blocks` -- class decorator adding ``self.run_blocks(x)`` for a model whose
  blocks live in a list attribute; the budget bounds the whole training step
  (``scope="model"``, :mod:`jaxremat.flax.model_scope`) or the blocks alone
  (``scope="blocks"``). A scanned stack (``nnx.vmap``-built, run with ``nnx.scan``) runs
  with :func:`jaxremat.remat_scan`'s nested scans (:mod:`jaxremat.flax.scanned`).
* :func:`run_modules` / :func:`plan_modules` -- the functional forms.
* :func:`activation_memory` -- program-order memory of a module's training step
  (``activation_memory(model, loss_fn, *batch)``; BatchNorm and Dropout included).
* :class:`RematModule` -- any module (branches, concatenations, residuals) run with
  :func:`jaxremat.remat_graph`'s checkpoints (:mod:`jaxremat.flax.graph`).

Linen (:mod:`jaxremat.flax.linen`): ``jaxremat.flax.linen.RematSequential(layers=...,
budget=...)``, built on the lifted ``nn.remat``.

Importing ``jaxremat`` does not import Flax; importing ``jaxremat.flax`` does.
"""

from .graph import RematModule
from .meter import activation_memory
from .blocks import remat_blocks
from .nnx import RematSequential, plan_modules, run_modules
from .scanned import ScannedPlan, plan_scanned, run_scanned

__all__ = ["activation_memory", "RematModule", "RematSequential", "remat_blocks", "run_modules", "plan_modules", "ScannedPlan", "plan_scanned", "run_scanned", "linen", "nnx"]


def __getattr__(name: str):
    # ``jaxremat.flax.linen`` is imported on first use (it imports flax.linen).
    if name == "linen":
        import importlib

        return importlib.import_module(".linen", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
