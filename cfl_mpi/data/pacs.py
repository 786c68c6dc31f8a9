"""PACS (Li et al., 2017) from a local folder in the usual layout `<root>/<domain>/<class>/<image>`.

Domains: photo, art_painting, cartoon, sketch; 7 classes (dog, elephant, giraffe, guitar,
horse, house, person), numbered in sorted order of the class folder names. There is no
download: the data set is distributed as an archive to unpack into `data.root`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

EXTENSIONS = (".jpg", ".jpeg", ".png")
LAYOUT = f"DIR/<domain>/<class>/ holds the images ({', '.join(EXTENSIONS)}), one folder per domain of data.domains"
# The paper's 80/10/10 split of each silo's images (EMD-CFL paper, §4.1), and the authors' code's
# (`pacs.ipynb`): 20 % of the domain for testing, then 80/20 of each silo's share (data.pacs_split).
TEST_FRACTION, VAL_FRACTION = 0.1, 0.1
AUTHORS_TEST_FRACTION, AUTHORS_VAL_FRACTION = 0.2, 0.2


def missing_domains(root: Path, domains: list[str]) -> list[str]:
    return [d for d in domains if not (root / d).is_dir()]


def class_names(root: Path, domains: list[str]) -> list[str]:
    """Sorted class folder names over the domains (PACS: the same 7 in every domain)."""
    return sorted({c.name for d in domains for c in (root / d).iterdir() if c.is_dir()})


def list_domain(root: Path, domain: str, classes: list[str]) -> tuple[list[Path], np.ndarray]:
    """A domain's image files in a fixed (sorted) order, and their labels."""
    paths, labels = [], []
    for label, name in enumerate(classes):
        folder = root / domain / name
        if folder.is_dir():
            files = sorted(p for p in folder.iterdir() if p.suffix.lower() in EXTENSIONS and p.is_file())
            paths += files
            labels += [label] * len(files)
    return paths, np.asarray(labels, dtype=np.int64)


def read_images(paths: list[Path], size: int) -> np.ndarray:
    """Decode, convert to RGB and resize (bilinear) a list of image files: (n, size, size, 3) uint8."""
    from PIL import Image

    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    for i, path in enumerate(paths):
        with Image.open(path) as img:
            rgb = img.convert("RGB")
            if rgb.size != (size, size):
                rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
            out[i] = np.asarray(rgb)
    return out
