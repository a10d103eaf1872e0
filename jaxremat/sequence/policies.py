"""The menu of ``jax.checkpoint`` policies a layer may be saved with (issue 17).

Rotor's chain gives each layer two ways to be saved: keep its input (a ``Checkpoint``) or
keep its whole tape (``Layer(i)``). Following Rockmate's extension of Rotor (Zhao et al.,
"Rockmate: an Efficient, Fast, Automatic and Generic Tool for Re-materialization in
PyTorch", ICML 2023; ALGORITHMS.md section 2, "Multi-option layers"), a layer saved in
"save" mode may instead keep only part of its tape, chosen by a ``jax.checkpoint`` policy,
and recompute the rest in its backward. This module turns the user's ``policies=`` argument
into the per-layer menu of such options:

* option 0 is always the whole tape (``everything_saveable``: the plain call);
* ``"dots"``: ``jax.checkpoint_policies.dots_saveable`` (keep matmul and convolution
  outputs);
* ``"dots_no_batch"``: ``dots_with_no_batch_dims_saveable`` (keep those without batch
  dimensions, i.e. not the attention scores);
* ``"names"``: ``save_only_these_names`` for the names the user marked in the layer with
  ``jax.ad_checkpoint.checkpoint_name``: all of them (option ``"names:a,b"``) and, when
  a layer marks two to seven names, the groups of :func:`name_groups`: each name on its
  own, the nested groups of the names in program order (``q`` ⊂ ``q,k`` ⊂ ``q,k,v`` ⊂
  ..., as MaxText's ``remat_policy`` presets nest ``save_qkv_proj`` ⊂
  ``save_dot_with_context_except_mlp`` ⊂ ``minimal_with_context``) and all names but one
  (MaxText's ``minimal`` is all but ``context``);
* ``"dots_ranked"`` (opt-in): per layer, up to three policies "keep the matmul and
  convolution outputs whose contraction ``K`` is at least a threshold" (options
  ``"dots_ranked:>=K"``), the thresholds read from the layer's jaxpr: outputs ranked by
  recompute flops per kept byte (:mod:`jaxremat.sequence.ranked`, issue 17.6);
* ``"searched"``: per layer, up to three policies found by a measured greedy search
  (:mod:`jaxremat.sequence.searched`, issue 17.6), one per base: ``dots_saveable`` and
  ``dots_with_no_batch_dims_saveable`` each with the values that make it cheaper within a
  quarter more tape, and the values worth most recomputation per byte within the tape of
  ``dots_with_no_batch_dims_saveable`` (options named after their base and the limit the
  search reached them at: ``"dots_plus:wide"``, ``"dots_no_batch_plus"``,
  ``"nothing_plus:wider"``...);
* ``"dots_plus"`` (opt-in): every option of that search, up to seven: per dots base the
  unions within 1/16 and 1/4 more tape (``"dots_plus"``, ``"dots_plus:wide"``,
  ``"dots_no_batch_plus"``, ``"dots_no_batch_plus:wide"``), over nothing those within a
  third, two thirds and all of ``dots_with_no_batch_dims_saveable``'s tape
  (``"nothing_plus"``, ``":wide"``, ``":wider"``); ``"searched"``'s are among them;
* ``"offload_dots_no_batch"``: ``offload_dot_with_no_batch_dims`` to ``pinned_host``
  (those matmul outputs kept in host memory instead of on the device);
* ``"offload_names"``: ``save_and_offload_only_these_names`` with the marked names
  offloaded to ``pinned_host`` (options ``"offload_names:a,b"``, and per name as above);
* any callable ``policy(prim, *avals, **params) -> bool`` (named by its ``__name__``).

The two offload options (:data:`OFFLOAD_POLICIES`) exist only where the device has a host
memory space (:func:`jaxremat.measure.offload.offload_unavailable`); their cost model is in
:mod:`jaxremat.measure.offload`. They are not on the default menu: each adds a profile per
distinct layer, and off a GPU their transfer time is a model, not a measurement.

``nothing_saveable`` is not an option: keeping only a layer's input is the chain's
``Checkpoint`` of that layer. :func:`profile_sequence <jaxremat.sequence.profile.profile_sequence>`
measures every option and merges those whose tapes are identical.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax

from ..jax_compat import sub_jaxprs
from ..trees import tree_bytes
from .ranked import RANKED, Dot, RankedDots, layer_dots, menu_thresholds, ranked_notes
from .searched import SEARCHED, WIDEST, search

__all__ = ["DEFAULT_POLICIES", "OFFLOAD_POLICIES", "POLICY_NAMES", "PolicyOption",
           "check_policies", "layer_menu", "marked_names", "menu_for", "name_groups",
           "offload_policy", "shape_free", "unbatched_menu", "without_searched", "WHOLE_TAPE"]

_BUILTIN: dict[str, Callable[..., bool]] = {
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
_ALIASES = {
    "dots_saveable": "dots",
    "checkpoint_dots": "dots",
    "dots_with_no_batch_dims_saveable": "dots_no_batch",
    "checkpoint_dots_with_no_batch_dims": "dots_no_batch",
    "save_only_these_names": "names",
    "everything_saveable": "everything",
    "offload_dot_with_no_batch_dims": "offload_dots_no_batch",
    "save_and_offload_only_these_names": "offload_names",
}
OFFLOAD_POLICIES = ("offload_dots_no_batch", "offload_names")
"""The policy names that keep residuals in host memory (``pinned_host``)."""
POLICY_NAMES = (("everything", "dots", "dots_no_batch", "names", WIDEST, RANKED, SEARCHED)
                + OFFLOAD_POLICIES)
"""The policy names ``policies=`` accepts (JAX's own names, e.g. ``"dots_saveable"``, too)."""

DEFAULT_POLICIES = ("dots", "dots_no_batch", "names", WIDEST)
"""The default menu (``policies=None``); option 0, the whole tape, is always on it."""

_MAX_NAME_GROUPS = 7  # layers marking 2..7 names also get the groups of name_groups


@dataclasses.dataclass(frozen=True)
class PolicyOption:
    """One entry of a layer's menu: ``name``, the policy (``None``: the whole tape) and
    whether it offloads residuals to host memory."""

    name: str
    policy: Callable[..., bool] | None
    offload: bool = False


WHOLE_TAPE = PolicyOption("everything", None)
"""Option 0 of every layer: the whole tape (the layer without ``jax.checkpoint``)."""


def offload_policy(name: str, names: Sequence[str] = (), *,
                   dst: str = "pinned_host") -> Callable[..., bool]:
    """The ``jax.checkpoint`` policy of offload option ``name`` (:data:`OFFLOAD_POLICIES`):
    matmul outputs without batch dimensions, or the values marked ``names``, moved from the
    device to host memory ``dst``."""
    policies = jax.checkpoint_policies
    if name == "offload_dots_no_batch":
        return policies.offload_dot_with_no_batch_dims(offload_src="device", offload_dst=dst)
    if name == "offload_names":
        return policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[], names_which_can_be_offloaded=list(names),
            offload_src="device", offload_dst=dst)
    raise ValueError(f"{name!r} is not an offload policy; those are {OFFLOAD_POLICIES}.")


