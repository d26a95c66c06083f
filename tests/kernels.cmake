# Kernel tests (kernels/): the CPU reference backend against naive double-precision
# references, and the equalities the engine relies on (chunked prefill == decode loop,
# batch invariance, exact sampling rules).
hyla_add_test(test_cpu_ops SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_cpu_ops.c
  LABELS quick LIBS hyla_kernels m TIMEOUT 120)
hyla_add_test(test_cpu_mixers SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_cpu_mixers.c
  LABELS quick LIBS hyla_kernels m TIMEOUT 120)
# Mamba2 (SSD)
hyla_add_test(test_cpu_mamba2 SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_cpu_mamba2.c
  LABELS quick LIBS hyla_kernels m TIMEOUT 120)
