# Statestore tests (statestore/): codec + portable file, RocksDB store, hyla-state tool, crash test.
hyla_add_test(test_store_codec SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_store_codec.c
  LABELS quick LIBS hyla_statestore TIMEOUT 60)
