"""Realistic chains: byte sizes and flop counts of common network shapes, and random chains.

The demo and the benchmarks compare schedules on these. Sizes are in bytes (integers),
times are floating-point operation counts (flops), so a chain's time is proportional to
the work done; "backward = 2 x forward" is the usual rule (one product for the input
gradient, one for the weight gradient). Each layer's tape follows what autodiff keeps for
its backward (ALGORITHMS.md section 6): the inputs of its matrix products and
normalisations, the outputs of its activations, and the layer's output, which Rotor's model
counts in the tape (section 1); the layer's input ``x[i]`` is not in its tape.

Notation: ``B`` batch, ``E`` bytes per value, ``H x H`` spatial size, ``C`` channels,
``S`` sequence length, ``D`` hidden size, ``h`` attention heads, ``r`` MLP ratio.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .chain import Chain
from .options import LayerOptions

__all__ = ["resnet_like", "transformer_like", "random_chain", "with_random_options"]


class _Builder:
    """Accumulates layers: ``x_size`` starts with the chain's input."""

    def __init__(self, input_bytes: float) -> None:
        self.x = [input_bytes]
        self.fwd, self.bwd, self.xbar, self.ftmp, self.btmp = [], [], [], [], []

    def add(self, *, out: float, tape: float, flops: float, fwd_tmp: float, bwd_tmp: float) -> None:
        """Append a layer with output size ``out``; ``tape`` excludes the output (added here)."""
        self.x.append(out)
        self.xbar.append(tape + out)
        self.fwd.append(flops)
        self.bwd.append(2.0 * flops)
        self.ftmp.append(fwd_tmp)
        self.btmp.append(bwd_tmp)

    def chain(self) -> Chain:
        return Chain(fwd_time=self.fwd, bwd_time=self.bwd, x_size=self.x,
                     xbar_size=self.xbar, fwd_tmp=self.ftmp, bwd_tmp=self.btmp)


def resnet_like(
    *,
    batch: int = 32,
    resolution: int = 224,
    widths: Sequence[int] = (64, 128, 256, 512),
    depths: Sequence[int] = (3, 4, 6, 3),
    num_classes: int = 1000,
    bytes_per_value: int = 4,
) -> Chain:
    """A ResNet with basic blocks (He et al. 2016): one layer per block, plus stem and head.

    The defaults are ResNet-34 on ImageNet-sized input: ``1 + sum(depths) + 1`` layers.
    With ``A = B * H * H * C * E`` a block's output size:

    - stem (conv 7x7 stride 2, 3 -> C0, BN, ReLU, max-pool 3x3 stride 2): output at
      ``H = resolution / 4``; tape = the conv output and the ReLU output at ``resolution / 2``
      (BN's and the pool's inputs) + the output; flops ``2 * 49 * 3 * C0 * (R/2)^2 * B``;
      ``fwd_tmp`` = one map at ``R/2`` (BN's output before the ReLU), ``bwd_tmp`` two.
    - basic block ``Cin -> C`` (conv 3x3, BN, ReLU, conv 3x3, BN, + shortcut, ReLU); the first
      block of every stage but the first has stride 2 and a 1x1 projection shortcut (with
      BN): tape = conv1 out, ReLU1 out, conv2 out (+ projection out) + the output, i.e.
      ``4 A`` or ``5 A``; flops ``2 * 9 * (Cin + C) * C * H^2 * B`` (+ ``2 Cin C H^2 B``);
      ``fwd_tmp = A`` (a BN output before its ReLU), ``bwd_tmp = 2 A`` (two gradient maps).
    - head (global average pool, dense to ``num_classes``): tape = pooled features + logits;
      flops ``2 * B * C * num_classes``; no temporaries.

    Tapes are larger than outputs (BN and ReLU keep extra maps), and sizes shrink by 2x per
    stage (spatial /4, channels x2) while the flops per block stay roughly constant.
    """
    if len(widths) != len(depths) or not widths:
        raise ValueError("resnet_like needs one width per stage and one depth per stage.")
    E, B = bytes_per_value, batch
    h_stem = math.ceil(resolution / 2)
    h = math.ceil(h_stem / 2)
    stem_map = B * h_stem * h_stem * widths[0] * E
    chain = _Builder(B * resolution * resolution * 3 * E)
    chain.add(out=B * h * h * widths[0] * E, tape=2 * stem_map,
              flops=2.0 * 49 * 3 * widths[0] * h_stem * h_stem * B,
              fwd_tmp=stem_map, bwd_tmp=2 * stem_map)
    c_in = widths[0]
    for stage, (width, depth) in enumerate(zip(widths, depths)):
        for block in range(depth):
            project = block == 0 and (stage > 0 or c_in != width)
            if block == 0 and stage > 0:
                h = math.ceil(h / 2)
            A = B * h * h * width * E
            flops = 2.0 * 9 * (c_in + width) * width * h * h * B
            if project:
                flops += 2.0 * c_in * width * h * h * B
            chain.add(out=A, tape=(4 if project else 3) * A, flops=flops, fwd_tmp=A, bwd_tmp=2 * A)
            c_in = width
    pooled = B * c_in * E
    chain.add(out=B * num_classes * E, tape=pooled, flops=2.0 * B * c_in * num_classes,
              fwd_tmp=0, bwd_tmp=0)
    return chain.chain()


