# Conformance: the C engine against golden fixtures from the independent PyTorch reference
# (tests/reference/, docs/TESTING.md "Conformance"). One test per fixture listed below: rebuild
# the fixture's model (hyla-mkmodel or tests/reference/make_tiny.py), run hyla-run, compare
# prompt logits and greedy tokens (tests/reference/compare_fixture.py). Needs python3 with
# numpy only; skipped (exit 77) without it or before hyla-run/hyla-mkmodel are built.
# conformance_reference_selftest checks the reference itself and needs torch (skipped in CI).
set(HYLA_REF_DIR ${CMAKE_CURRENT_SOURCE_DIR}/reference)
set(HYLA_CONF_ENV "HYLA_SOURCE_DIR=${CMAKE_SOURCE_DIR};HYLA_BIN_DIR=${CMAKE_BINARY_DIR}/bin;HYLA_BUILD_DIR=${CMAKE_BINARY_DIR}")

# The fixtures, listed (not globbed): a fixture that goes missing fails the configuration
# instead of silently dropping its test.
set(HYLA_CONFORMANCE_FIXTURES gdn-h-bf16 gdn gla-h gla sse-gdn sse-h sse transformer x-gdn-plain x-gla-conv
    x-sse-gdn-k2 x-sse-sparse x-transformer lalte lansa nsa statex-gla mamba2 mamba2-h
    statex-mamba2 dla-gdn dla-mamba2)
foreach(fx_name ${HYLA_CONFORMANCE_FIXTURES})
  set(fx ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/${fx_name}.json)
  if(NOT EXISTS ${fx})
    message(FATAL_ERROR "conformance_${fx_name}: fixture tests/fixtures/${fx_name}.json is missing")
  endif()
  add_test(NAME conformance_${fx_name}
    COMMAND bash ${HYLA_REF_DIR}/run_with_python.sh numpy ${HYLA_REF_DIR}/compare_fixture.py ${fx}
    WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(conformance_${fx_name} PROPERTIES LABELS "quick;conformance" TIMEOUT 300
    ENVIRONMENT "${HYLA_CONF_ENV}" SKIP_RETURN_CODE 77)
endforeach()

add_test(NAME conformance_reference_selftest
  COMMAND bash ${HYLA_REF_DIR}/run_with_python.sh numpy,torch ${HYLA_REF_DIR}/selftest.py
  WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(conformance_reference_selftest PROPERTIES LABELS "quick;conformance" TIMEOUT 300
  ENVIRONMENT "${HYLA_CONF_ENV}" SKIP_RETURN_CODE 77)
