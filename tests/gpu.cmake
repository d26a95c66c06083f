# GPU tests (label gpu): the CUDA backend against the CPU reference, op by op
# (tests/test_gpu_ops.c). Built whenever the CUDA backend is (nvcc found); each test skips
# with exit 77 and a message when no CUDA device is usable, so CI (no GPU) reports "skipped".
if(HYLA_HAVE_CUDA)
  hyla_add_test(test_gpu_ops SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gpu_ops.c
    LABELS gpu LIBS hyla_kernels m TIMEOUT 600)
  target_include_directories(test_gpu_ops PRIVATE ${CMAKE_SOURCE_DIR}/kernels/cuda)
endif()
if(HYLA_HAVE_CUDA)
  # Whole tiny models (gla-h, gdn, sse-h, sse-gdn, gdn-h) on cuda:0 vs the CPU, GPU
  # pause/resume and batch invariance bit for bit, GPU<->CPU snapshot resume, CUDA graphs
  # on == off bit for bit.
  hyla_add_test(test_gpu_e2e SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gpu_e2e.c
    LABELS gpu LIBS hyla_engine m TIMEOUT 600)
  target_include_directories(test_gpu_e2e PRIVATE ${CMAKE_SOURCE_DIR}/kernels/cuda)
  add_dependencies(test_gpu_e2e hyla-mkmodel)
endif()
if(HYLA_HAVE_CUDA)
  # Mamba2 (SSD): its ops on cuda:0 vs the CPU, pieces and batches bit for bit, graphs on == off.
  hyla_add_test(test_gpu_mamba2 SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gpu_mamba2.c
    LABELS gpu LIBS hyla_kernels m TIMEOUT 300)
  target_include_directories(test_gpu_mamba2 PRIVATE ${CMAKE_SOURCE_DIR}/kernels/cuda)
endif()
