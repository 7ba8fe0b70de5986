"""Initial design: the first trials of a search that has nothing to model yet.

The design is a small sample that represents the space: kernel herding (Chen, Welling and
Smola, UAI 2010) over the space's own configurations. Each pick is the configuration that
brings the design's kernel mean closest to the space's, so the picks fall where the space's
configurations are, spread out from one another: the first picks are typical configurations,
the later ones fill in around them.

Why not a space-covering design (a scrambled Sobol sequence snapped to the nearest
configuration, the design before this one): a tuning space is a constrained subset of the knob
grid, and snapping to the nearest configuration favours the isolated ones at the edge of the
constraints (their cells of the grid are the largest), which are where configurations fail
(too much shared memory, too many threads) or crawl. Herding samples the space in proportion
to where its configurations are, as random sampling does, without random sampling's clumps.
benchmarks/RESULTS.md ("Tuner: a representative initial design") has the measurement.

The kernel is a Laplace kernel on the L1 distance between the surrogate's features
(tuner/encoding.py: ordered knobs scaled to [0, 1], categorical ones one-hot), its scale the
median distance between configurations (the usual default for kernel two-sample statistics,
Gretton et al., JMLR 2012): nothing is fitted to a space. The space's kernel mean and that
median are estimated from a seeded sample of REFERENCE_ROWS configurations, which keeps the
cost linear in the space's size (60 ms for 17,956 configurations) and varies the design a
little from seed to seed.
"""

from __future__ import annotations

import numpy as np

from pipetune.tuner.encoding import KnobEncoding

REFERENCE_ROWS = 256
# Rows per block of the kernel mean: its distances are (rows x REFERENCE_ROWS), half a
# gigabyte at once for a space of 262,144 configurations; in blocks, a few megabytes.
BLOCK_ROWS = 4096


def _kernel_mean(encoding: KnobEncoding, reference: np.ndarray, scale: float) -> np.ndarray:
    """Each row's mean Laplace kernel value against the reference rows."""
    out = np.empty(len(encoding))
    for start in range(0, len(encoding), BLOCK_ROWS):
        block = slice(start, start + BLOCK_ROWS)
        distances = encoding.l1_distances(block, reference)
        distances /= -scale
        out[block] = np.exp(distances, out=distances).mean(axis=1)
    return out


def design_rows(encoding: KnobEncoding, n: int, seed: int) -> list[int]:
    """Up to n distinct rows representing the space (n is at most the space's size)."""
    n = min(n, len(encoding))
    if n == 0:
        return []
    rng = np.random.default_rng(seed)
    reference = rng.permutation(len(encoding))[:REFERENCE_ROWS]
    pairs = encoding.l1_distances(reference, reference)[np.triu_indices(len(reference), 1)]
    scale = float(np.median(pairs)) if len(pairs) else 1.0
    scale = scale or 1.0  # 0 only where most configurations are alike
    kernel_mean = _kernel_mean(encoding, reference, scale)
    tie_break = rng.permutation(len(encoding)) / len(encoding) * 1e-9
    design_kernel_sum = np.zeros(len(encoding))  # sum over the picks of k(row, pick)
    taken = np.zeros(len(encoding), dtype=bool)
    rows: list[int] = []
    for t in range(n):
        score = kernel_mean - design_kernel_sum / (t + 1) + tie_break
        score[taken] = -np.inf
        row = int(np.argmax(score))
        taken[row] = True
        rows.append(row)
        # From the compact columns, not features - features[row]: that difference is a copy
        # of the whole feature matrix per pick (0.8 GB for 200,000 configurations of a
        # 500-valued categorical knob, one-hot).
        distances = encoding.l1_distances(slice(None), np.array([row]))[:, 0]
        distances /= -scale
        design_kernel_sum += np.exp(distances, out=distances)
    return rows
