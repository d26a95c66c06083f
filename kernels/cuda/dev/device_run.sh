#!/bin/bash
# The GPU round of issue 5: unpack the device-pack archive (.device/pack.tgz, see docs/TESTING.md
# "GPU parity"), run the parity tests and the benchmarks, keep logs and JSON under $OUT.
# Run from the repository root on the device machine; copy this file to .device/run.sh first.
# usage: run.sh PHASES... (tests, testsenv, kdec, kbench, kmain, kprefill, kfused, ksse, kphase, kws, kprofws, kfs, kproffs, kpipe, kattn, kelem, e2ebench, e2equick, e2eprof, linexp)
# kpipe: the pipelined GDN pass (HYLA_CUDA_GDN_WS=4) against WS = 3 (prefill, sse) and its phase profile.
# kattn: --only attn with each flash prefill kernel (HYLA_CUDA_ATTN=flash2w4, the default; flash2; flash1), rows tagged "attn".
# kelem: --only elementwise (row and elementwise ops at the 1.3B prefill shapes).
# e2eprof: HYLA_PROFILE=1 e2e prefill at 32k of sse-h and gdn (models made by e2ebench, or made here): where the time goes.
# kfused: chunked prefill, GDN path chosen by shape (auto), forced fused, and kernels A and B (HYLA_CUDA_CHUNK=ab).
# smoke: quick prefill kernels, stops the script on a hang or fault. KFUSED="auto" limits kfused's variants.
# kprof: hyla-bench-prof (a build with -DHYLA_FUSED_PROFILE) prints the fused kernel's phase cycles.
# e2ebench: prefill 4k and 32k, decode with CUDA graphs on and off; e2equick: prefill 4k only.
# kgla: --only sse and --only prefill by default (fused GLA) and under HYLA_CUDA_CHUNK=ab (GLA's
#   kernels A and B, SSE-GLA through the gather), rows tagged "chunk".
# kws: the fused GDN pass's warp-specialised forms (HYLA_CUDA_GDN_WS=1: a producer warp stages the
#   chunks and stores o from shared memory; =2: a producer warpgroup of 4 warps) against the
#   default: smoke runs of both first (a barrier hang ends the script), then --only prefill and
#   --only sse with HYLA_CUDA_GDN_WS=0, 1, 2 (KWS="0 2" limits them), rows tagged "ws", then
#   test_gpu_ops (its varlen and SSE checks include WS=1, 2 == default bit for bit).
# kprofws: kprof with HYLA_CUDA_GDN_WS=2 (KPROFWS=1 for the one-warp form): the compute warps'
#   phases and the producer's intervals.
# kfs: HYLA_CUDA_GDN_FS=1 (variant 8: W and U0 by blocked forward substitution on tensor cores)
#   against 0: smoke runs with FS=1 first (WS=2, the default form, and WS=0; a hang or fault ends
#   the script), then --only prefill and --only sse with HYLA_CUDA_GDN_FS=0, 1 (KFS="1" limits
#   them), rows tagged "fs". Its bit checks (every form and the split form agree, CPU tolerance)
#   are in test_gpu_ops: run "tests" too.
# kproffs: kprof with HYLA_CUDA_GDN_FS=1 (WS = the default, KPROFWS to choose): the phases with
#   (f') as fs-load / fs-subst / fs-wait.
# TMAX=seconds: phases that would start later than that are skipped (device-time budgets).
mkdir -p /tmp/p && tar -C /tmp/p -xzf .device/pack.tgz
export LD_LIBRARY_PATH=/tmp/p/lib PATH=/tmp/p/bin:$PATH HYLA_BIN_DIR=/tmp/p/bin HYLA_BUILD_DIR=/tmp/b
mkdir -p /tmp/b
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv > $OUT/gpu.txt 2>&1
cat $OUT/gpu.txt
T0=$SECONDS
for ph in "$@"; do
  if [ -n "$TMAX" ] && [ $((SECONDS-T0)) -gt "$TMAX" ]; then echo "skip $ph (time)" | tee -a $OUT/summary.txt; continue; fi
  case $ph in
    tests)
      t0=$SECONDS; timeout 240 test_gpu_ops > $OUT/test_gpu_ops.log 2>&1; echo "test_gpu_ops rc=$? ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
      grep -E "FAIL|comparisons|differ" $OUT/test_gpu_ops.log | head -30
      t0=$SECONDS; timeout 240 test_gpu_e2e > $OUT/test_gpu_e2e.log 2>&1; echo "test_gpu_e2e rc=$? ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
      grep -E "FAIL|diverge|check|graphs" $OUT/test_gpu_e2e.log | head -30 ;;
    testsenv)
      # the parity tests again with the optional linear paths (same bits expected in e2e)
      for v in fusedsmall xconv; do
        t0=$SECONDS; HYLA_CUDA_LINEAR=$v timeout 120 test_gpu_e2e > $OUT/test_gpu_e2e_$v.log 2>&1; echo "test_gpu_e2e HYLA_CUDA_LINEAR=$v rc=$? ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
      done ;;
    kprefill|kmain)
      t0=$SECONDS; list="gemm prefill"; [ $ph = kprefill ] && list=prefill
      for o in $list; do timeout 150 hyla-bench kernels --device cuda:0 --only $o >> $OUT/bench_kernels.jsonl 2>> $OUT/bench_kernels.err; done
      echo "kmain rc=$? ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
      grep -E '"M":(1|16|64),|varlen|one call"' $OUT/bench_kernels.jsonl | sed 's/"device":"cuda:0","gpu":"[^"]*",//' ;;
    kfused)
      t0=$SECONDS
      for v in ${KFUSED:-auto fused ab}; do
        if [ $v != auto ]; then export HYLA_CUDA_CHUNK=$v; fi
        timeout 150 hyla-bench kernels --device cuda:0 --only prefill | sed "s/\"bench\":\"/\"chunk\":\"$v\",\"bench\":\"/" >> $OUT/bench_kernels.jsonl 2>> $OUT/bench_kernels.err
        unset HYLA_CUDA_CHUNK
      done
      echo "kfused ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
      grep '"chunk"' $OUT/bench_kernels.jsonl | sed 's/"device":"cuda:0","gpu":"[^"]*",//; s/"tokens_per_seq":8192,"H":16,"dk":128,"dv":128,//' ;;
    kgla|kglaab)
      t0=$SECONDS; v=auto; [ $ph = kglaab ] && { v=ab; export HYLA_CUDA_CHUNK=ab; }
      for o in sse prefill; do
        timeout 100 hyla-bench kernels --device cuda:0 --only $o | sed "s/\"bench\":\"/\"chunk\":\"$v\",\"bench\":\"/" >> $OUT/bench_kernels.jsonl 2>> $OUT/bench_kernels.err
      done
      unset HYLA_CUDA_CHUNK
      echo "$ph ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
      grep "\"chunk\":\"$v\"" $OUT/bench_kernels.jsonl | sed 's/"device":"cuda:0","gpu":"[^"]*",//; s/"H":1[68],"dk":128,"dv":128,//' ;;
    kdec)
      # decode state update by recurrent-kernel form (HYLA_CUDA_REC; default = d4b), rows tagged "rec"
      t0=$SECONDS
      for v in ${KDEC:-default x4 d4 d2 d2c}; do
        if [ $v != default ]; then export HYLA_CUDA_REC=$v; fi
        timeout 60 hyla-bench kernels --device cuda:0 --only decode | sed "s/\"bench\":\"/\"rec\":\"$v\",\"bench\":\"/" >> $OUT/bench_kernels.jsonl 2>> $OUT/bench_kernels.err
        unset HYLA_CUDA_REC
      done
      echo "kdec ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
      grep '"rec"' $OUT/bench_kernels.jsonl | sed 's/"device":"cuda:0","gpu":"[^"]*",//; s/"H":18,"dk":128,"dv":128,//' ;;
    smoke)
      # a short run of the prefill kernels first: a hang or a fault ends the script here
      timeout 60 hyla-bench kernels --device cuda:0 --only prefill --quick > $OUT/smoke.txt 2>&1
      rc=$?; echo "smoke rc=$rc" | tee -a $OUT/summary.txt; [ $rc = 0 ] || { tail -5 $OUT/smoke.txt; exit 1; } ;;
    kprof)
      timeout 150 hyla-bench-prof kernels --device cuda:0 --only prefill > $OUT/prof.txt 2>&1
      grep "fused profile" $OUT/prof.txt | tee -a $OUT/summary.txt ;;
    kws)
      t0=$SECONDS
      for v in 2 1; do
        HYLA_CUDA_GDN_WS=$v timeout 60 hyla-bench kernels --device cuda:0 --only prefill --quick > $OUT/smoke_ws$v.txt 2>&1
        rc=$?; echo "smoke ws=$v rc=$rc" | tee -a $OUT/summary.txt; [ $rc = 0 ] || { tail -5 $OUT/smoke_ws$v.txt; exit 1; }
      done
      for v in ${KWS:-0 1 2}; do
        for o in prefill sse; do
          HYLA_CUDA_GDN_WS=$v timeout 150 hyla-bench kernels --device cuda:0 --only $o | sed "s/\"bench\":\"/\"ws\":\"$v\",\"bench\":\"/" >> $OUT/bench_kernels.jsonl 2>> $OUT/bench_kernels.err
        done
      done
      echo "kws bench ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
      grep '"ws"' $OUT/bench_kernels.jsonl | sed 's/"device":"cuda:0","gpu":"[^"]*",//; s/"H":1[68],"dk":128,"dv":128,//; s/"tokens_per_seq":8192,//'
      t0=$SECONDS; timeout 240 test_gpu_ops > $OUT/test_gpu_ops_ws.log 2>&1; echo "test_gpu_ops (ws checks) rc=$? ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
      grep -E "FAIL|comparisons|differ|GDN_WS" $OUT/test_gpu_ops_ws.log | head -30 ;;
    kfs)
      t0=$SECONDS
      for v in 2 0; do
        HYLA_CUDA_GDN_FS=1 HYLA_CUDA_GDN_WS=$v timeout 60 hyla-bench kernels --device cuda:0 --only prefill --quick > $OUT/smoke_fs_ws$v.txt 2>&1
        rc=$?; echo "smoke fs=1 ws=$v rc=$rc" | tee -a $OUT/summary.txt; [ $rc = 0 ] || { tail -5 $OUT/smoke_fs_ws$v.txt; exit 1; }
      done
      for v in ${KFS:-0 1}; do
        for o in prefill sse; do
          HYLA_CUDA_GDN_FS=$v timeout 150 hyla-bench kernels --device cuda:0 --only $o | sed "s/\"bench\":\"/\"fs\":\"$v\",\"bench\":\"/" >> $OUT/bench_kernels.jsonl 2>> $OUT/bench_kernels.err
        done
      done
      echo "kfs bench ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
      grep '"fs"' $OUT/bench_kernels.jsonl | sed 's/"device":"cuda:0","gpu":"[^"]*",//; s/"H":1[68],"dk":128,"dv":128,//; s/"tokens_per_seq":8192,//' ;;
    kproffs)
      HYLA_CUDA_GDN_FS=1 HYLA_CUDA_GDN_WS=${KPROFWS:-2} timeout 150 hyla-bench-prof kernels --device cuda:0 --only prefill > $OUT/prof_fs.txt 2>&1
      grep "fused" $OUT/prof_fs.txt | tee -a $OUT/summary.txt ;;
    kpipe)
      # the pipelined GDN pass (HYLA_CUDA_GDN_WS=4; the default for plain rows) against WS = 3:
      # --only prefill and --only sse with each, rows tagged "ws", then its phase profile
      for ws in 3 4; do
        for o in prefill sse; do
          HYLA_CUDA_GDN_WS=$ws timeout 150 hyla-bench kernels --device cuda:0 --only $o | sed "s/\"bench\":\"/\"ws\":$ws,\"bench\":\"/" >> $OUT/bench_kernels.jsonl 2>> $OUT/bench_kernels.err
        done
      done
      grep -E '"ws":[34],' $OUT/bench_kernels.jsonl | grep -E 'varlen|sse_gdn' | sed 's/"device":"cuda:0","gpu":"[^"]*",//' | tee -a $OUT/summary.txt
      HYLA_CUDA_GDN_WS=4 timeout 150 hyla-bench-prof kernels --device cuda:0 --only prefill 2>&1 | grep "pipe profile" | tee -a $OUT/summary.txt ;;
    kprofws)
      HYLA_CUDA_GDN_WS=${KPROFWS:-2} timeout 150 hyla-bench-prof kernels --device cuda:0 --only prefill > $OUT/prof_ws.txt 2>&1
      grep "fused" $OUT/prof_ws.txt | tee -a $OUT/summary.txt ;;
    linexp)
      for v in fusedsmall xconv; do
        HYLA_CUDA_LINEAR=$v timeout 100 hyla-bench e2e --device cuda:0 --model /tmp/m_gla --prefill 64 --batch 1,16 --ctx 16 --steps 32 | sed "s/\"bench\":\"/\"linear\":\"$v\",\"bench\":\"/" >> $OUT/bench_e2e.jsonl 2>> $OUT/e2e.err
      done
      grep '"linear"' $OUT/bench_e2e.jsonl | grep decode | sed 's/"device":"cuda:0","gpu":"[^"]*",//; s/"model":"[^"]*",//' ;;
    kbench)
      t0=$SECONDS; timeout 300 hyla-bench kernels --device cuda:0 > $OUT/bench_kernels.jsonl 2> $OUT/bench_kernels.err; echo "kbench rc=$? ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
      tail -3 $OUT/bench_kernels.err ;;
    kgemm)
      t0=$SECONDS; timeout 120 hyla-bench kernels --device cuda:0 --only gemm > $OUT/bench_kernels.jsonl 2> $OUT/bench_kernels.err; echo "kgemm rc=$? ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt ;;
    kphase)
      for p in a b; do HYLA_CUDA_CHUNK_PHASE=$p timeout 100 hyla-bench kernels --device cuda:0 --only prefill | sed "s/\"bench\":\"/\"phase\":\"$p\",\"bench\":\"/" >> $OUT/bench_kernels.jsonl 2>> $OUT/bench_kernels.err; done
      HYLA_CUDA_LINEAR=v1 timeout 100 hyla-bench kernels --device cuda:0 --only gemm | sed 's/"bench":"linear"/"bench":"linear_skinny_v1"/' | grep -v cublas_bf16 | grep -v '"M":8192\|"M":4096' >> $OUT/bench_kernels.jsonl 2>> $OUT/bench_kernels.err
      echo "kphase done ($((SECONDS-T0)) s)" | tee -a $OUT/summary.txt ;;
    ksse)
      t0=$SECONDS; timeout 120 hyla-bench kernels --device cuda:0 --only sse >> $OUT/bench_kernels.jsonl 2>> $OUT/bench_kernels.err; echo "ksse rc=$? ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
      HYLA_CUDA_SSE_PLAN=host timeout 120 hyla-bench kernels --device cuda:0 --only sse | sed 's/"bench":"prefill_sse_vs_gla"/"bench":"prefill_sse_vs_gla_hostplan"/' >> $OUT/bench_kernels.jsonl 2>> $OUT/bench_kernels.err
      cat $OUT/bench_kernels.jsonl | grep sse ;;
    kattn)
      for v in flash2w4 flash2 flash1; do
        HYLA_CUDA_ATTN=$v timeout 150 hyla-bench kernels --device cuda:0 --only attn 2>> $OUT/bench_kernels.err | grep prefill | sed "s/\"bench\":\"/\"attn\":\"$v\",\"bench\":\"/" >> $OUT/bench_kernels.jsonl
      done
      grep '"attn"' $OUT/bench_kernels.jsonl | sed 's/"device":"cuda:0","gpu":"[^"]*",//' ;;
    kelem)
      timeout 100 hyla-bench kernels --device cuda:0 --only elementwise 2>> $OUT/bench_kernels.err | tee -a $OUT/bench_kernels.jsonl | sed 's/"device":"cuda:0","gpu":"[^"]*",//' ;;
    e2eprof)
      for a in sse-h gdn; do
        [ -d /tmp/m_$a ] || hyla-mkmodel --arch $a --layers 18 --hidden 2304 --heads 18 --head-dim 128 --partitions 4 --topk 1 --kv-heads 18 --intermediate 6144 --vocab 32000 --dtype bf16 --out /tmp/m_$a >> $OUT/e2e.err 2>&1
        HYLA_PROFILE=1 timeout 100 hyla-bench e2e --device cuda:0 --model /tmp/m_$a --prefill 32768 --batch 1 --ctx 16 --steps 2 2>> $OUT/e2e.err | grep prefill >> $OUT/bench_e2e_profile.jsonl
      done
      cut -c1-300 $OUT/bench_e2e_profile.jsonl ;;
    e2ebench|e2equick)
      pf=4096,32768; [ $ph = e2equick ] && pf=4096
      for a in sse-h gdn gla; do
        t0=$SECONDS
        [ $((SECONDS-T0)) -gt 480 ] && { echo "skip e2e $a (time)" | tee -a $OUT/summary.txt; continue; }
        hyla-mkmodel --arch $a --layers 18 --hidden 2304 --heads 18 --head-dim 128 --partitions 4 --topk 1 --kv-heads 18 --intermediate 6144 --vocab 32000 --dtype bf16 --out /tmp/m_$a >> $OUT/e2e.err 2>&1
        if [ $a = sse-h ]; then args="--prefill $pf --batch 1,16,64 --ctx 16,4096"; else args="--prefill $pf --batch 1,64 --ctx 16"; fi
        timeout 150 hyla-bench e2e --device cuda:0 --model /tmp/m_$a $args --steps 16 --graphs both >> $OUT/bench_e2e.jsonl 2>> $OUT/e2e.err
        echo "e2e $a rc=$? ($((SECONDS-t0)) s)" | tee -a $OUT/summary.txt
        tail -n 12 $OUT/bench_e2e.jsonl | sed 's/"device":"cuda:0","gpu":"[^"]*",//; s/"model":"[^"]*",//' 
      done ;;
  esac
done
