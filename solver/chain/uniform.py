"""Uniform plans: every layer saved the same way, the choice a practitioner makes by hand.

A practitioner picks one ``jax.checkpoint`` policy for the whole model (MaxText's
``remat_policy``; ALGORITHMS.md section 8): every layer keeps its whole tape (no remat),
every layer keeps only its input (checkpoint every layer, ``nothing_saveable``), or every
layer runs under the same option ``k`` (``dots_saveable``, ...). Each of these is a
persistent plan of the chain, so Rotor's dynamic program with options (section 2) should
never return a plan dearer than one of them that fits the budget. It can, because the DP
rounds sizes up to ``budget / slots``: a plan whose peak is exactly the budget may not fit
the rounded model. :func:`solver.solve` therefore costs these plans with the simulator and
takes the fastest that fits when the DP's answer is dearer.

Options are matched by name (``Chain.options.names``): the uniform plan of option name
``n`` runs ``Layer(i, k)`` with the ``k`` layer ``i`` names ``n``. A layer that lacks ``n``
uses the option ``aliases[i][n]`` names (the frontend merges identical options and drops
dominated ones, so it knows which option stands in for a missing one), else its whole tape.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .baselines import every_layer_plan, none_plan
from .chain import Chain
from .schedule import Layer, Plan

__all__ = ["uniform_plans", "UNIFORM_PREFIX"]

UNIFORM_PREFIX = "uniform:"
"""``Schedule.method`` of a uniform option plan is this prefix and the option's name."""


def _option_of(names: Sequence[str], name: str, aliases: Mapping[str, str]) -> int:
    """The option of a layer with option ``names`` that stands for ``name`` (0 if none)."""
    seen = set()
    while name not in names and name in aliases and name not in seen:
        seen.add(name)
        name = aliases[name]
    return names.index(name) if name and name in names else 0


def uniform_plans(chain: Chain, aliases: Sequence[Mapping[str, str]] | None = None
                  ) -> dict[str, Plan]:
    """The chain's uniform plans by method name.

    ``"none"`` (every layer keeps its whole tape), ``"every_layer"`` (every layer keeps its
    input and is recomputed) and, for each option name of ``Chain.options`` other than
    option 0's and each name ``aliases`` maps, ``"uniform:<name>"``: every layer under that
    option (module docstring; ``aliases[i]`` maps names layer ``i`` lacks to the name
    standing in for them). Two names may give the same plan.
    """
    length = chain.length
    plans = {"none": none_plan(length), "every_layer": every_layer_plan(length)}
    table = chain.options
    if table is None:
        return plans
    if aliases is not None and len(aliases) != length:
        raise ValueError(f"aliases needs one mapping per layer ({length}), got {len(aliases)}.")
    names = table.names
    order: list[str] = []
    for i in range(length):
        order += [n for k, n in enumerate(names[i]) if k and n and n not in order]
    for row in aliases or ():  # names every layer merged into another option
        order += [n for n in row if n not in order and n != names[0][0]]
    for name in order:
        plan = tuple(Layer(i, _option_of(names[i], name, aliases[i] if aliases else {}))
                     for i in range(length))
        plans[UNIFORM_PREFIX + name] = plan
    return plans

