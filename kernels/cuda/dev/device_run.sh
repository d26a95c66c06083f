#!/bin/bash
# A GPU round on the device machine (docs/TESTING.md "GPU parity"): the parity tests, the kernel
# lab's programs, a bit check of hyla-run against a baseline build, and the benchmarks, with logs
# and JSON under $OUT. Run from the repository root on the device machine.
#   .device/new.tgz   device-pack of this build (hyla-run hyla-mkmodel hyla-bench test_gpu_ops
#                     test_gpu_e2e and the kernel lab's programs)
#   .device/base.tgz  device-pack of the baseline build (hyla-run hyla-mkmodel hyla-bench), for
#                     bitcheck and the old-vs-new benchmark phases only
# usage: device_run.sh PHASES...
#   tests     test_gpu_ops and test_gpu_e2e
#   dev       the kernel lab's programs lin_decode_forms, attn_flash_forms, gemv_direct_forms
#             (kernels/cuda/dev/NOTES.md)
#   bitcheck  models of several archs made by each build (bytes compared), then hyla-run of each
#             model by each build on cuda:0 (greedy ids and logits dumps, prefill pieces of 64
#             and 1024): every file must be identical between the builds
#   kbench    hyla-bench kernels, baseline then this build, one --only group at a time
#   e2ebench  hyla-bench e2e of the 1.3B shapes (sse-h, gdn, gla), this build and (when packed)
#             the baseline, on the same model files
# TMAX=seconds: phases (and kbench groups) that would start later than that are skipped.
# ARCHS="a b ...": the archs bitcheck makes models of (default: every mixer kind the product has:
# gla gdn sse sse-gdn sse-h transformer gla-h gdn-h statex-gla lalte lansa mamba2-h statex-mamba2).
# PACKS=dir: where new.tgz and base.tgz are (default .device; the device machine gets a copy of
# the session's checkout, so carry an ignored folder of it that holds them).
PACKS=${PACKS:-.device}
mkdir -p /tmp/p /tmp/b
tar -C /tmp/p -xzf $PACKS/new.tgz
[ -f $PACKS/base.tgz ] && tar -C /tmp/b -xzf $PACKS/base.tgz
export LD_LIBRARY_PATH=/tmp/p/lib PATH=/tmp/p/bin:$PATH HYLA_BIN_DIR=/tmp/p/bin
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt 2>&1
cat $OUT/gpu.txt
T0=$SECONDS
late() { [ -n "$TMAX" ] && [ $((SECONDS-T0)) -gt "$TMAX" ]; }
base() { local p=$1; shift; LD_LIBRARY_PATH=/tmp/b/lib timeout 60 /tmp/b/bin/$p "$@"; }
for ph in "$@"; do
  if late; then echo "skip $ph (time)" | tee -a $OUT/summary.txt; continue; fi
  case $ph in
    tests)
      t0=$SECONDS; timeout 240 test_gpu_ops > $OUT/test_gpu_ops.log 2>&1; echo "test_gpu_ops rc=$? ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
      grep -E "FAIL|comparisons" $OUT/test_gpu_ops.log | head -30
      t0=$SECONDS; timeout 240 test_gpu_e2e > $OUT/test_gpu_e2e.log 2>&1; echo "test_gpu_e2e rc=$? ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
      grep -E "FAIL|diverge|graphs" $OUT/test_gpu_e2e.log | head -20 ;;
    dev)
      for p in lin_decode_forms "attn_flash_forms 2048" "gemv_direct_forms 1 4"; do
        t0=$SECONDS; timeout 120 $p > "$OUT/dev_${p%% *}.log" 2>&1; echo "dev $p rc=$? ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
        cat "$OUT/dev_${p%% *}.log"
      done ;;
    bitcheck)
      t0=$SECONDS; n=0; bad=0; mkdir -p /tmp/bc/new /tmp/bc/base
      ids=$(awk 'BEGIN { s = 7; for (i = 0; i < 600; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%d ", 4 + s % 256 } }')
      for a in ${ARCHS:-gla gdn sse sse-gdn sse-h transformer gla-h gdn-h statex-gla lalte lansa mamba2-h statex-mamba2}; do
        args="--arch $a --layers 6 --hidden 512 --heads 4 --head-dim 128 --kv-heads 2 --vocab 260 --dtype bf16 --seed 3"
        hyla-mkmodel $args --out /tmp/bc/new/m_$a > /dev/null 2>> $OUT/bitcheck.err
        base hyla-mkmodel $args --out /tmp/bc/base/m_$a > /dev/null 2>> $OUT/bitcheck.err
        n=$((n+1)); cmp -s <(cat /tmp/bc/new/m_$a/*) <(cat /tmp/bc/base/m_$a/*) || { bad=$((bad+1)); echo "DIFFER model $a" | tee -a $OUT/summary.txt; }
        for pc in 64 1024; do
          for b in new base; do
            run=hyla-run; [ $b = base ] && run="base hyla-run"
            $run --model /tmp/bc/new/m_$a --device cuda:0 --prompt-ids "$ids" --max-tokens 24 --ignore-eos --ids \
              --prefill-piece $pc --quiet --dump-logits /tmp/bc/$b/logits_${a}_$pc.f32 > /tmp/bc/$b/ids_${a}_$pc.txt 2>> $OUT/bitcheck.err
          done
          for f in logits_${a}_$pc.f32 ids_${a}_$pc.txt; do
            n=$((n+1))
            if [ ! -s /tmp/bc/new/$f ] || ! cmp -s /tmp/bc/new/$f /tmp/bc/base/$f; then bad=$((bad+1)); echo "DIFFER $f" | tee -a $OUT/summary.txt; fi
          done
        done
      done
      head -c 300 /tmp/bc/new/ids_gdn_64.txt; echo
      echo "bitcheck: $n files compared, $bad differ ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt ;;
    kbench)
      for o in prefill decode gemm sse attn elementwise; do
        if late; then echo "skip kbench $o (time)" | tee -a $OUT/summary.txt; continue; fi
        for b in base new; do
          t0=$SECONDS
          if [ $b = base ]; then base hyla-bench kernels --device cuda:0 --only $o; else timeout 60 hyla-bench kernels --device cuda:0 --only $o; fi \
            2>> $OUT/bench_kernels.err | sed "s/^{/{\"build\":\"$b\",/" >> $OUT/bench_kernels.jsonl
          echo "kbench $o $b ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
        done
      done ;;
    e2ebench)
      for a in sse-h gdn gla; do
        if late; then echo "skip e2e $a (time)" | tee -a $OUT/summary.txt; continue; fi
        t0=$SECONDS
        hyla-mkmodel --arch $a --layers 18 --hidden 2304 --heads 18 --head-dim 128 --partitions 4 --topk 1 --kv-heads 18 --intermediate 6144 --vocab 32000 --dtype bf16 --out /tmp/m_$a >> $OUT/e2e.err 2>&1
        eargs="e2e --device cuda:0 --model /tmp/m_$a --prefill 4096 --batch 1,64 --ctx 16 --steps 16 --graphs on"
        timeout 150 hyla-bench $eargs 2>> $OUT/e2e.err | sed 's/^{/{"build":"new",/' >> $OUT/bench_e2e.jsonl
        echo "e2e $a new rc=$? ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
        if [ -x /tmp/b/bin/hyla-bench ] && ! late; then
          t0=$SECONDS
          LD_LIBRARY_PATH=/tmp/b/lib timeout 150 /tmp/b/bin/hyla-bench $eargs 2>> $OUT/e2e.err | sed 's/^{/{"build":"base",/' >> $OUT/bench_e2e.jsonl
          echo "e2e $a base rc=$? ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
        fi
      done ;;
    *) echo "unknown phase $ph" | tee -a $OUT/summary.txt ;;
  esac
done
