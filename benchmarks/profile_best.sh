# Nsight Compute reports of a GPU's fastest recorded GEMM/BMM schedules and the library's
# kernels on the same shapes (benchmarks/profile_best.py), and with WHERE the fastest schedule
# with those knob values. Run on the GPU machine from the repository root with the GPU kit
# (make gpu-kit) carried; reports land in $OUT.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu-site .gpu-kit/*.whl && export PYTHONPATH=$PWD/.gpu-site:$PWD || exit
GPU=${GPU:-h100}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
S="--section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section SchedulerStats --section InstructionStats"
# Why warps wait: each stall reason's warps per issued instruction.
STALLS="--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
for op in ${OPERATORS:-MM_Square_4k BMM_BERT_QK}; do
  timeout 150 ncu --clock-control none --target-processes all -k "regex:pipetune_(gemm|bmm)" -c 1 $S $STALLS python3 -m benchmarks.profile_best --gpu $GPU --operator $op --top 1 > $OUT/ncu-$op-ours.txt 2>&1; echo "ours $op rc=$?"
  # WHERE=knob=value,...: also the fastest recorded schedule with those knob values.
  if [ -n "$WHERE" ]; then
    timeout 150 ncu --clock-control none --target-processes all -k "regex:pipetune_(gemm|bmm)" -c 1 $S $STALLS python3 -m benchmarks.profile_best --gpu $GPU --operator $op --top 1 --where "$WHERE" > $OUT/ncu-$op-where.txt 2>&1; echo "where $op rc=$?"
  fi
  timeout 90 ncu --clock-control none --target-processes all -k "regex:gemm|nvjet|xmma|cutlass" --launch-skip 1 -c 1 $S $STALLS python3 -m benchmarks.profile_best --gpu $GPU --operator $op --top 0 > $OUT/ncu-$op-lib.txt 2>&1; echo "lib $op rc=$?"
done
grep -h "Context 1\|Duration\|Compute (SM) Throughput" $OUT/ncu-*.txt
