"""The wgmma probe's configurations: the knobs (``WgmmaConfig``), what each combination
needs, the shapes the probe tries (``PROBE_CONFIGS``) and the tensor maps the TMA loader
reads (``tensor_map_specs``)."""

from __future__ import annotations

from dataclasses import dataclass

from pipetune.model.workloads import DType
from pipetune.workers.launch_plan import TensorMap

BK = 64  # 16-bit elements per K tile: one 128-byte swizzle line per row of A
SMEM_LIMIT = 227 * 1024  # Hopper's dynamic shared memory per block
ALIGN_SLACK = 1024  # the stages start at a 1024-byte boundary (the swizzle reads bits 7-9)
# B stored K x N (gemm_kn, bmm) or N x K (gemm_nk, bmm_nk); and the GEMM with bias + GELU or
# with the SwiGLU in its (staged) epilogue, of either layout.
VARIANTS = (
    "gemm_kn",
    "gemm_nk",
    "bmm",
    "bmm_nk",
    "gemm_bias_gelu_kn",
    "gemm_bias_gelu_nk",
    "gemm_swiglu_kn",
    "gemm_swiglu_nk",
)
# How the B descriptor's two byte offsets are read for an N-major operand: "canonical" as the
# PTX ISA's canonical-layout table gives them (leading = between 64-column slabs, stride =
# between 8-row groups of K), "swapped" the other way round. The probe compiles both so that
# one GPU call settles which one the hardware follows, should the reading be wrong.
B_DESCRIPTORS = ("canonical", "swapped")
# Who copies the tiles into shared memory: every thread with cp.async, or one thread through
# the TMA unit (tensor maps, mbarriers).
LOADERS = ("cp.async", "tma")
# How the accumulators reach C: "direct", each thread's column pairs stored from registers
# (16 bytes of a row per four threads); "staged", through shared memory first, then whole
# 16-byte row chunks per thread (coalesced: what small-K products, whose time is mostly the
# store of C, need).
EPILOGUES = ("direct", "staged")
MBARRIER_BYTES = 8
MAX_SPLITS = 16
REDUCE_THREADS = 256  # per block of the split-K reduction kernel
STREAM_K_FLAG_BYTES = 16  # stream-K: "this block sums the tile", for the whole block to read


@dataclass(frozen=True)
class WgmmaConfig:
    block_m: int  # 64 per warpgroup
    block_n: int  # a multiple of 64, at most 256 (one wgmma instruction's N)
    stages: int  # shared-memory ring depth, at least 3
    b_descriptor: str = "canonical"
    loader: str = "cp.async"
    epilogue: str = "direct"
    # Split-K: the K tiles shared among `splits` blocks per output tile (grid y), each writing
    # f32 partial sums to a workspace that a second kernel adds up and rounds (for products
    # with few output tiles and a long K, where one block per tile leaves SMs idle).
    splits: int = 1
    # Persistent (TMA loader, staged epilogue): one block per SM walks output tiles blockIdx.x,
    # + gridDim.x, ..., its loads running on into the next tile while this one's C is written
    # out from a C tile of its own (what cuBLAS's kernels do on the products where one block
    # per tile leaves a partial last wave, or an unhidden prologue and epilogue per tile).
    persistent: bool = False
    # Stream-K (persistent only): the K steps of all output tiles, laid end to end tile by
    # tile, are cut into one equal share per block, so that every SM has the same work however
    # few the tiles; a tile whose K steps two or more blocks share is summed by the last of
    # them to finish it, from f32 partial sums in a workspace (what CUTLASS's stream-K does on
    # the products with fewer output tiles than SMs and a long K: BERT FC2, RN50 FC).
    stream_k: bool = False

    def __post_init__(self) -> None:
        problems = config_problems(self)
        if problems:
            raise ValueError(problems[0])

    @property
    def warpgroups(self) -> int:
        return self.block_m // 64

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    @property
    def stage_bytes(self) -> int:
        return (self.block_m + self.block_n) * BK * 2

    @property
    def c_tile_bytes(self) -> int:
        """The staged epilogue's BM x BN tile of 16-bit elements (rows padded by 16 bytes:
        cuda_text)."""
        return self.block_m * (self.block_n * 2 + 16)

    @property
    def smem_bytes(self) -> int:
        after_stages = self.stages * MBARRIER_BYTES if self.loader == "tma" else 0
        if self.persistent:  # the C tile after the barriers, on a 16-byte boundary
            after_stages = _round16(after_stages) + self.c_tile_bytes
        if self.stream_k:  # and the flag that says which block sums a shared tile
            after_stages += STREAM_K_FLAG_BYTES
        return self.stages * self.stage_bytes + ALIGN_SLACK + after_stages

    @property
    def id(self) -> str:
        loader = "_tma" if self.loader == "tma" else ""
        staged = "_st" if self.epilogue == "staged" else ""
        split = f"_k{self.splits}" if self.splits > 1 else ""
        persistent = "_sk" if self.stream_k else "_p" if self.persistent else ""
        reading = "" if self.b_descriptor == "canonical" else "_bswap"
        return (
            f"wg{self.block_m}x{self.block_n}s{self.stages}{loader}{staged}{split}{persistent}"
            f"{reading}"
        )


