# tests/client.cmake — libhyla, the hyla CLI and the Python client (client/).
#   test_client         libhyla against an in-process fake Sessions/Cluster server
#                       (tests/test_client_fake.c) over real gRPC on loopback
#   test_client_cli     build/bin/hyla run as a subprocess: usage errors, --help, exit codes,
#                       output contract, progress display (pty), against the same fake server
#   test_client_python  client/python/example.py (grpcio) against the fake server; skipped
#                       without a python3 that has grpc and grpc_tools
#   test_e2e_cli        (label e2e) the CLI against real hyla-coordinator + 2 hyla-worker processes
#   test_e2e_python     (label e2e) the Python client against the same cluster
#                       Both skip (77) until those binaries are built; helpers in tests/e2e/lib.sh.
hyla_add_test(test_client SOURCES test_client.c test_client_fake.c LABELS quick
              LIBS hyla_client hyla_rpc hyla_proto TIMEOUT 120)
hyla_add_test(test_client_cli SOURCES test_client_cli.c test_client_fake.c LABELS quick
              LIBS hyla_cli hyla_rpc hyla_proto TIMEOUT 180)
add_dependencies(test_client_cli hyla)
# the same executable, run in its python mode
add_test(NAME test_client_python COMMAND test_client_cli python WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(test_client_python PROPERTIES LABELS "quick" TIMEOUT 180 SKIP_RETURN_CODE 77
  ENVIRONMENT "HYLA_SOURCE_DIR=${CMAKE_SOURCE_DIR};HYLA_BIN_DIR=${CMAKE_BINARY_DIR}/bin;HYLA_BUILD_DIR=${CMAKE_BINARY_DIR}")

hyla_add_script_test(test_e2e_cli e2e/test_e2e_cli.sh LABELS e2e TIMEOUT 300)
hyla_add_script_test(test_e2e_python e2e/test_e2e_python.sh LABELS e2e TIMEOUT 300)
