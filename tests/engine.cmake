# Model runtime tests (worker/): loader errors, engine equivalences, CLI identity.
hyla_add_test(test_engine SOURCES test_engine.c LIBS hyla_engine LABELS quick TIMEOUT 600)
add_dependencies(test_engine hyla-mkmodel)
hyla_add_test(test_tp SOURCES test_tp.c LIBS hyla_engine LABELS quick TIMEOUT 300)
add_dependencies(test_tp hyla-mkmodel)
# the same on two GPUs (skipped with a message where fewer than two exist)
add_test(NAME test_gpu_tp COMMAND test_tp cuda)
set_tests_properties(test_gpu_tp PROPERTIES LABELS "multigpu" TIMEOUT 300 SKIP_RETURN_CODE 77
  ENVIRONMENT "HYLA_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
# four ranks on four GPUs (skipped with a message where fewer than four exist)
add_test(NAME test_gpu_tp4 COMMAND test_tp cuda4)
set_tests_properties(test_gpu_tp4 PROPERTIES LABELS "multigpu" TIMEOUT 300 SKIP_RETURN_CODE 77
  ENVIRONMENT "HYLA_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
hyla_add_test(test_loader SOURCES test_loader.c LIBS hyla_engine LABELS quick)
add_dependencies(test_loader hyla-mkmodel)
hyla_add_script_test(test_identity test_identity.sh LABELS quick e2e TIMEOUT 1500)
hyla_add_script_test(test_cuda_toolkit test_cuda_toolkit.sh LABELS quick TIMEOUT 400)
hyla_add_script_test(test_bench_restore test_bench_restore.sh LABELS quick TIMEOUT 300)
hyla_add_script_test(test_bench_kernels test_bench_kernels.sh LABELS quick TIMEOUT 300)
# every programmatically launched CUDA kernel waits for the kernel ahead before it returns or
# touches memory (a source check: runs without a GPU or a CUDA build)
add_test(NAME test_pdl_lint COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/pdl_lint.py ${CMAKE_SOURCE_DIR}/kernels/cuda)
set_tests_properties(test_pdl_lint PROPERTIES LABELS "quick" TIMEOUT 60)
