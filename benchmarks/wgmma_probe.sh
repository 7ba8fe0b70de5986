# The wgmma probe (benchmarks/wgmma_probe.py): the Hopper warpgroup-MMA GEMM shapes checked
# and timed against cuBLAS on the campaign's GEMM and BMM operators. Run on the GPU machine
# from the repository root with the GPU kit (make gpu-kit) carried; the file lands in $OUT
# and is rewritten after every shape, so a call cut short brings back what it measured.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu-site .gpu-kit/*.whl && export PYTHONPATH=$PWD/.gpu-site:$PWD || exit
# SHAPES="--loader tma --epilogue staged" picks shapes by kind (CONFIGS= names them one by one).
if [ -n "${SHAPES:-}" ]; then CONFIGS=$(python3 -m benchmarks.wgmma_probe shapes $SHAPES) || exit; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
# --seconds: the probe's own budget, so that a child that hangs is given up after a share of
# what is left and the shapes after it still run (wgmma_probe.child_timeout).
timeout ${PROBE_SECONDS:-420} python3 -m benchmarks.wgmma_probe run --out $OUT/wgmma-probe.json --seconds ${PROBE_SECONDS:-420} ${OPERATORS:+--operators $OPERATORS} ${CONFIGS:+--configs $CONFIGS} 2>&1 | tail -40
# Hardware counters of the fastest shape on each of PROFILE_OPERATORS (default the 4k GEMM;
# skip with PROFILE=0), and with PROFILE_LIBRARY=1 cuBLAS's kernel on the same operator
# (benchmarks/profile_best.py; its dataset: PROFILE_GPU, default h100). NCU_SECONDS caps
# each operator's ncu run (default 150 s), so that a call's limit can hold every profile.
if [ "${PROFILE:-1}" = 1 ]; then
  S="--section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section SchedulerStats --section InstructionStats"
  STALLS="--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
  for OP in ${PROFILE_OPERATORS:-MM_Square_4k}; do
    CFG=$(python3 -m benchmarks.wgmma_probe best $OUT/wgmma-probe.json --operator $OP) || continue
    timeout ${NCU_SECONDS:-150} ncu --clock-control none --target-processes all -k "regex:pipetune_.*_wg" -c 1 $S $STALLS python3 -m benchmarks.wgmma_probe launch --config $CFG --operator $OP > $OUT/ncu-wgmma-$OP.txt 2>&1; echo "ncu $OP $CFG rc=$?"
    if [ "${PROFILE_LIBRARY:-0}" = 1 ]; then
      timeout 90 ncu --clock-control none --target-processes all -k "regex:gemm|nvjet|xmma|cutlass" --launch-skip 1 -c 1 $S $STALLS python3 -m benchmarks.profile_best --gpu ${PROFILE_GPU:-h100} --operator $OP --top 0 > $OUT/ncu-$OP-lib.txt 2>&1; echo "ncu $OP library rc=$?"
    fi
  done
  grep -H "Duration\|Compute (SM) Throughput\|Registers Per Thread\|Grid Size\|Waves Per SM" $OUT/ncu-*.txt
fi
