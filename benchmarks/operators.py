"""The ALCOP benchmark operators (defined in model/operators.py), printed as a table.

python benchmarks/operators.py
"""

from __future__ import annotations

from pipetune.model.operators import ALCOP

if __name__ == "__main__":
    for name, workload in ALCOP.items():
        v = workload.gemm_view()
        gflop = workload.flops / 1e9
        print(
            f"{name:20s} {workload.label():48s} GEMM b={v.batch} M={v.m} N={v.n} K={v.k}  {gflop:8.2f} GFLOP"
        )
