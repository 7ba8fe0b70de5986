"""The Hopper warpgroup-MMA GEMM family (wgmma, TMA loads): workloads, space, model, family."""
