"""Image transforms shared by the data sets: resizing, rotation, normalisation.

Batches are (n, h, w) for grey images and (n, h, w, 3) for colour images, floats in [0, 1],
until `to_model_input` turns them into the model's normalised float32 NCHW arrays. A silo keeps
its images as `kept_images` gives them: as the source's bytes where every pixel still is one
(`PixelCodes`), the floats otherwise.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

Stats = float | tuple[float, ...]  # a mean or deviation: one for every channel, or one per channel

# MNIST's pixel statistics; the upsampled digits are close enough to share them.
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
# Per-channel statistics of CIFAR-10's training set and of ImageNet (what torchvision's
# pretrained models expect).
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def unit(images: np.ndarray) -> np.ndarray:
    """uint8 pixels → float32 in [0, 1]; float images pass unchanged."""
    return images.astype(np.float32) / 255.0 if images.dtype == np.uint8 else images


def resize(images: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of a (n, h, w[, c]) float batch to (n, size, size[, c]): scipy.ndimage's
    `zoom(order=1)` to the bit, written out in numpy because importing scipy.ndimage costs a
    rank more CPU than its whole data set (a cost 40 ranks pay at once)."""
    n, h, w = images.shape[:3]
    if (h, w) == (size, size):
        return images
    rows, cols = _linear_samples(h, size), _linear_samples(w, size)
    tail = (None,) * (images.ndim - 3)
    out = np.empty((n, size, size, *images.shape[3:]), images.dtype)
    wy0, wy1 = (w_[(None, slice(None), None) + tail] for w_ in (rows.w_low, rows.w_high))
    wx0, wx1 = (w_[(None, None, slice(None)) + tail] for w_ in (cols.w_low, cols.w_high))
    step = max(1, RESIZE_CHUNK // out[0].size)  # float64 temporaries of a few MB, however many images
    for start in range(0, n, step):
        v = images[start : start + step].astype(np.float64)
        top, bottom = v[:, rows.low], v[:, rows.high]
        # scipy's sum over the four neighbours, each the pixel times its row's then its column's weight
        total = top[:, :, cols.low] * wy0 * wx0
        total += top[:, :, cols.high] * wy0 * wx1
        total += bottom[:, :, cols.low] * wy1 * wx0
        total += bottom[:, :, cols.high] * wy1 * wx1
        out[start : start + step] = total
    return out


RESIZE_CHUNK = 1 << 19  # output values a chunk


class _Samples(NamedTuple):
    low: np.ndarray  # the input index at or below each output sample
    high: np.ndarray  # the next one (the same at the last pixel)
    w_low: np.ndarray
    w_high: np.ndarray


def _linear_samples(n_in: int, n_out: int) -> _Samples:
    """Where `zoom` samples one axis: output o at input o * (n_in - 1) / (n_out - 1), weighted
    linearly between its two neighbours; a sample that rounding puts past the last pixel is
    scipy's 'constant' fill, 0 (both weights 0)."""
    step = (n_in - 1) / (n_out - 1) if n_out > 1 else 1.0
    at = np.arange(n_out, dtype=np.float64) * step
    floor = np.floor(at)
    frac = at - floor
    inside = at <= n_in - 1
    low = np.minimum(floor.astype(np.intp), n_in - 1)
    return _Samples(low, np.minimum(low + 1, n_in - 1), np.where(inside, 1.0 - frac, 0.0), np.where(inside, frac, 0.0))


def rotate(images: np.ndarray, angle: float, expand: bool = False, border: int = 0) -> np.ndarray:
    """Rotate a (n, h, w[, c]) batch counter-clockwise by `angle` degrees about its centre,
    as the authors' notebooks do (torchvision's `rotate` on PIL images: nearest neighbour,
    black fill). `border` black pixels are added around each image first, and `expand`
    grows the frame to hold the whole rotated image (`rotcifar10.ipynb`; the caller resizes).
    Multiples of 90° on a square frame are exact transposes (PIL's own shortcut)."""
    if border:
        pad = ((0, 0), (border, border), (border, border)) + ((0, 0),) * (images.ndim - 3)
        images = np.pad(images, pad)
    quarter, rest = divmod(float(angle), 90.0)
    if rest == 0.0 and images.shape[1] == images.shape[2]:
        return np.ascontiguousarray(np.rot90(images, k=int(quarter) % 4, axes=(1, 2)))
    from PIL import Image

    def turn(plane: np.ndarray) -> np.ndarray:  # one float32 channel, PIL mode "F"
        return np.asarray(Image.fromarray(plane, mode="F").rotate(angle, Image.Resampling.NEAREST, expand))

    planes = images.astype(np.float32, copy=False)
    if planes.ndim == 3:
        return np.stack([turn(p) for p in planes])
    return np.stack([np.stack([turn(p[..., k]) for k in range(p.shape[-1])], axis=-1) for p in planes])


def to_model_input(
    images01: np.ndarray,
    mean: Stats = MNIST_MEAN,
    std: Stats = MNIST_STD,
    channels: int | None = None,
) -> np.ndarray:
    """(n, h, w) or (n, h, w, c) in [0, 1] → normalised float32 (n, c, h, w).

    `channels=3` repeats a grey batch into three channels (for the ImageNet models); `mean`
    and `std` are one number or one per channel.
    """
    if images01.ndim == 3:
        images01 = images01[..., None]
    if channels is not None and images01.shape[-1] != channels:
        images01 = np.repeat(images01, channels, axis=-1)
    return model_layout(((images01 - np.asarray(mean)) / np.asarray(std)).astype(np.float32))


@dataclass(frozen=True, eq=False)
class PixelCodes:
    """Images whose every pixel is one of a uint8 source's levels, kept as those bytes and made
    the model's float32 input on each read, to the bits `to_model_input` gives the floats: a
    quarter of the memory (a twelfth for a grey image fed to a 3-channel model) for a silo that
    keeps its images the whole run."""

    codes: np.ndarray  # uint8, (n, h, w) or (n, h, w, c)
    mean: Stats
    std: Stats
    channels: int | None

    def __len__(self) -> int:
        return len(self.codes)

    def floats(self) -> np.ndarray:
        """`to_model_input(unit(codes), …)`, read from a table of each channel's 256 values: a
        lookup is faster than the arithmetic it replaces (most where channels are made from
        one) and gives its bits, the arithmetic being per pixel."""
        nhwc = self.codes if self.codes.ndim == 4 else self.codes[..., None]
        table = _level_values(self.mean, self.std, nhwc.shape[-1], self.channels)
        planes = [np.take(table[:, k], nhwc[..., min(k, nhwc.shape[-1] - 1)]) for k in range(table.shape[1])]
        return model_layout(planes[0].reshape(*nhwc.shape[:3], 1) if len(planes) == 1 else np.stack(planes, -1))


@functools.lru_cache(maxsize=16)
def _level_values(mean: Stats, std: Stats, channels_in: int, channels: int | None) -> np.ndarray:
    """(256, channels out) float32: the model input of each uint8 level in each channel."""
    levels = np.repeat(np.arange(256, dtype=np.uint8).reshape(256, 1, 1, 1), channels_in, axis=-1)
    return to_model_input(unit(levels), mean, std, channels)[:, :, 0, 0].copy()


Images = np.ndarray | PixelCodes  # a silo's images: the model's input, or its pixels' codes


def kept_images(
    images01: np.ndarray, mean: Stats = MNIST_MEAN, std: Stats = MNIST_STD, channels: int | None = None
) -> Images:
    """What a silo keeps of a batch in [0, 1]: its bytes where `unit` of them gives these very
    floats (a uint8 source turned by quarter turns, cropped, resized by PIL in bytes), the
    model's input (`to_model_input`) otherwise."""
    codes = byte_codes(images01)
    return to_model_input(images01, mean, std, channels) if codes is None else PixelCodes(codes, mean, std, channels)


def byte_codes(images01: np.ndarray) -> np.ndarray | None:
    """The uint8 codes k of float32 pixels that are each exactly `unit`'s k / 255 (bit for bit:
    -0.0 is not 0), or None where any pixel is not."""
    if images01.dtype != np.float32:
        return None
    levels = np.rint(images01 * np.float32(255.0))
    if not (levels.min(initial=0.0) >= 0.0 and levels.max(initial=0.0) <= 255.0):  # NaN fails too
        return None
    codes = levels.astype(np.uint8)
    return codes if np.array_equal(unit(codes).view(np.uint32), images01.view(np.uint32)) else None


def as_floats(images: Images) -> np.ndarray:
    """The model's float32 input of a silo's images."""
    return images.floats() if isinstance(images, PixelCodes) else images


def read_rgb(path: Path, size: int | None = None) -> np.ndarray:
    """An image file decoded and converted to RGB, resized (bilinear) to size x size unless
    `size` is None: (h, w, 3) uint8."""
    from PIL import Image

    with Image.open(path) as img:
        rgb = img.convert("RGB")
        if size is not None and rgb.size != (size, size):
            rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
        return np.asarray(rgb)


GREY_MODES = ("1", "L", "LA", "La", "F")  # PIL modes of 8-bit (or float) grey, alpha dropped
DEEP_GREY_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N")  # 16-bit grey: read without losing its depth


def read_image(path: Path, size: int | None = None, channels: int | None = None) -> np.ndarray:
    """An image file as (h, w, c): grey images (PIL modes `GREY_MODES`) one channel, every
    other mode RGB (alpha dropped, palettes looked up), unless `channels` (1 or 3) forces one:
    grey repeated into three, or colour made grey by PIL's luma (ITU-R 601-2). uint8, except
    16-bit grey, float32 in [0, 1] (its 65,536 levels kept). Resized (bilinear) to size x size
    unless `size` is None. PIL decodes the whole file here: a damaged one raises."""
    from PIL import Image

    with Image.open(path) as img:
        if img.mode in DEEP_GREY_MODES:
            deep = img.convert("F")  # exact: every 16-bit level is a float32
            if size is not None and deep.size != (size, size):
                deep = deep.resize((size, size), Image.Resampling.BILINEAR)
            grey = np.asarray(deep, dtype=np.float32)[..., None] / np.float32(65535.0)
            return np.repeat(grey, 3, axis=-1) if channels == 3 else grey
        native = 1 if img.mode in GREY_MODES else 3
        decoded = img.convert("L" if (channels or native) == 1 else "RGB")
        if size is not None and decoded.size != (size, size):
            decoded = decoded.resize((size, size), Image.Resampling.BILINEAR)
        pixels = np.asarray(decoded)
        return pixels[..., None] if pixels.ndim == 2 else pixels


def rows_of(parts: Sequence[np.ndarray], order: np.ndarray) -> np.ndarray:
    """Rows `order` of the parts' rows taken one after another, in the layout the parts have
    (`model_layout`'s for images of one channel: torch's kernels follow the strides)."""
    if parts[0].ndim == 4 and parts[0].shape[1] == 1:
        return model_layout(np.concatenate([p.transpose(0, 2, 3, 1) for p in parts])[order])
    return np.concatenate(parts)[order]


def model_layout(nhwc: np.ndarray) -> np.ndarray:
    """A fresh (n, h, w, c) float32 batch as the (n, c, h, w) array every silo trains on. With
    one channel no copy is made and the channel axis keeps its stride of one element, which
    torch reads as channels-last: its kernels, and so their rounding, follow the strides, so
    every data set hands torch this one layout."""
    return np.ascontiguousarray(nhwc.transpose(0, 3, 1, 2))
