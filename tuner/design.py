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
little from seed to seed. A space of more than CANDIDATE_ROWS configurations is herded over a
seeded uniform sample of that many of them, which bounds the cost.
"""

from __future__ import annotations

import numpy as np

from pipetune.tuner.encoding import KnobEncoding

REFERENCE_ROWS = 256
# Rows per block of the kernel mean: its distances are (rows x REFERENCE_ROWS), half a
# gigabyte at once for a space of 262,144 configurations; in blocks, a few megabytes.
BLOCK_ROWS = 4096
# The most configurations the design picks among; a larger space's design picks among a
# seeded uniform sample of this many (`design_rows`).
CANDIDATE_ROWS = 1 << 16


def _kernel_mean(
    encoding: KnobEncoding, reference: np.ndarray, scale: float, rows: np.ndarray | None = None
) -> np.ndarray:
    """Each row's mean Laplace kernel value against the reference rows (of `rows`, default
    every row of the space)."""
    count = len(encoding) if rows is None else len(rows)
    out = np.empty(count)
    for start in range(0, count, BLOCK_ROWS):
        block = slice(start, start + BLOCK_ROWS)
        distances = encoding.l1_distances(block if rows is None else rows[block], reference)
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
    if len(encoding) <= CANDIDATE_ROWS:
        return _herded(encoding, None, reference, scale, n, rng)
    # A larger space: the picks come from a seeded uniform sample of CANDIDATE_ROWS of its
    # configurations, which represents it as the whole does (the target, the space's kernel
    # mean, is the reference rows' estimate either way). Herding over every row cost a
    # space of a million configurations 3.7 s and 256 distances per row before its first
    # trial; over the sample, one sixteenth of that.
    candidates = np.sort(rng.choice(len(encoding), size=CANDIDATE_ROWS, replace=False))
    return [int(candidates[i]) for i in _herded(encoding, candidates, reference, scale, n, rng)]


def _herded(
    encoding: KnobEncoding,
    candidates: np.ndarray | None,
    reference: np.ndarray,
    scale: float,
    n: int,
    rng: np.random.Generator,
) -> list[int]:
    """n herding picks among `candidates` (rows of the space; None: every row), as their
    positions there."""
    kernel_mean = _kernel_mean(encoding, reference, scale, candidates)
    count = len(kernel_mean)
    tie_break = rng.permutation(count) / count * 1e-9
    design_kernel_sum = np.zeros(count)  # sum over the picks of k(candidate, pick)
    taken = np.zeros(count, dtype=bool)
    picks: list[int] = []
    among = slice(None) if candidates is None else candidates
    for t in range(n):
        score = kernel_mean - design_kernel_sum / (t + 1) + tie_break
        score[taken] = -np.inf
        pick = int(np.argmax(score))
        taken[pick] = True
        picks.append(pick)
        row = pick if candidates is None else int(candidates[pick])
        # From the compact columns, not features - features[row]: that difference is a copy
        # of the whole feature matrix per pick (0.8 GB for 200,000 configurations of a
        # 500-valued categorical knob, one-hot).
        distances = encoding.l1_distances(among, np.array([row]))[:, 0]
        distances /= -scale
        design_kernel_sum += np.exp(distances, out=distances)
    return picks
