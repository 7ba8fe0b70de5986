"""The order of the generated main loop's copy, wait and MMA instructions: values cannot
show a pipelining defect (the CPU emulator computes the right answer either way), so the
overlap the pipeline promises is checked on the generated text itself."""

from __future__ import annotations

import pytest

from pipetune.model.space import KNOBS, Schedule
from pipetune.workers.codegen import VARIANTS, generate

WAIT = "cp_async_wait<STAGES - 2>();"


def loop_body(code: str) -> list[str]:
    """The statements of the K-tile loop, in order (one per line, stripped)."""
    lines = [line.strip() for line in code.splitlines()]
    start = lines.index("for (int kt = 0; kt < k_tiles; ++kt) {")
    end = lines.index("cp_async_wait<0>();  // nothing in flight when the block exits")
    body = lines[start + 1 : end]
    assert body[-1] == "}", "the loop closes right before the final wait"
    return body[:-1]


def positions(body: list[str], prefix: str) -> list[int]:
    return [i for i, line in enumerate(body) if line.startswith(prefix)]


def schedule(chunk: int, stages: int, reg_stages: int) -> Schedule:
    return Schedule(2, 2, 2, 2, chunk, stages, reg_stages)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("reg_stages", KNOBS["reg_stages"])
@pytest.mark.parametrize("chunk", KNOBS["chunk"])
def test_two_stages_wait_for_the_next_tile_only_after_this_tile_s_last_mma(
    variant, chunk, reg_stages
):
    """smem_stages = 2: tile kt+1's copy is issued during tile kt; every MMA of tile kt must be
    issued before the wait for it, or the copy does not overlap the tile's compute."""
    body = loop_body(generate(variant, schedule(chunk, 2, reg_stages)).code)
    (copy,) = positions(body, "if (load_next) load_tile(kt + STAGES - 1, write_stage(), 0)")
    (wait,) = positions(body, WAIT)
    mmas = positions(body, "mma_step(")
    assert len(mmas) == chunk
    assert copy < mmas[0], "the next tile's copy is issued before this tile's compute"
    assert mmas[-1] < wait, f"an MMA of tile kt waits for tile kt+1's copy: {body}"
    assert body[wait + 1] == "__syncthreads();"


@pytest.mark.parametrize("stages", [s for s in KNOBS["smem_stages"] if s >= 3])
@pytest.mark.parametrize("chunk", KNOBS["chunk"])
def test_deeper_pipelines_cross_to_the_next_tile_under_the_last_mma(chunk, stages):
    """smem_stages >= 3, reg_stages = 2: tile kt+1 was issued a tile earlier, so the wait comes
    before the last MMA and the next tile's first fragments load under it."""
    body = loop_body(generate("gemm_kn", schedule(chunk, stages, 2)).code)
    (wait,) = positions(body, WAIT)
    mmas = positions(body, "mma_step(")
    (cross,) = positions(body, "if (kt + 1 < k_tiles) load_frags(")
    assert wait < cross < mmas[-1]


@pytest.mark.parametrize("stages", [s for s in KNOBS["smem_stages"] if s >= 2])
def test_one_register_stage_computes_every_step_before_the_wait(stages):
    body = loop_body(generate("conv2d", schedule(4, stages, 1)).code)
    (wait,) = positions(body, WAIT)
    assert max(positions(body, "mma_step(")) < wait
