"""The cluster rules' default cuts, written once: EMD-CFL's config defaults and the extraction
functions' read them here (no numpy, so the light strategy registry can import it)."""

from __future__ import annotations

#: The robust rule's cut in noise units (why 3.5: `extraction.robust_clusters`).
NOISE_MULTIPLE = 3.5
#: The paper's ε for its neighbourhoods rule (EMD-CFL, §3 "Clustering").
EPSILON = 0.025
#: The robust rule's clear gap the federation suite supports where W compares whole samples
#: (`strategy.clear_gap: auto`): a split is kept where its clusters join this many times higher
#: than their members did (why 3: docs/methods/emdcfl.md, "A clear gap").
CLEAR_GAP = 3.0
