"""The GPU microbenchmarks behind `pipetune calibrate` (CuPy, imported when run).

Runs in an isolated child process (see workers.calibrate.run_calibration) and returns raw
timings only; workers.calibrate.profile turns them into a profile. Sizes follow the
device's L2; run lengths follow the spec's numbers (tens of milliseconds each), so a whole
calibration takes a few seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from pipetune.model.hardware import GPUSpec
from pipetune.workers.calibrate.profile import (
    MMA_FLOPS,
    Chase,
    Cycles,
    MmaRun,
    RawMeasurements,
    Throughput,
)

REPEATS = 7
TARGET_S = 0.03  # length of one timed run
THREADS = 256
CHASE_STRIDE = 64  # uint32 elements between chase nodes: 256 bytes, past any sector
CHAINS = 8  # independent mma accumulators per warp (hide the mma pipeline latency)

K_STAGES = 4  # pipeline depth of the K-step microbenchmark (a mid-range smem_stages)
K_STEP_THREADS = 128  # 4 warps: the GEMM kernels' common block size
K_STEPS = 20_000

SOURCE = (
    f"#define CHAINS {CHAINS}\n#define K_STAGES {K_STAGES}\n"
    f"#define K_STEP_THREADS {K_STEP_THREADS}\n"
    + r"""
extern "C" __global__ void copy_kernel(const float4* __restrict__ src, float4* __restrict__ dst,
                                       long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = src[i];
}

extern "C" __global__ void write_kernel(float4* __restrict__ dst, long long n, float v) {
    long long stride = (long long)gridDim.x * blockDim.x;
    float4 value = make_float4(v, v, v, v);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = value;
}

// Reads through L2 only (__ldcg skips L1). The sum is stored only if it equals a value it
// never reaches, which the compiler cannot know: the loads stay, the store never happens.
extern "C" __global__ void read_kernel(const float4* __restrict__ src, long long n, int passes,
                                       float* out) {
    long long stride = (long long)gridDim.x * blockDim.x;
    long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.0f;
    for (int p = 0; p < passes; ++p)
        for (long long i = first; i < n; i += stride) {
            float4 v = __ldcg(src + i);
            acc += (v.x + v.y) + (v.z + v.w);
        }
    if (acc == 1.0e30f) out[0] = acc;
}

// One thread follows a chain of indices: every load waits for the previous one. It starts
// where the previous launch stopped, so successive launches walk on along the cycle.
extern "C" __global__ void chase_kernel(const unsigned int* __restrict__ next, int steps,
                                        unsigned int* position) {
    unsigned int j = position[0];
    for (int s = 0; s < steps; ++s) j = __ldcg(next + j);
    position[0] = j;
}

extern "C" __global__ void smem_chase_kernel(int steps, unsigned int* out,
                                             long long* cycles) {
    __shared__ unsigned int next[1024];
    for (int i = threadIdx.x; i < 1024; i += blockDim.x) next[i] = (i * 97 + 31) % 1024;
    __syncthreads();
    if (threadIdx.x != 0) return;
    unsigned int j = 0;
    long long start = clock64();
    for (int s = 0; s < steps; ++s) j = next[j];
    long long stop = clock64();
    out[0] = j;
    cycles[0] = stop - start;
}

// The fixed cost of one main-loop step of the GEMM kernels, without its work: every thread
// issues a 16-byte cp.async for the stage K_STAGES - 1 ahead, commits it, waits for the
// oldest group (long landed: the source is 2 KB that stays in L2), and the block meets at
// a barrier, as the generated kernels close each K step. Thread 0 counts clock64 cycles.
extern "C" __global__ void k_step_kernel(const float4* __restrict__ src, int steps,
                                         long long* cycles) {
    __shared__ __align__(16) float4 stage[K_STAGES][K_STEP_THREADS];
    const float4* from = src + (threadIdx.x % 128);
    __syncthreads();
    long long start = clock64();
    for (int s = 0; s < steps; ++s) {
        unsigned dst = static_cast<unsigned>(
            __cvta_generic_to_shared(&stage[s % K_STAGES][threadIdx.x]));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(from));
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group %0;\n" ::"n"(K_STAGES - 1));
        __syncthreads();
    }
    asm volatile("cp.async.wait_all;\n" ::);
    long long stop = clock64();
    if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
}

extern "C" __global__ void spin_kernel(long long cycles, long long* out) {
    long long start = clock64();
    long long now = start;
    while (now - start < cycles) now = clock64();
    if (threadIdx.x == 0) out[blockIdx.x] = now - start;
}