def shape_free(option: str) -> bool:
    """Whether option ``option``'s policy decides from primitives, dimension numbers and
    names alone, never from sizes, so that one program traced with a symbolic batch size
    stands for every batch size (:mod:`jaxremat.sequence.polymorphic`): the whole tape,
    JAX's dots policies, marked names and their offload forms; not the searched and ranked
    options (keyed by shapes and contraction sizes) nor a user's callable."""
    return (option in ("everything", "dots", "dots_no_batch", "offload_dots_no_batch")
            or option.startswith(("names:", "offload_names:")))


_SHAPE_KEYED = (WIDEST, SEARCHED)
_UNDER_VMAP = ("left out under jax.vmap: its policy is keyed by the operand shapes the layer "
               "was profiled with, and jax.checkpoint calls it with vmap's batched shapes")


def without_searched(menu: tuple[str | Callable, ...]) -> tuple[str | Callable, ...]:
    """``menu`` without its searched entries (``"searched"``, ``"dots_plus"``), whose policies
    are keyed by the operand shapes the layer was profiled with."""
    return tuple(entry for entry in menu if entry not in _SHAPE_KEYED)


def unbatched_menu(menu: tuple[str | Callable, ...]
                   ) -> tuple[tuple[str | Callable, ...], tuple[tuple[str, str], ...]]:
    """``menu`` (as :func:`check_policies` returns it) for layers profiled per example under
    ``jax.vmap``, and ``(entry, reason)`` for each entry left out: the searched policies,
    keyed by operand shapes, would not recognise the batched equations ``jax.checkpoint``
    shows them (the layer would save only its base's values, and recompute the rest beyond
    the prediction)."""
    return without_searched(menu), tuple((entry, _UNDER_VMAP) for entry in menu
                                          if entry in _SHAPE_KEYED)


