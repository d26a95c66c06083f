# Kernel tests (kernels/): the CPU reference backend against naive double-precision
# references, and the equalities the engine relies on (chunked prefill == decode loop,
# batch invariance, exact sampling rules).
hyla_add_test(test_cpu_ops SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_cpu_ops.c
  LABELS quick LIBS hyla_kernels m TIMEOUT 120)
hyla_add_test(test_cpu_mixers SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_cpu_mixers.c
  LABELS quick LIBS hyla_kernels m TIMEOUT 120)
# functions whose bits the CPU and CUDA backends share (kernels/hyla_detmath.h)
hyla_add_test(test_detmath SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_detmath.c
  LABELS quick LIBS hyla_kernels m TIMEOUT 60)
# sparse-attention mixers
hyla_add_test(test_cpu_lte SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_cpu_lte.c
  LABELS quick LIBS hyla_kernels m TIMEOUT 120)
hyla_add_test(test_cpu_lte_wide SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_cpu_lte.c
  LABELS quick LIBS hyla_kernels m TIMEOUT 120)
if(TARGET test_cpu_lte_wide)
  target_compile_definitions(test_cpu_lte_wide PRIVATE LTE_WIDE=1)
endif()
hyla_add_test(test_cpu_nsa SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_cpu_nsa.c
  LABELS quick LIBS hyla_kernels m TIMEOUT 120)
# Mamba2 (SSD)
hyla_add_test(test_cpu_mamba2 SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_cpu_mamba2.c
  LABELS quick LIBS hyla_kernels m TIMEOUT 120)
# dynamic linear attention (DLA)
hyla_add_test(test_cpu_dla SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_cpu_dla.c
  LABELS quick LIBS hyla_kernels m TIMEOUT 120)
