# The wgmma probe (benchmarks/wgmma_probe.py): the Hopper warpgroup-MMA GEMM shapes checked
# and timed against cuBLAS on the campaign's GEMM and BMM operators. Run on the GPU machine
# from the repository root with the GPU kit (make gpu-kit) carried; the file lands in $OUT
# and is rewritten after every shape, so a call cut short brings back what it measured.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu-site .gpu-kit/*.whl && export PYTHONPATH=$PWD/.gpu-site:$PWD || exit
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
timeout ${PROBE_SECONDS:-420} python3 -m benchmarks.wgmma_probe run --out $OUT/wgmma-probe.json ${OPERATORS:+--operators $OPERATORS} ${CONFIGS:+--configs $CONFIGS} 2>&1 | tail -40