def _valid_names() -> str:
    return ", ".join(repr(n) for n in POLICY_NAMES + tuple(_ALIASES))


def check_policies(policies: Any) -> tuple[str | Callable, ...]:
    """The menu ``policies`` asks for, checked: a tuple of names and callables.

    ``None`` is the default menu (:data:`DEFAULT_POLICIES`); ``()`` is none beyond the whole
    tape (Rotor's two ways per layer, as before options existed); a single name is a menu of
    one.

    Raises:
      ValueError: an unknown name (the message lists the valid ones), or
        ``"nothing_saveable"`` (that is the chain's checkpoint of a layer, always available).
      TypeError: an entry that is neither a name nor a callable.
    """
    if policies is None:
        return DEFAULT_POLICIES
    if isinstance(policies, str) or callable(policies):
        policies = (policies,)
    try:
        entries = tuple(policies)
    except TypeError:
        raise TypeError(
            "policies must be None (the default menu), a sequence of policy names and "
            f"callables, or () for the whole tape only; got {type(policies).__name__}."
        ) from None
    menu: list[str | Callable] = []
    for entry in entries:
        if isinstance(entry, str):
            name = _ALIASES.get(entry, entry)
            if name in ("nothing", "nothing_saveable"):
                raise ValueError(
                    f"policies: {entry!r} is not an option: keeping only a layer's input is the "
                    "plan's checkpoint of that layer, which the solver always considers. Valid "
                    f"names: {_valid_names()}."
                )
            if name not in POLICY_NAMES:
                raise ValueError(
                    f"policies: unknown policy name {entry!r}. Valid names: {_valid_names()}; "
                    "or pass a callable policy(prim, *avals, **params) -> bool."
                )
            if name != "everything" and name not in menu:  # the whole tape is option 0 anyway
                menu.append(name)
        elif callable(entry):
            menu.append(entry)
        else:
            raise TypeError(
                f"policies: each entry must be a policy name or a callable, got "
                f"{type(entry).__name__} ({entry!r}). Valid names: {_valid_names()}."
            )
    return tuple(menu)


def marked_names(layer: Callable, p: Any, x: Any, jaxpr: Any = None) -> tuple[str, ...]:
    """The names ``layer(p, x)`` marks with ``checkpoint_name``, in program order, once each;
    ``jaxpr``: ``jax.make_jaxpr(layer)(p, x)`` where already traced."""
    names: list[str] = []
    pending = [(jaxpr if jaxpr is not None else jax.make_jaxpr(layer)(p, x)).jaxpr]
    while pending:
        jaxpr = pending.pop()
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "name" and eqn.params.get("name") not in names:
                names.append(eqn.params["name"])
            pending.extend(sub_jaxprs(eqn))
    return tuple(names)


def name_groups(names: Sequence[str]) -> list[tuple[str, ...]]:
    """The groups of a layer's marked ``names`` (program order) offered as
    ``save_only_these_names`` options, each once: all of them; and, for 2 to
    ``_MAX_NAME_GROUPS`` names, each alone, the program-order prefixes (nested groups) and
    all but one. Two names give all, a, b; three give every non-empty subset; seven give
    at most 19 groups, each one profile trace per distinct layer (merged and dominated ones
    are dropped: :mod:`jaxremat.sequence.options`)."""
    names = tuple(names)
    groups = [names] if names else []
    if 2 <= len(names) <= _MAX_NAME_GROUPS:
        groups += [(n,) for n in names]
        groups += [names[:k] for k in range(2, len(names))]
        groups += [names[:k] + names[k + 1:] for k in range(len(names))]
    return list(dict.fromkeys(groups))


