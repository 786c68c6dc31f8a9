"""The simple CNN of the EMD-CFL paper's MNIST experiments (Appendix D.2): conv 64, conv 128,
fc 128 (the embedding), fc classes."""

from __future__ import annotations

import torch
from torch import nn

from .split_model import SplitModel


class SimpleCNN(SplitModel):
    """f = h ∘ g: `embedding` g (two conv blocks, fc → dim(Z)) and `head` h (fc → classes).

    The split is explicit so that EMD-CFL can swap only ω (g's parameters) between silos.
    `pools`: 1 is the authors' network (`src/model.py`: one 2×2 max-pool, after the second
    conv; fc 14·14·128 → 128 on MNIST); 2 pools after each conv, 4× cheaper in the second
    conv and the first fc (docs/research/FIDELITY.md).
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        image_size: int,
        channels: tuple[int, int] = (64, 128),
        embedding_dim: int = 128,
        pools: int = 2,
    ) -> None:
        c1, c2 = channels
        side = image_size // 2**pools
        first_pool = [nn.MaxPool2d(2)] if pools == 2 else []
        embedding = ConvEmbedding(
            nn.Conv2d(in_channels, c1, 3, padding=1),
            nn.ReLU(),
            *first_pool,
            nn.Conv2d(c1, c2, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(c2 * side * side, embedding_dim),
            nn.ReLU(),
        )
        super().__init__(embedding, nn.Linear(embedding_dim, num_classes))


class ConvEmbedding(nn.Sequential):
    """g as a plain `nn.Sequential` (the same parameter names, so the same ω on the wire), with
    a faster inference on the CPU: without autograd (evaluation, EMD-CFL's embeddings), the
    layers before `Flatten` run on chunks of `CHUNK` inputs, and each ReLU + 2×2 max-pool
    becomes the maximum of four strided views, then the ReLU on a quarter of the values. Why:
    torch's CPU max-pool is not vectorised over the channels of an NCHW tensor, and a 512-image
    batch of 64 × 28 × 28 activations (100 MB) spills the caches (`python -m benchmarks.embedding`
    measures the gain; docs/research/PERFORMANCE.md, "Models").

    The values are bit for bit those of the plain forward, which training uses: a maximum is
    exact, and ReLU, being non-decreasing, commutes with it; each convolution sees at least
    `CHUNK` inputs (or the whole batch, if smaller), where oneDNN computes an image
    independently of the others; and the layers from `Flatten` on get the caller's whole batch,
    as before, since a GEMM's rounding of a row can depend on its place in the batch.
    tests/models/test_models.py checks the equality on the machine at hand.
    """

    CHUNK = 64

    def __init__(self, *layers: nn.Module) -> None:
        super().__init__(*layers)
        pools = [m for m in layers if isinstance(m, nn.MaxPool2d)]
        if any((m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode) != (2, 2, 0, 1, False) for m in pools):
            raise ValueError("ConvEmbedding's inference knows only 2x2 max-pools of stride 2")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.device.type != "cpu":
            return super().forward(x)
        layers = list(self)
        flat = next(i for i, layer in enumerate(layers) if isinstance(layer, nn.Flatten))
        starts = list(range(0, len(x), self.CHUNK))[: max(1, len(x) // self.CHUNK)]  # the last takes the rest
        ends = starts[1:] + [len(x)]
        h = torch.cat([_conv_blocks(layers[:flat], x[start:end]) for start, end in zip(starts, ends)])
        for layer in layers[flat:]:
            h = layer(h)
        return h


def _conv_blocks(layers: list[nn.Module], h: torch.Tensor) -> torch.Tensor:
    """The conv blocks' layers in order, with every max-pool (and the ReLU before it) done as
    in ConvEmbedding's docstring."""
    i = 0
    while i < len(layers):
        relu_first = isinstance(layers[i], nn.ReLU) and i + 1 < len(layers) and isinstance(layers[i + 1], nn.MaxPool2d)
        if relu_first or isinstance(layers[i], nn.MaxPool2d):
            h = _max_pool_2x2(h)
            if relu_first:
                h = h.relu_()  # relu(max(a, b)) = max(relu(a), relu(b))
            i += 2 if relu_first else 1
        else:
            h = layers[i](h)
            i += 1
    return h


def _max_pool_2x2(h: torch.Tensor) -> torch.Tensor:
    """max_pool2d(h, 2): the maximum of the four strided views of each 2 × 2 window."""
    h = h[..., : h.shape[-2] // 2 * 2, : h.shape[-1] // 2 * 2]
    return torch.maximum(
        torch.maximum(h[..., 0::2, 0::2], h[..., 0::2, 1::2]), torch.maximum(h[..., 1::2, 0::2], h[..., 1::2, 1::2])
    )
