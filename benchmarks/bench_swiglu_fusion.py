"""Benchmark: what fusing the SwiGLU into the gate+up GEMM saves, as the models predict it.

    python -m benchmarks.bench_swiglu_fusion [--write]

For LLaMA-2 7B and 70B's MLP at 16 (a decode step's batch), 128, 1024 and 8192 tokens, on
the H100 and the H200: the model's best schedule of the fused GEMM + SwiGLU (gemm_swiglu)
against the best of the unfused pair, the plain gate+up GEMM (tensor-core family's model)
plus the best silu_mul kernel (memory-intensive family's model), each tuned on its own.
Predictions of the analytical models with the GPUs' calibrated profiles, not
measurements: README "GPU work" item 8 measures the 7B pair at 1024 tokens.
"""

from __future__ import annotations

import argparse

from benchmarks.results import write_section
from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.memops.workloads import silu_mul
from pipetune.model.workloads import gemm, gemm_swiglu

GPUS = ("h100", "h200")
MODELS = {"7B": (4096, 11008), "70B": (8192, 28672)}  # hidden, FFN
TOKENS = (16, 128, 1024, 8192)


def best_us(workload, gpu) -> float:
    """The model's best predicted latency of the workload's whole space, in µs."""
    *_, (best,) = family_of(workload).rank(workload, gpu, top=1)
    return float(best.terms["predicted_us"])


def rows(gpu_key: str) -> list[tuple[str, int, float, float, float, float]]:
    """(model, tokens, fused µs, GEMM µs, silu_mul µs, unfused / fused)."""
    gpu = get_gpu(gpu_key)
    out = []
    for size, (hidden, ffn) in MODELS.items():
        for tokens in TOKENS:
            fused = best_us(gemm_swiglu(tokens, ffn, hidden), gpu)
            plain = best_us(gemm(tokens, 2 * ffn, hidden), gpu)
            gate = best_us(silu_mul(tokens, ffn), gpu)
            out.append((size, tokens, fused, plain, gate, (plain + gate) / fused))
    return out


def table(gpu_key: str) -> str:
    lines = [
        f"**{gpu_key.upper()}** (calibrated profile)",
        "",
        "| model | tokens | fused µs | GEMM µs | silu_mul µs | unfused / fused |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for size, tokens, fused, plain, gate, gain in rows(gpu_key):
        lines.append(
            f"| {size} | {tokens} | {fused:.1f} | {plain:.1f} | {gate:.1f} | {gain:.3f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args()
    body = "\n\n".join(table(gpu) for gpu in GPUS)
    print(body)
    if args.write:
        write_section(
            "swiglu-fusion",
            "Fused GEMM + SwiGLU: what the models predict it saves (PREDICTED, not measured)",
            "Command: `python -m benchmarks.bench_swiglu_fusion --write`. Each kernel's best "
            "schedule by the analytical models (tensor-core GEMM family for both GEMMs, "
            "memory-intensive family for silu_mul); the unfused pair is the plain gate+up "
            "GEMM (M x 2N) and the SwiGLU kernel, each tuned on its own. Nothing here was "
            "measured: README GPU work item 8 sweeps the 7B pair at 1024 tokens.\n\n"
            + body
            + "\n\nRead with care. The models do not charge the fused epilogue's SiLU (an exp "
            "and a division per output, after the main loop); the GEMM's epilogue writes half "
            "the bytes, which is all the fused kernel is credited with. Most of the saving is "
            "the silu_mul kernel itself, and at 16 and 128 tokens that is mostly the "
            "profiles' per-launch cost (kernel_launch_ns 9.8 µs on the H100, 9.5 on the "
            "H200: an empty CuPy launch between two events, host overhead included), which "
            "an inference server launching through CUDA graphs pays far less of: there the "
            "decode-size gains are overstated. From 1024 tokens on, the intermediate's round "
            "trip is most of the saving (3-9%).",
        )


if __name__ == "__main__":
    main()