def transformer_like(
    *,
    num_blocks: int = 12,
    batch: int = 8,
    seq_len: int = 1024,
    hidden: int = 768,
    heads: int = 12,
    mlp_ratio: int = 4,
    bytes_per_value: int = 2,
) -> Chain:
    """A pre-LayerNorm Transformer encoder: ``2 * num_blocks`` layers, attention then MLP.

    Defaults: GPT-2-small sizes in bfloat16. Every activation is ``T = B * S * D * E``.

    - attention ``x + Wo(softmax(Q K^T / sqrt(d)) V)`` with ``Q, K, V = LN(x) W``:
      tape = LN output, Q, K, V, the softmax probabilities ``P = B * h * S^2 * E`` (the
      seq^2 scores), the context (Wo's input) + the output: ``6 T + P``;
      flops ``8 B S D^2 + 4 B S^2 D``; ``fwd_tmp = P`` (the scores before the softmax),
      ``bwd_tmp = P + 3 T`` (gradient of the scores, and of Q, K, V).
    - MLP ``x + W2 gelu(W1 LN(x))``: tape = LN output, W1's output (GELU's input), GELU's
      output (W2's input) + the output: ``(2 + 2 r) T``; flops ``4 r B S D^2``;
      ``fwd_tmp = 0``, ``bwd_tmp = r T`` (gradient of the hidden layer).
    """
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads}).")
    B, S, D, E = batch, seq_len, hidden, bytes_per_value
    T = B * S * D * E
    P = B * heads * S * S * E
    chain = _Builder(T)
    for _ in range(num_blocks):
        chain.add(out=T, tape=5 * T + P, flops=8.0 * B * S * D * D + 4.0 * B * S * S * D,
                  fwd_tmp=P, bwd_tmp=P + 3 * T)
        chain.add(out=T, tape=(1 + 2 * mlp_ratio) * T, flops=4.0 * mlp_ratio * B * S * D * D,
                  fwd_tmp=0, bwd_tmp=mlp_ratio * T)
    return chain.chain()


def random_chain(
    length: int,
    seed: int,
    *,
    max_size: int = 100,
    max_time: int = 10,
    temporaries: bool = True,
    tape_forwards: bool = False,
) -> Chain:
    """A random heterogeneous chain with integer sizes and times (for tests and benchmarks).

    ``x_size`` uniform in ``1..max_size``; each tape is its output plus a uniform
    ``0..max_size``; ``fwd_tmp`` and ``bwd_tmp`` uniform in ``0..max_size // 2`` (zero without
    ``temporaries``); ``fwd_time`` uniform in ``1..max_time`` and ``bwd_time`` in
    ``1..2 max_time``; with ``tape_forwards``, ``fwd_tape_time`` uniform in
    ``0..fwd_time`` (drawn last: the other fields do not change). Same ``seed``, same chain.
    """
    if length < 1:
        raise ValueError(f"A chain needs at least one layer, got length={length}.")
    rng = np.random.default_rng(seed)
    x = rng.integers(1, max_size + 1, length + 1)
    xbar = x[1:] + rng.integers(0, max_size + 1, length)
    tmp_high = max_size // 2 + 1 if temporaries else 1
    fwd = rng.integers(1, max_time + 1, length).astype(float)
    bwd = rng.integers(1, 2 * max_time + 1, length).astype(float)
    ftmp = rng.integers(0, tmp_high, length)
    btmp = rng.integers(0, tmp_high, length)
    tape = np.floor(rng.random(length) * (fwd + 1)) if tape_forwards else None
    return Chain(fwd_time=fwd, bwd_time=bwd, x_size=x, xbar_size=xbar, fwd_tmp=ftmp,
                 bwd_tmp=btmp, fwd_tape_time=tape)


def with_random_options(chain: Chain, seed: int, *, options: int = 4,
                        varying: bool = False) -> Chain:
    """``chain`` with random "save" options (:mod:`solver.chain.options`), for tests and
    benchmarks; sizes and times stay integers when the chain's are.

    Each layer gets ``options`` options (with ``varying``, a uniform ``1 .. options``), as a
    checkpoint policy would give them: option ``k >= 1`` keeps the output plus a uniform
    fraction of the rest of the whole tape, and its backward recomputes a uniform fraction
    of the forward (``bwd_time + round(r * fwd_time)``); same ``fwd_time``, ``fwd_tape_time``
    uniform in ``0..fwd_time``, ``fwd_tmp`` and ``bwd_tmp`` uniform in ``0..`` the layer's
    own, ``output_in_tape`` a coin toss. Same ``seed``, same options.
    """
    if options < 1:
        raise ValueError(f"A layer has at least one option, got options={options}.")
    rng = np.random.default_rng(seed)
    extra = []
    for i in range(chain.length):
        count = int(rng.integers(1, options + 1)) if varying else options
        out, whole, fwd = chain.x_size[i + 1], chain.xbar_size[i], chain.fwd_time[i]
        row = []
        for _ in range(count - 1):
            row.append(dict(
                xbar_size=out + np.floor(rng.random() * (whole - out + 1)),
                bwd_time=chain.bwd_time[i] + np.round(rng.random() * fwd),
                fwd_time=fwd,
                fwd_tape_time=np.floor(rng.random() * (fwd + 1)),
                fwd_tmp=np.floor(rng.random() * (chain.fwd_tmp[i] + 1)),
                bwd_tmp=np.floor(rng.random() * (chain.bwd_tmp[i] + 1)),
                output_in_tape=bool(rng.integers(0, 2)),
            ))
        extra.append(row)
    return chain.with_options(LayerOptions.from_columns(chain, extra))
