# The cluster processes: hyla-worker (and, when built, hyla-coordinator) over loopback gRPC.
hyla_add_test(test_sched SOURCES test_sched.c LIBS hyla_worker_srv LABELS quick TIMEOUT 60)
hyla_add_test(test_worker SOURCES test_worker.c LIBS hyla_store_rpc LABELS e2e TIMEOUT 300)
add_dependencies(test_worker hyla-worker hyla-run hyla-mkmodel)
# Mamba2 (SSD): the same suite on a mamba2-h model
add_test(NAME test_worker_mamba2 COMMAND test_worker mamba2-h WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(test_worker_mamba2 PROPERTIES LABELS "e2e" TIMEOUT 300
  ENVIRONMENT "HYLA_SOURCE_DIR=${CMAKE_SOURCE_DIR};HYLA_BIN_DIR=${CMAKE_BINARY_DIR}/bin;HYLA_BUILD_DIR=${CMAKE_BINARY_DIR}"
  SKIP_RETURN_CODE 77)
hyla_add_script_test(test_e2e_cluster e2e/test_e2e_cluster.sh LABELS e2e TIMEOUT 900)
# the same with every worker decoding one step ahead (a GPU worker's default; on the CPU only when
# asked): migration mid-generation, kill -9, pipelines and batches through the posted lane
hyla_add_script_test(test_e2e_cluster_ahead e2e/test_e2e_cluster.sh LABELS e2e TIMEOUT 900)
set_property(TEST test_e2e_cluster_ahead APPEND PROPERTY ENVIRONMENT "HYLA_DECODE_LANES=1")
hyla_add_script_test(test_e2e_drain e2e/test_e2e_drain.sh LABELS e2e fault TIMEOUT 180)
hyla_add_script_test(test_e2e_gpu e2e/test_e2e_gpu.sh LABELS gpu e2e TIMEOUT 300)
# two GPUs: pipeline stages over NCCL == one GPU, identity through pause / migrate (skips with a
# message where fewer than two GPUs are usable)
hyla_add_script_test(test_e2e_multigpu e2e/test_e2e_multigpu.sh LABELS multigpu e2e TIMEOUT 300)
hyla_add_script_test(test_e2e_storage e2e/test_e2e_storage.sh LABELS e2e fault TIMEOUT 300)
hyla_add_script_test(test_e2e_history e2e/test_e2e_history.sh LABELS e2e TIMEOUT 300)
# a session exported from one cluster and imported into another continues identically
hyla_add_script_test(test_e2e_port e2e/test_e2e_port.sh LABELS e2e TIMEOUT 300)
# a worker that splits every layer over two CPU backends (--tp 2), sessions moved to and from it
hyla_add_script_test(test_e2e_tp e2e/test_e2e_tp.sh LABELS e2e TIMEOUT 300)
# the same on two GPUs (skipped with a message where fewer than two are usable)
hyla_add_script_test(test_e2e_tp_gpu e2e/test_e2e_tp.sh LABELS multigpu e2e TIMEOUT 300)
set_property(TEST test_e2e_tp_gpu APPEND PROPERTY ENVIRONMENT "E2E_TP_DEVICE=cuda:0")
# sparse-attention hybrids through the cluster
hyla_add_script_test(test_e2e_lalte e2e/test_e2e_sparse.sh LABELS e2e TIMEOUT 600)
hyla_add_script_test(test_e2e_lansa e2e/test_e2e_sparse.sh LABELS e2e TIMEOUT 600)
set_tests_properties(test_e2e_lansa PROPERTIES ENVIRONMENT
  "HYLA_SOURCE_DIR=${CMAKE_SOURCE_DIR};HYLA_BIN_DIR=${CMAKE_BINARY_DIR}/bin;HYLA_BUILD_DIR=${CMAKE_BINARY_DIR};HYLA_E2E_ARCH=lansa")
hyla_add_script_test(test_e2e_interrupt e2e/test_e2e_interrupt.sh LABELS e2e fault TIMEOUT 900)
hyla_add_script_test(test_e2e_interrupt_restart e2e/test_e2e_interrupt_restart.sh LABELS e2e fault TIMEOUT 900)
# a coordinator stalled past --dead-after-ms (SIGSTOP) declares no live worker dead
hyla_add_script_test(test_e2e_stall e2e/test_e2e_stall.sh LABELS e2e fault TIMEOUT 180)
# dynamic linear attention through the cluster (the sparse-hybrid script, another model)
hyla_add_script_test(test_e2e_dla_gdn e2e/test_e2e_sparse.sh LABELS e2e TIMEOUT 300)
set_tests_properties(test_e2e_dla_gdn PROPERTIES ENVIRONMENT
  "HYLA_SOURCE_DIR=${CMAKE_SOURCE_DIR};HYLA_BIN_DIR=${CMAKE_BINARY_DIR}/bin;HYLA_BUILD_DIR=${CMAKE_BINARY_DIR};HYLA_E2E_ARCH=dla-gdn")
hyla_add_script_test(test_e2e_dla_mamba2 e2e/test_e2e_sparse.sh LABELS e2e TIMEOUT 300)
set_tests_properties(test_e2e_dla_mamba2 PROPERTIES ENVIRONMENT
  "HYLA_SOURCE_DIR=${CMAKE_SOURCE_DIR};HYLA_BIN_DIR=${CMAKE_BINARY_DIR}/bin;HYLA_BUILD_DIR=${CMAKE_BINARY_DIR};HYLA_E2E_ARCH=dla-mamba2")
# Mamba2 and StateX through the cluster (statex-gla: 8 MiB states per layer)
foreach(arch mamba2 statex-mamba2 statex-gla)
  string(REPLACE "-" "_" tname "test_e2e_${arch}")
  hyla_add_script_test(${tname} e2e/test_e2e_sparse.sh LABELS e2e TIMEOUT 600)
  set_tests_properties(${tname} PROPERTIES ENVIRONMENT
    "HYLA_SOURCE_DIR=${CMAKE_SOURCE_DIR};HYLA_BIN_DIR=${CMAKE_BINARY_DIR}/bin;HYLA_BUILD_DIR=${CMAKE_BINARY_DIR};HYLA_E2E_ARCH=${arch}")
endforeach()
