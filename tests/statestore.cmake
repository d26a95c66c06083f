# Statestore tests (statestore/): codec + portable file, RocksDB store, hyla-state tool, crash test.
hyla_add_test(test_store_codec SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_store_codec.c
  LABELS quick LIBS hyla_statestore TIMEOUT 60)
hyla_add_test(test_store SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_store.c
  LABELS quick fault LIBS hyla_statestore TIMEOUT 120)
hyla_add_test(test_store_crash SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_store_crash.c
  LABELS fault LIBS hyla_statestore TIMEOUT 120)
hyla_add_test(test_store_tool SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_store_tool.c
  LABELS quick LIBS hyla_statestore TIMEOUT 120)
add_dependencies(test_store_tool hyla-state)
hyla_add_test(test_store_space SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_store_space.c
  LABELS fault LIBS hyla_statestore TIMEOUT 180)
# soak: HYLA_SOAK_SECONDS (default 20) of create / put / delete by four clients
hyla_add_test(test_store_soak SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_store_soak.c
  LABELS soak fault LIBS hyla_statestore TIMEOUT 300)
