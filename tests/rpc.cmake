# tests/rpc.cmake — common/rpc/ (the gRPC C core pattern) and the hyla.v1 decode paths.
#   test_rpc       a real gRPC server on 127.0.0.1:0 in-process, served the Echo test service
#                  (tests/proto/test_rpc.proto) and exercised by the hyla_rpc client.
#   test_rpc_fuzz  mutated bytes into every hyla.v1 message through protobuf-c and through a
#                  server that registers every method (bounded time, HYLA_FUZZ_SECONDS).
#   test_rpc_coord hyla-coordinator (in-process, then the binary killed with SIGKILL and
#                  restarted) against Worker-service test doubles, real gRPC and RocksDB.
hyla_protoc_c(HYLA_TEST_PROTO_SRCS ${CMAKE_CURRENT_BINARY_DIR}/proto_gen
              ${CMAKE_CURRENT_SOURCE_DIR}/proto test_rpc.proto)
add_library(hyla_test_proto STATIC ${HYLA_TEST_PROTO_SRCS})
target_include_directories(hyla_test_proto PUBLIC ${CMAKE_CURRENT_BINARY_DIR}/proto_gen)
target_link_libraries(hyla_test_proto PUBLIC PkgConfig::PROTOBUFC)

hyla_add_test(test_rpc SOURCES test_rpc.c LABELS quick fault
              LIBS hyla_rpc hyla_test_proto TIMEOUT 120)
hyla_add_test(test_rpc_fuzz SOURCES test_rpc_fuzz.c LABELS fault
              LIBS hyla_rpc hyla_proto TIMEOUT 60)
hyla_add_test(test_rpc_coord SOURCES test_rpc_coord.c LABELS e2e LIBS hyla_coord TIMEOUT 120)
add_dependencies(test_rpc_coord hyla-coordinator)
