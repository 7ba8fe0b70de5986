"""ALCOP's qualitative findings, as the model predicts them on H100."""

from __future__ import annotations

import numpy as np

from pipetune.model import roofline
from pipetune.model.analytical import evaluate
from pipetune.model.operators import ALCOP
from pipetune.model.pipelining import pipelining_gain
from pipetune.model.space import Space


def _gain(name, gpu):
    space = Space.enumerate(ALCOP[name], gpu)
    return pipelining_gain(space, evaluate(space).T_kernel).speedup_over_non_pipelined


def test_pipelining_helps_small_output_long_k_most(h100):
    fc = _gain("MM_RN50_FC", h100)
    square = _gain("MM_Square_4k", h100)
    qk = _gain("BMM_GPT2_QK", h100)
    assert fc > 1.0 and square > 1.0 and qk >= 1.0
    assert fc > square
    assert fc > qk


def test_model_never_beats_the_roofline_compute_bound(h100):
    for name in ("MM_Square_4k", "BMM_BERT_SV", "Conv2D_RN50_3"):
        space = Space.enumerate(ALCOP[name], h100)
        assert np.all(evaluate(space).T_kernel >= roofline.evaluate(space).T_compute * (1 - 1e-9))


def test_roofline_large_tiles_relieve_the_l2(a100):
    space = Space.enumerate(ALCOP["MM_Square_4k"], a100)
    r = roofline.evaluate(space)
    assert np.allclose(r.T_kernel, np.maximum.reduce([r.T_compute, r.T_smem_load, r.T_DRAM_load]))
    largest = (space.block_m == 128) & (space.block_n == 256)
    smallest = (space.block_m == 16) & (space.block_n == 16)
    # L2 -> smem traffic scales with 1/BM + 1/BN: 16x16 tiles stream 12x more than 128x256.
    assert set(r.bottleneck[largest]) == {"compute"}
    assert set(r.bottleneck[smallest]) == {"smem"}
