"""Computation graphs of ResNet-50, DenseNet-121 and Inception-v3 with real tensor sizes.

One vertex per conv / batch-norm / ReLU / pool / add / concat output (plus input, the
classifier and the loss). Sizes are fp32 bytes of the activation at the given batch and
resolution; costs are forward flops (2 per multiply-add for conv and fc; per element:
4 for batch norm, 1 for ReLU, add and concat, the window size for pooling; 5 per logit
for the loss). Shapes follow the architectures:

* ResNet-50 (He et al. 2016; torchvision v1.5 layout, stride on the 3x3 conv): stem
  conv7x7/2 -> bn -> relu -> maxpool3x3/2, then [3, 4, 6, 3] bottlenecks of widths
  64/128/256/512 (x4 outputs), projection shortcut (1x1 conv + bn) on each stage's first
  block, add, relu; global average pool, fc 1000, loss. Batch 32 at 224x224 by default.
* DenseNet-121 (Huang et al. 2017): stem as ResNet's; dense blocks of [6, 12, 24, 16]
  layers, growth 32, bottleneck width 128 (bn -> relu -> conv1x1 -> bn -> relu -> conv3x3);
  each layer outputs ``concat(input, new features)``, the PyTorch 0.4 layout that Feng &
  Huang parse; transitions bn -> relu -> conv1x1 (halving channels) -> avgpool2x2; final bn,
  relu, global pool, fc, loss. Batch 32 at 224x224.
* Inception-v3 (Szegedy et al. 2016; torchvision layout, each "basic conv" = conv -> bn ->
  relu): stem of five basic convs and two max pools, Mixed 5b-5d (A, pool features
  32/64/64), 6a (B), 6b-6e (C, 7x7 widths 128/160/160/192), 7a (D), 7b-7c (E, whose split
  3x3 branches concatenate their 1x3 and 3x1 halves first); global pool, fc, loss. The
  auxiliary classifier is left out. Batch 32 at 299x299.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solver import Graph  # noqa: E402

__all__ = ["resnet50", "densenet121", "inception_v3", "GRAPHS"]

BYTES = 4  # fp32


class _Builder:
    """Collects vertices ``(name, shape, flops)`` and edges, then builds a Graph."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.sizes: dict[str, float] = {}
        self.costs: dict[str, float] = {}
        self.shapes: dict[str, tuple[int, int, int]] = {}
        self.edges: list[tuple[str, str]] = []

    def add(self, name: str, shape: tuple[int, int, int], flops: float, inputs: Sequence[str]) -> str:
        c, h, w = shape
        self.sizes[name] = float(self.batch * c * h * w * BYTES)
        self.costs[name] = float(flops)
        self.shapes[name] = shape
        self.edges.extend((i, name) for i in inputs)
        return name

    def elements(self, name: str) -> int:
        c, h, w = self.shapes[name]
        return self.batch * c * h * w

    def input(self, name: str, shape: tuple[int, int, int]) -> str:
        return self.add(name, shape, 0.0, ())

    def conv(self, name: str, x: str, out: int, kernel: tuple[int, int], stride: int = 1,
             padding: tuple[int, int] | None = None) -> str:
        c, h, w = self.shapes[x]
        kh, kw = kernel
        ph, pw = padding if padding is not None else (kh // 2, kw // 2)
        ho = (h + 2 * ph - kh) // stride + 1
        wo = (w + 2 * pw - kw) // stride + 1
        flops = 2.0 * self.batch * c * out * kh * kw * ho * wo
        return self.add(name, (out, ho, wo), flops, (x,))

    def pointwise(self, name: str, x: str, flops_per_element: float) -> str:
        return self.add(name, self.shapes[x], flops_per_element * self.elements(x), (x,))

    def bn(self, name: str, x: str) -> str:
        return self.pointwise(name, x, 4.0)

    def relu(self, name: str, x: str) -> str:
        return self.pointwise(name, x, 1.0)

    def pool(self, name: str, x: str, kernel: int, stride: int, padding: int = 0) -> str:
        c, h, w = self.shapes[x]
        ho = (h + 2 * padding - kernel) // stride + 1
        wo = (w + 2 * padding - kernel) // stride + 1
        return self.add(name, (c, ho, wo), float(kernel * kernel * self.batch * c * ho * wo), (x,))

    def global_pool(self, name: str, x: str) -> str:
        c, _, _ = self.shapes[x]
        return self.add(name, (c, 1, 1), float(self.elements(x)), (x,))

    def add_op(self, name: str, xs: Sequence[str]) -> str:
        return self.add(name, self.shapes[xs[0]], float(self.elements(xs[0])), xs)

    def concat(self, name: str, xs: Sequence[str]) -> str:
        _, h, w = self.shapes[xs[0]]
        c = sum(self.shapes[x][0] for x in xs)
        return self.add(name, (c, h, w), float(self.batch * c * h * w), xs)

    def conv_bn_relu(self, name: str, x: str, out: int, kernel, stride: int = 1, padding=None) -> str:
        kernel = (kernel, kernel) if isinstance(kernel, int) else kernel
        y = self.conv(f"{name}.conv", x, out, kernel, stride, padding)
        return self.relu(f"{name}.relu", self.bn(f"{name}.bn", y))

    def head(self, x: str, classes: int = 1000) -> Graph:
        pooled = self.global_pool("avgpool", x)
        c = self.shapes[pooled][0]
        logits = self.add("fc", (classes, 1, 1), 2.0 * self.batch * c * classes, (pooled,))
        self.add("loss", (1, 1, 1), 5.0 * self.batch * classes, (logits,))
        self.sizes["loss"] = float(BYTES)  # a scalar, not per example
        return Graph.from_edges(self.edges, self.sizes, self.costs)


def resnet50(batch: int = 32, resolution: int = 224) -> Graph:
    """ResNet-50: stem, [3, 4, 6, 3] bottlenecks with projection shortcuts, head."""
    b = _Builder(batch)
    x = b.input("input", (3, resolution, resolution))
    x = b.relu("stem.relu", b.bn("stem.bn", b.conv("stem.conv", x, 64, (7, 7), 2, (3, 3))))
    x = b.pool("stem.maxpool", x, 3, 2, 1)
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        for block in range(blocks):
            p = f"layer{stage}.{block}"
            stride = 2 if stage > 1 and block == 0 else 1
            y = b.conv_bn_relu(f"{p}.1", x, width, 1)
            y = b.conv_bn_relu(f"{p}.2", y, width, 3, stride)
            y = b.bn(f"{p}.3.bn", b.conv(f"{p}.3.conv", y, 4 * width, (1, 1)))
            if block == 0:
                shortcut = b.bn(f"{p}.down.bn", b.conv(f"{p}.down.conv", x, 4 * width, (1, 1), stride, (0, 0)))
            else:
                shortcut = x
            x = b.relu(f"{p}.relu", b.add_op(f"{p}.add", (y, shortcut)))
    return b.head(x)


def densenet121(batch: int = 32, resolution: int = 224) -> Graph:
    """DenseNet-121: [6, 12, 24, 16] dense layers, growth 32, transitions halving channels."""
    b = _Builder(batch)
    x = b.input("input", (3, resolution, resolution))
    x = b.relu("stem.relu", b.bn("stem.bn", b.conv("stem.conv", x, 64, (7, 7), 2, (3, 3))))
    x = b.pool("stem.maxpool", x, 3, 2, 1)
    for block, layers in enumerate((6, 12, 24, 16), start=1):
        for layer in range(layers):
            p = f"block{block}.{layer}"
            y = b.relu(f"{p}.relu1", b.bn(f"{p}.bn1", x))
            y = b.conv(f"{p}.conv1", y, 128, (1, 1))
            y = b.relu(f"{p}.relu2", b.bn(f"{p}.bn2", y))
            y = b.conv(f"{p}.conv2", y, 32, (3, 3))
            x = b.concat(f"{p}.cat", (x, y))
        if block < 4:
            p = f"transition{block}"
            y = b.relu(f"{p}.relu", b.bn(f"{p}.bn", x))
            y = b.conv(f"{p}.conv", y, b.shapes[x][0] // 2, (1, 1))
            x = b.pool(f"{p}.avgpool", y, 2, 2)
    x = b.relu("final.relu", b.bn("final.bn", x))
    return b.head(x)


def inception_v3(batch: int = 32, resolution: int = 299) -> Graph:
    """Inception-v3: stem, Mixed 5b-5d (A), 6a (B), 6b-6e (C), 7a (D), 7b-7c (E), head."""
    b = _Builder(batch)
    cbr = b.conv_bn_relu
    x = b.input("input", (3, resolution, resolution))
    x = cbr("Conv2d_1a", x, 32, 3, 2, (0, 0))
    x = cbr("Conv2d_2a", x, 32, 3, 1, (0, 0))
    x = cbr("Conv2d_2b", x, 64, 3, 1, (1, 1))
    x = b.pool("maxpool1", x, 3, 2)
    x = cbr("Conv2d_3b", x, 80, 1)
    x = cbr("Conv2d_4a", x, 192, 3, 1, (0, 0))
    x = b.pool("maxpool2", x, 3, 2)

    def module_a(p: str, x: str, pool_features: int) -> str:
        b1 = cbr(f"{p}.1x1", x, 64, 1)
        b5 = cbr(f"{p}.5x5_2", cbr(f"{p}.5x5_1", x, 48, 1), 64, 5)
        b3 = cbr(f"{p}.3x3dbl_1", x, 64, 1)
        b3 = cbr(f"{p}.3x3dbl_3", cbr(f"{p}.3x3dbl_2", b3, 96, 3), 96, 3)
        bp = cbr(f"{p}.pool_proj", b.pool(f"{p}.avgpool", x, 3, 1, 1), pool_features, 1)
        return b.concat(f"{p}.cat", (b1, b5, b3, bp))

    def module_b(p: str, x: str) -> str:
        b3 = cbr(f"{p}.3x3", x, 384, 3, 2, (0, 0))
        bd = cbr(f"{p}.3x3dbl_2", cbr(f"{p}.3x3dbl_1", x, 64, 1), 96, 3)
        bd = cbr(f"{p}.3x3dbl_3", bd, 96, 3, 2, (0, 0))
        bp = b.pool(f"{p}.maxpool", x, 3, 2)
        return b.concat(f"{p}.cat", (b3, bd, bp))

    def module_c(p: str, x: str, c7: int) -> str:
        b1 = cbr(f"{p}.1x1", x, 192, 1)
        b7 = cbr(f"{p}.7x7_1", x, c7, 1)
        b7 = cbr(f"{p}.7x7_3", cbr(f"{p}.7x7_2", b7, c7, (1, 7)), 192, (7, 1))
        bd = cbr(f"{p}.7x7dbl_1", x, c7, 1)
        bd = cbr(f"{p}.7x7dbl_2", bd, c7, (7, 1))
        bd = cbr(f"{p}.7x7dbl_3", bd, c7, (1, 7))
        bd = cbr(f"{p}.7x7dbl_4", bd, c7, (7, 1))
        bd = cbr(f"{p}.7x7dbl_5", bd, 192, (1, 7))
        bp = cbr(f"{p}.pool_proj", b.pool(f"{p}.avgpool", x, 3, 1, 1), 192, 1)
        return b.concat(f"{p}.cat", (b1, b7, bd, bp))

    def module_d(p: str, x: str) -> str:
        b3 = cbr(f"{p}.3x3_2", cbr(f"{p}.3x3_1", x, 192, 1), 320, 3, 2, (0, 0))
        b7 = cbr(f"{p}.7x7x3_1", x, 192, 1)
        b7 = cbr(f"{p}.7x7x3_3", cbr(f"{p}.7x7x3_2", b7, 192, (1, 7)), 192, (7, 1))
        b7 = cbr(f"{p}.7x7x3_4", b7, 192, 3, 2, (0, 0))
        bp = b.pool(f"{p}.maxpool", x, 3, 2)
        return b.concat(f"{p}.cat", (b3, b7, bp))

    def module_e(p: str, x: str) -> str:
        b1 = cbr(f"{p}.1x1", x, 320, 1)
        b3 = cbr(f"{p}.3x3_1", x, 384, 1)
        b3 = b.concat(f"{p}.3x3.cat", (cbr(f"{p}.3x3_2a", b3, 384, (1, 3)), cbr(f"{p}.3x3_2b", b3, 384, (3, 1))))
        bd = cbr(f"{p}.3x3dbl_2", cbr(f"{p}.3x3dbl_1", x, 448, 1), 384, 3)
        bd = b.concat(f"{p}.3x3dbl.cat",
                      (cbr(f"{p}.3x3dbl_3a", bd, 384, (1, 3)), cbr(f"{p}.3x3dbl_3b", bd, 384, (3, 1))))
        bp = cbr(f"{p}.pool_proj", b.pool(f"{p}.avgpool", x, 3, 1, 1), 192, 1)
        return b.concat(f"{p}.cat", (b1, b3, bd, bp))

    for name, features in (("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)):
        x = module_a(name, x, features)
    x = module_b("Mixed_6a", x)
    for name, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
        x = module_c(name, x, c7)
    x = module_d("Mixed_7a", x)
    x = module_e("Mixed_7b", x)
    x = module_e("Mixed_7c", x)
    return b.head(x)


GRAPHS = {"ResNet-50": resnet50, "DenseNet-121": densenet121, "Inception-v3": inception_v3}