def _round16(n: int) -> int:
    return -(-n // 16) * 16


def config_problems(c: WgmmaConfig) -> list[str]:
    problems = []
    if c.block_m not in (64, 128, 192, 256):
        problems.append(
            f"block_m must be 64, 128, 192 or 256 (one warpgroup per 64 rows), got {c.block_m}"
        )
    if c.block_n % 64 or not 64 <= c.block_n <= 256:
        problems.append(f"block_n must be 64, 128, 192 or 256, got {c.block_n}")
    if c.stages < 3:
        problems.append(
            f"stages must be at least 3 (one tile in use, one in the MMAs' flight), got {c.stages}"
        )
    if c.b_descriptor not in B_DESCRIPTORS:
        problems.append(f"b_descriptor must be one of {B_DESCRIPTORS}, got {c.b_descriptor!r}")
    if c.loader not in LOADERS:
        problems.append(f"loader must be one of {LOADERS}, got {c.loader!r}")
    if c.epilogue not in EPILOGUES:
        problems.append(f"epilogue must be one of {EPILOGUES}, got {c.epilogue!r}")
    if not 1 <= c.splits <= MAX_SPLITS:
        problems.append(f"splits must be 1 to {MAX_SPLITS}, got {c.splits}")
    elif c.splits > 1 and (c.loader != "tma" or c.epilogue != "direct"):
        # (The partial sums are stored as the direct epilogue stores, in f32.)
        problems.append("split-K is built for the TMA loader with the direct epilogue")
    if c.persistent and (c.loader != "tma" or c.epilogue != "staged" or c.splits != 1):
        problems.append(
            "the persistent kernel is built for the TMA loader with the staged epilogue, unsplit"
        )
    if c.stream_k and not c.persistent:
        problems.append("stream-K is built on the persistent kernel (persistent=True)")
    if problems:
        return problems
    if c.loader == "cp.async" and (BK * c.block_n // 8) % c.threads:
        problems.append(f"a {BK}x{c.block_n} tile of B is not whole 16-byte copies per thread")
    if c.smem_bytes > SMEM_LIMIT:
        problems.append(f"{c.smem_bytes} B of shared memory exceeds {SMEM_LIMIT}")
    return problems


def _shapes(table, **knobs) -> tuple[WgmmaConfig, ...]:
    return tuple(WgmmaConfig(m, n, s, **knobs) for m, n, stages in table for s in stages)


# The shapes the probe tries: one to four warpgroups, 64 to 256 columns, as deep as fits.
# (One warpgroup 256 wide holds 128 accumulators and, with cp.async, 16 copies per thread: it
# spills. The TMA loader holds no copy addresses in registers and needs no whole copies per
# thread: one warpgroup 256 wide and three warpgroups 128 wide fit too.)
_CP_ASYNC_SHAPES = (
    (128, 256, (3, 4)),
    (128, 192, (4, 5)),
    (128, 128, (3, 4, 5, 6)),
    (192, 192, (3, 4)),
    (256, 128, (3, 4)),
    (64, 128, (4, 6)),
    (128, 64, (4, 6)),  # for N = 64 (the RN50 FC layer, the S.V products)
    (64, 64, (6,)),
)
_TMA_SHAPES = (
    (128, 256, (3, 4)),
    (128, 192, (4, 5)),
    (128, 128, (4, 6)),
    (192, 192, (3, 4)),
    (256, 128, (3, 4)),
    (192, 128, (4,)),
    (64, 256, (4,)),
    (64, 128, (6,)),
    (128, 64, (6,)),
    (64, 64, (6,)),
)
# The staged epilogue on every TMA shape, and shallower narrow ones for small-K products
# (mostly the store of C).
_STAGED_SHAPES = (*_TMA_SHAPES[:7], (64, 128, (4, 6)), (128, 64, (4, 6)), (64, 64, (6,)))
# Split-K for the products with few output tiles and a long K (BERT FC2: 48 tiles of 128x128
# for 132 SMs, K = 3072; RN50 FC: 16 tiles of 64x64, K = 2048).
_SPLIT_SHAPES = (
    (128, 128, 4, (2, 3, 4)),
    (128, 256, 3, (2, 3)),
    (64, 128, 6, (2, 4)),
    (128, 64, 6, (4, 8)),
    (64, 64, 6, (4, 8)),
)
# The persistent kernel: the staged shapes that fit a C tile of their own beside the stages
# (one stage fewer where needed), the narrow and shallow ones for the few-tile products.
_PERSISTENT_SHAPES = (
    (128, 256, (3,)),
    (128, 192, (4,)),
    (128, 128, (4, 5)),
    (192, 128, (3, 4)),
    (256, 128, (3,)),
    (64, 256, (3,)),
    (64, 128, (4, 6)),
    (128, 64, (4, 6)),
    (64, 64, (6,)),
)
# Stream-K: the persistent shapes (one more stage where the flag still fits), for the few-tile
# long-K products and for any whose last wave of tiles is partial.
_STREAM_K_SHAPES = (
    (128, 256, (3,)),
    (128, 128, (4, 5)),
    (192, 128, (3,)),
    (256, 128, (3,)),
    (64, 256, (3,)),
    (64, 128, (4, 6)),
    (128, 64, (4, 6)),
    (64, 64, (6,)),
)
PROBE_CONFIGS: tuple[WgmmaConfig, ...] = (
    _shapes(_CP_ASYNC_SHAPES)
    + _shapes(_TMA_SHAPES, loader="tma")
    + _shapes(_STAGED_SHAPES, loader="tma", epilogue="staged")
    + tuple(
        WgmmaConfig(m, n, s, loader="tma", splits=k)
        for m, n, s, splits in _SPLIT_SHAPES
        for k in splits
    )
    + _shapes(_PERSISTENT_SHAPES, loader="tma", epilogue="staged", persistent=True)
    + _shapes(_STREAM_K_SHAPES, loader="tma", epilogue="staged", persistent=True, stream_k=True)
)


def stream_k_buffers(config: WgmmaConfig, blocks: int, tiles: int) -> tuple[int, int]:
    """What a stream-K launch of `blocks` blocks over `tiles` output tiles (the batch's
    included) needs beside A, B and C: the f32 workspace (two partial tiles per block: the
    tile its share starts in and the one it ends in, each stored as its threads' accumulators)
    and one u32 arrival counter per tile, zero before the first launch (the block that sums a
    tile sets its counter back to zero, so launches can follow one another)."""
    return blocks * 2 * config.threads * (config.block_n // 2), tiles


def tensor_map_specs(
    m: int,
    n: int,
    k: int,
    batch: int,
    config: WgmmaConfig,
    dtype: DType = "float16",
    b_layout: str = "kn",
) -> tuple[TensorMap, TensorMap]:
    """The tensor maps of A (batch x M x K) and B (batch x K x N, or with ``b_layout`` "nk"
    batch x N x K), row-major, of ``dtype``: A's box is one K tile of the block's rows (BM lines
    of 128 bytes); B's one 64-column slab of a K tile, or for "nk" one K tile of the block's
    BN rows, as A's. Both element types are 2 bytes (BK of them fill one 128-byte swizzle
    line): the dtype changes only the map's data type, not a size or stride."""
    if k % 8 or n % 8:
        # The TMA unit needs every row to start on a 16-byte boundary.
        raise ValueError(f"the TMA loader needs K and N to be multiples of 8, got K={k} N={n}")
    a = TensorMap("tmap_a", "A", (k, m, batch), (k * 2, m * k * 2), (BK, config.block_m, 1), dtype)
    if b_layout == "nk":
        box = (BK, config.block_n, 1)
        b = TensorMap("tmap_b", "B", (k, n, batch), (k * 2, n * k * 2), box, dtype)
    elif b_layout == "kn":
        b = TensorMap("tmap_b", "B", (n, k, batch), (n * 2, k * n * 2), (64, BK, 1), dtype)
    else:
        raise ValueError(f"b_layout must be 'kn' or 'nk', got {b_layout!r}")
    return a, b