// Back-to-back mma.sync on register operands: CHAINS independent accumulators per warp.
extern "C" __global__ void mma_kernel(int iters, float* out) {
    unsigned int a0 = 0x3C003C00u ^ (threadIdx.x & 7u), a1 = 0x3C003C00u ^ (threadIdx.x >> 3);
    unsigned int a2 = 0x38003800u, a3 = 0x3C003C00u;
    unsigned int b0 = 0x3C003C00u ^ (threadIdx.x & 3u), b1 = 0x38003800u;
    float d[CHAINS][4];
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) d[c][0] = d[c][1] = d[c][2] = d[c][3] = 0.0f;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int c = 0; c < CHAINS; ++c)
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < CHAINS; ++c) s += (d[c][0] + d[c][1]) + (d[c][2] + d[c][3]);
    if (s == 1.0e30f) out[blockIdx.x] = s;
}
"""
)


def _timed(cp: Any, launch: Callable[[], None], repeats: int = REPEATS) -> tuple[float, ...]:
    """Seconds of each of ``repeats`` launches (after one untimed warm-up launch)."""
    launch()
    seconds = []
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        launch()
        end.record()
        end.synchronize()
        seconds.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    return tuple(seconds)


def _chain(n_nodes: int, seed: int) -> np.ndarray:
    """A random single cycle through n_nodes nodes CHASE_STRIDE elements apart, from 0."""
    order = np.random.default_rng(seed).permutation(n_nodes).astype(np.uint32)
    nxt = np.zeros(n_nodes * CHASE_STRIDE, dtype=np.uint32)
    nxt[order * CHASE_STRIDE] = np.roll(order, -1) * CHASE_STRIDE
    return nxt


def _dram(cp: Any, kernel: Any, blocks: int, l2: int) -> tuple[Throughput, Throughput]:
    """Copy (read + write) and store-only bandwidth over buffers of >= 8x L2 (1 GiB+)."""
    free, _ = cp.cuda.runtime.memGetInfo()
    size = min(max(8 * l2, 1 << 30), free // 4) // 16 * 16
    src = cp.ones(size // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    n4 = np.int64(size // 16)
    copy, write = kernel("copy_kernel"), kernel("write_kernel")
    copied = _timed(cp, lambda: copy((blocks,), (THREADS,), (src, dst, n4)))
    written = _timed(cp, lambda: write((blocks,), (THREADS,), (dst, n4, np.float32(1.0))))
    return Throughput(2 * size, copied), Throughput(size, written)


def _l2_bandwidth(
    cp: Any, kernel: Any, blocks: int, l2: int, spec: GPUSpec, sink: Any
) -> Throughput:
    """Reads of a buffer of a quarter of L2, ``passes`` times per launch, through L2 only."""
    size = (l2 // 4) // 16 * 16
    buf = cp.ones(size // 4, dtype=cp.float32)
    passes = max(1, int(TARGET_S * spec.l2_bandwidth_gbs * 1e9 / size))
    read = kernel("read_kernel")
    args = (buf, np.int64(size // 16), np.int32(passes), sink)
    return Throughput(passes * size, _timed(cp, lambda: read((blocks,), (THREADS,), args)))


def _evict_l2(cp: Any, l2: int) -> None:
    """Write a buffer of twice L2 (its lines then hold the buffer, nothing of before)."""
    scratch = cp.zeros(2 * l2 // 4, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    del scratch


def _chase(
    cp: Any, kernel: Any, footprint: int, latency_ns: float, seed: int, hot: bool, l2: int
) -> Chase:
    """A single thread chasing a random cycle over ``footprint`` bytes.

    hot (L2): two laps first bring the whole chain into L2. Cold (DRAM): the chain is long
    enough that every launch walks on to nodes no earlier launch touched, and L2 is written
    over after the chain's copy to the device (no L2 hits). Without that, the copy left up
    to an L2 of the chain cached: the committed cold chases read 325 -> 332 ns (H200) and
    336 -> 345 ns (H100) over their repeats, faster first, as those lines were used up.
    """
    chase = kernel("chase_kernel")
    position = cp.zeros(1, dtype=cp.uint32)  # node 0 starts the walk
    steps = max(1000, int(TARGET_S / (latency_ns * 1e-9)))
    nodes = max(2, footprint // (CHASE_STRIDE * 4))
    if not hot:
        nodes = max(nodes, (REPEATS + 2) * steps)
    nxt = cp.asarray(_chain(nodes, seed))
    if hot:
        chase((1,), (1,), (nxt, np.int32(2 * nodes), position))
    else:
        _evict_l2(cp, l2)
    timed = _timed(cp, lambda: chase((1,), (1,), (nxt, np.int32(steps), position)))
    empty = _timed(cp, lambda: chase((1,), (1,), (nxt, np.int32(0), position)))
    return Chase(steps, timed, empty)


def _smem_cycles_per_load(cp: Any, kernel: Any, steps: int = 100_000) -> float:
    """Shared-memory load-to-use latency in SM cycles (clock64 around a chase)."""
    out = cp.zeros(1, dtype=cp.uint32)
    cycles = cp.zeros(1, dtype=cp.int64)
    kernel("smem_chase_kernel")((1,), (32,), (np.int32(steps), out, cycles))
    cp.cuda.Device().synchronize()
    return float(cycles.get()[0]) / steps


def _k_step_cycles(cp: Any, kernel: Any, sms: int) -> float:
    """Cycles of one K step's cp.async issue, commit, wait and barrier: the median over one
    block per SM of clock64 cycles per step (thread 0)."""
    src = cp.zeros(128 * 4, dtype=cp.float32)  # 128 float4: 2 KB
    cycles = cp.zeros(sms, dtype=cp.int64)
    kernel("k_step_kernel")((sms,), (K_STEP_THREADS,), (src, np.int32(K_STEPS), cycles))
    cp.cuda.Device().synchronize()
    return float(np.median(cycles.get())) / K_STEPS


def _clock(cp: Any, kernel: Any, sms: int, spec: GPUSpec) -> Cycles:
    """clock64 cycles counted by one spinning block per SM, against the event time."""
    spin = kernel("spin_kernel")
    cycles = int(TARGET_S * spec.boost_clock_mhz * 1e6)
    out = cp.zeros(sms, dtype=cp.int64)
    return Cycles(cycles, _timed(cp, lambda: spin((sms,), (32,), (np.int64(cycles), out))))


def _mma(cp: Any, kernel: Any, sms: int, spec: GPUSpec, sink: Any) -> MmaRun:
    """mma.sync throughput over every SM: 4 blocks of 8 warps per SM, CHAINS per warp."""
    mma = kernel("mma_kernel")
    blocks, warps = sms * 4, THREADS // 32
    expected_per_s = spec.sm_tensor_flops * sms / MMA_FLOPS
    iters = max(100, int(TARGET_S * expected_per_s / (blocks * warps * CHAINS)))
    seconds = _timed(cp, lambda: mma((blocks,), (THREADS,), (np.int32(iters), sink)))
    return MmaRun(blocks * warps * CHAINS * iters, seconds)


def run_microbenchmarks(device: int, spec: GPUSpec) -> RawMeasurements:
    """Measure the device (inside the child process). spec only sizes the runs."""
    import cupy as cp

    cp.cuda.Device(device).use()
    props = cp.cuda.runtime.getDeviceProperties(device)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    sms = int(props["multiProcessorCount"])
    l2 = int(props["l2CacheSize"])
    kernel = cp.RawModule(code=SOURCE, options=("-std=c++17",)).get_function
    blocks = sms * 8  # 8 blocks of 256 threads: every SM full, grid-stride loops
    sink = cp.zeros(blocks, dtype=cp.float32)
    dram_copy, dram_write = _dram(cp, kernel, blocks, l2)
    raw = RawMeasurements(
        device_name=name,
        sm_count=sms,
        l2_bytes=l2,
        dram_copy=dram_copy,
        dram_write=dram_write,
        l2_read=_l2_bandwidth(cp, kernel, blocks, l2, spec, sink),
        dram_chase=_chase(cp, kernel, 4 * l2, spec.dram_latency_ns, seed=1, hot=False, l2=l2),
        l2_chase=_chase(cp, kernel, l2 // 4, spec.l2_latency_ns, seed=2, hot=True, l2=l2),
        smem_chase_cycles_per_load=_smem_cycles_per_load(cp, kernel),
        clock=_clock(cp, kernel, sms, spec),
        mma=_mma(cp, kernel, sms, spec, sink),
    )
    # Last, and allowed to fail: it is recorded, not applied, so losing it (a device that
    # refuses it, a fault that leaves the context unusable) must not lose the profile.
    try:
        return replace(raw, k_step_cycles=_k_step_cycles(cp, kernel, sms))
    except Exception:  # any failure of an optional measurement
        return raw


def probe_device(device: int) -> str:
    """The device's name; raises if there is no usable CUDA device."""
    import cupy as cp

    count = cp.cuda.runtime.getDeviceCount()
    if device >= count:
        raise RuntimeError(f"CUDA device {device} requested, {count} present")
    name = cp.cuda.runtime.getDeviceProperties(device)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)
