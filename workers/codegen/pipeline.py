"""The pipelined main loop, emitted with the k-steps of a tile unrolled in Python.

Why not ``#pragma unroll``: NVVM does not always honour it for this loop (it holds
barriers), and a k-step loop left rolled indexes the fragment buffers with a runtime index,
which moves them to local memory (ptxas reports stack). Emitting each k-step with literal
buffer and step numbers makes every fragment index a constant.

Shared-memory pipeline (ALCOP / CUTLASS multistage), smem_stages = S >= 2:
- prologue: tiles 0..S-2 issued, one cp.async group each (empty groups past the last tile
  keep the count uniform), then ``wait_group(S-2)`` + barrier: tile 0 has landed;
- iteration kt: the copies of tile kt+S-1 go to the stage tile kt-1 used (every warp has
  passed the barrier after reading it), spread over the first LOAD_PARTS k-steps; the last
  k-step commits the group and waits ``wait_group(S-2)``: at most S-2 groups (tiles
  kt+2..kt+S-1) may still be in flight, so tile kt+1 has landed; the barrier makes every
  thread's copies visible and ends all reads of stage kt before it is overwritten.
- S = 1: load -> wait -> barrier -> compute -> barrier; nothing overlaps.
Register pipeline, reg_stages = 2: fragments of k-step ks+1 load (ldmatrix) while k-step ks
computes; at the last k-step of a tile the first fragments of the next tile load after the
wait, across the tile boundary. reg_stages = 1 loads then computes each k-step.

Where the wait goes (reg_stages = 2): with S >= 3 tile kt+1 was issued a whole tile earlier,
so waiting for it before the last MMA of tile kt costs nothing and lets the next tile's
first fragments load under that MMA. With S = 2 the only copy in flight is tile kt+1's,
issued during tile kt itself: waiting before the last MMA would make the copy land before
tile kt's compute ends (no overlap at all at chunk = 1, half at chunk = 2), so the last
k-step issues its MMA first and then waits, as the reg_stages = 1 path does.
"""

from __future__ import annotations

from pipetune.workers.codegen.layout import TileGeometry


def _indent(lines: list[str], depth: int) -> str:
    return "".join("  " * depth + line + "\n" for line in lines)


def _multistage_step(g: TileGeometry, ks: int) -> list[str]:
    last = ks == g.ksteps - 1
    load_parts = max(1, g.ksteps - 1)
    lines = [f"// k-step {ks}"]
    if ks < load_parts:
        lines.append(f"if (load_next) load_tile(kt + STAGES - 1, write_stage(), {ks});")
    if last:
        lines.append("cp_async_commit();  // one group per tile, empty past the end")
    if g.reg_stages == 2:
        if not last:
            lines.append(f"load_frags({(ks + 1) & 1}, read_stage, {ks + 1});")
            lines.append(f"mma_step({ks & 1});")
        else:
            cross = [
                "cp_async_wait<STAGES - 2>();  // tile kt+1 has landed",
                "__syncthreads();",
                f"if (kt + 1 < k_tiles) load_frags({g.ksteps & 1}, next_stage(), 0);",
            ]
            mma = [f"mma_step({ks & 1});"]
            # S = 2: compute this tile's last step before waiting for the next (module doc).
            lines += mma + cross if g.stages == 2 else cross + mma
    else:
        lines += [f"load_frags(0, read_stage, {ks});", "mma_step(0);"]
    return lines


def _multistage(g: TileGeometry) -> str:
    body: list[str] = [
        "// write_stage() held tile kt-1, whose reads ended before the last barrier.",
        "const bool load_next = kt + STAGES - 1 < k_tiles;",
    ]
    for ks in range(g.ksteps):
        body += _multistage_step(g, ks)
    if g.reg_stages == 1:
        body += ["cp_async_wait<STAGES - 2>();  // tile kt+1 has landed", "__syncthreads();"]
    elif g.ksteps % 2:
        body.append("// An odd number of k-steps left the next tile's first fragments in buffer 1.")
        body.append("copy_frags_1_to_0();")
    body.append("read_stage = next_stage();")
    prologue = [
        "for (int s = 0; s < STAGES - 1; ++s) {",
        "  if (s < k_tiles) load_whole_tile(s, s);",
        "  cp_async_commit();",
        "}",
        "cp_async_wait<STAGES - 2>();  // tile 0 has landed",
        "__syncthreads();",
    ]
    if g.reg_stages == 2:
        prologue.append("load_frags(0, 0, 0);")
    # Only read_stage is loop state; the stage being written (the one before it in the ring)
    # and the next one are recomputed where used: one register fewer held across the loop.
    prologue += [
        "int read_stage = 0;",
        "auto write_stage = [&] { return read_stage == 0 ? STAGES - 1 : read_stage - 1; };",
        "auto next_stage = [&] { return read_stage + 1 == STAGES ? 0 : read_stage + 1; };",
    ]
    return (
        _indent(prologue, 1)
        + _indent(["for (int kt = 0; kt < k_tiles; ++kt) {"], 1)
        + _indent(body, 2)
        + _indent(["}", "cp_async_wait<0>();  // nothing in flight when the block exits"], 1)
    )


def _single_stage(g: TileGeometry) -> str:
    body = [
        "load_whole_tile(kt, 0);",
        "cp_async_commit();",
        "cp_async_wait<0>();",
        "__syncthreads();",
    ]
    if g.reg_stages == 2:
        body.append("load_frags(0, 0, 0);")
    for ks in range(g.ksteps):
        body.append(f"// k-step {ks}")
        if g.reg_stages == 2:
            if ks + 1 < g.ksteps:  # within this tile only: the next one is not loaded yet
                body.append(f"load_frags({(ks + 1) & 1}, 0, {ks + 1});")
            body.append(f"mma_step({ks & 1});")
        else:
            body += [f"load_frags(0, 0, {ks});", "mma_step(0);"]
    body.append("__syncthreads();  // the next load overwrites the only stage")
    return (
        _indent(["for (int kt = 0; kt < k_tiles; ++kt) {"], 1)
        + _indent(body, 2)
        + _indent(["}"], 1)
    )


def mainloop(g: TileGeometry) -> str:
    """The K loop of one schedule (the text between MAINLOOP_SETUP and EPILOGUE)."""
    return _single_stage(g) if g.stages == 1 else _multistage(g)
