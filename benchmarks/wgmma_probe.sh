# The wgmma probe (benchmarks/wgmma_probe.py): the Hopper warpgroup-MMA GEMM shapes checked
# and timed against cuBLAS on the campaign's GEMM and BMM operators. Run on the GPU machine
# from the repository root with the GPU kit (make gpu-kit) carried; the file lands in $OUT
# and is rewritten after every shape, so a call cut short brings back what it measured.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu-site .gpu-kit/*.whl && export PYTHONPATH=$PWD/.gpu-site:$PWD || exit
# SHAPES="--loader tma --epilogue staged" picks shapes by kind (CONFIGS= names them one by one).
if [ -n "${SHAPES:-}" ]; then CONFIGS=$(python3 -m benchmarks.wgmma_probe shapes $SHAPES) || exit; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
timeout ${PROBE_SECONDS:-420} python3 -m benchmarks.wgmma_probe run --out $OUT/wgmma-probe.json ${OPERATORS:+--operators $OPERATORS} ${CONFIGS:+--configs $CONFIGS} 2>&1 | tail -40
# Hardware counters of the fastest shape on the 4k GEMM (skip with PROFILE=0).
if [ "${PROFILE:-1}" = 1 ] && CFG=$(python3 -m benchmarks.wgmma_probe best $OUT/wgmma-probe.json --operator MM_Square_4k); then
  S="--section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section SchedulerStats --section InstructionStats"
  timeout 150 ncu --clock-control none --target-processes all -k regex:pipetune_gemm_kn_wg -c 1 $S python3 -m benchmarks.wgmma_probe launch --config $CFG --operator MM_Square_4k > $OUT/ncu-wgmma-MM_Square_4k.txt 2>&1; echo "ncu $CFG rc=$?"
  grep -h "Duration\|Compute (SM) Throughput\|Registers Per Thread" $OUT/ncu-wgmma-MM_Square_4k.txt
fi
