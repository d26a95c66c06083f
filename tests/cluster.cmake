# The cluster processes: hyla-worker (and, when built, hyla-coordinator) over loopback gRPC.
hyla_add_test(test_sched SOURCES test_sched.c LIBS hyla_worker_srv LABELS quick TIMEOUT 60)
hyla_add_test(test_worker SOURCES test_worker.c LIBS hyla_store_rpc LABELS e2e TIMEOUT 300)
add_dependencies(test_worker hyla-worker hyla-run hyla-mkmodel)
hyla_add_script_test(test_e2e_cluster e2e/test_e2e_cluster.sh LABELS e2e TIMEOUT 400)
hyla_add_script_test(test_e2e_drain e2e/test_e2e_drain.sh LABELS e2e fault TIMEOUT 180)
hyla_add_script_test(test_e2e_gpu e2e/test_e2e_gpu.sh LABELS gpu e2e TIMEOUT 300)
hyla_add_script_test(test_e2e_storage e2e/test_e2e_storage.sh LABELS e2e fault TIMEOUT 300)
# sparse-attention hybrids through the cluster
hyla_add_script_test(test_e2e_lalte e2e/test_e2e_sparse.sh LABELS e2e TIMEOUT 300)
hyla_add_script_test(test_e2e_lansa e2e/test_e2e_sparse.sh LABELS e2e TIMEOUT 300)
set_tests_properties(test_e2e_lansa PROPERTIES ENVIRONMENT
  "HYLA_SOURCE_DIR=${CMAKE_SOURCE_DIR};HYLA_BIN_DIR=${CMAKE_BINARY_DIR}/bin;HYLA_BUILD_DIR=${CMAKE_BINARY_DIR};HYLA_E2E_ARCH=lansa")
hyla_add_script_test(test_e2e_interrupt e2e/test_e2e_interrupt.sh LABELS e2e fault TIMEOUT 400)
hyla_add_script_test(test_e2e_interrupt_restart e2e/test_e2e_interrupt_restart.sh LABELS e2e fault TIMEOUT 400)
# dynamic linear attention through the cluster (the sparse-hybrid script, another model)
hyla_add_script_test(test_e2e_dla_gdn e2e/test_e2e_sparse.sh LABELS e2e TIMEOUT 300)
set_tests_properties(test_e2e_dla_gdn PROPERTIES ENVIRONMENT
  "HYLA_SOURCE_DIR=${CMAKE_SOURCE_DIR};HYLA_BIN_DIR=${CMAKE_BINARY_DIR}/bin;HYLA_BUILD_DIR=${CMAKE_BINARY_DIR};HYLA_E2E_ARCH=dla-gdn")