def _callable_name(policy: Callable, position: int) -> str:
    name = getattr(policy, "__name__", None)
    return name if isinstance(name, str) and name != "<lambda>" else f"policy{position}"


def layer_menu(menu: Sequence[str | Callable], names: Sequence[str],
               dots: Sequence[Dot] = (), plus: Sequence[PolicyOption] = (),
               ) -> tuple[PolicyOption, ...]:
    """One layer's options: the whole tape first, then ``menu`` (checked by
    :func:`check_policies`) expanded for the layer's ``names`` (:func:`marked_names`) and
    its matmuls ``dots`` (:func:`jaxremat.sequence.ranked.layer_dots`, for ``"dots_ranked"``;
    a threshold that is ``"dots"`` or ``"dots_no_batch"`` on the same menu is left out:
    :func:`jaxremat.sequence.ranked.menu_thresholds`) and, for ``"dots_plus"``, the options
    the search found (``plus``: :func:`_plus_options`), for ``"searched"`` the widest of
    them per base. An option two entries give is on the menu once."""
    options = [WHOLE_TAPE]
    save_names = jax.checkpoint_policies.save_only_these_names
    offload_names = lambda *marked: offload_policy("offload_names", marked)  # noqa: E731
    for position, entry in enumerate(menu):
        if callable(entry):
            options.append(PolicyOption(_callable_name(entry, position), entry))
        elif entry in ("names", "offload_names"):
            policy, offload = (save_names, False) if entry == "names" else (offload_names, True)
            options += [PolicyOption(f"{entry}:" + ",".join(group), policy(*group), offload)
                        for group in name_groups(names)]
        elif entry == RANKED:
            options += [PolicyOption(f"{entry}:>={k}", RankedDots(k))
                        for k in menu_thresholds(menu, dots)]
        elif entry == SEARCHED:
            options += plus
        elif entry == WIDEST:
            last = {option.policy.base: option for option in plus}  # the widest per base
            options += last.values()
        elif entry in OFFLOAD_POLICIES:
            options.append(PolicyOption(entry, offload_policy(entry), True))
        else:
            options.append(PolicyOption(entry, _BUILTIN[entry]))
    return tuple({option.name: option for option in options}.values())  # each once


_NO_PLUS = ("no value kept beside the matmul outputs, or in place of them, lowered the layer's "
            "recomputation")


def _plus_options(layer: Callable, p: Any, x: Any, jaxpr: Any) -> list[PolicyOption]:
    """The ``"dots_plus"`` options of ``layer(p, x)`` (:func:`jaxremat.sequence.searched.search`
    over ``dots_saveable``, ``dots_with_no_batch_dims_saveable`` and ``nothing_saveable``):
    per base the narrowest first (names: :data:`jaxremat.sequence.searched.SUFFIXES`)."""
    options = []
    for base, name in (("dots", SEARCHED), ("dots_no_batch", "dots_no_batch_plus"),
                       ("nothing", "nothing_plus")):
        options += [PolicyOption(name + suffix, policy)
                    for suffix, policy in search(layer, p, x, jaxpr, tree_bytes(x), base)]
    return options


def menu_for(menu: Sequence[str | Callable], layer: Callable, p: Any, x: Any, jaxpr: Any = None,
             ) -> tuple[tuple[PolicyOption, ...], tuple[tuple[str, str], ...]]:
    """The options of ``layer(p, x)`` (:func:`layer_menu`, from its marked names and, for a
    ``"dots_ranked"`` on ``menu``, its matmuls), and ``(entry, reason)`` where that entry
    gives it none; ``jaxpr``: ``jax.make_jaxpr(layer)(p, x)`` where already traced."""
    jaxpr = jaxpr if jaxpr is not None else jax.make_jaxpr(layer)(p, x)
    dots = layer_dots(jaxpr) if RANKED in menu else ()
    notes = ranked_notes(menu, dots)
    searching = [entry for entry in menu if entry in (SEARCHED, WIDEST)]
    plus = _plus_options(layer, p, x, jaxpr) if searching else []
    if searching and not plus:
        notes += tuple((entry, _NO_PLUS) for entry in searching)
    return layer_menu(menu, marked_names(layer, p, x, jaxpr), dots, plus), notes
