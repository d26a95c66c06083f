# tests/client.cmake — libhyla, the hyla CLI and the Python client (client/).
#   test_client         libhyla against an in-process fake Sessions/Cluster server
#                       (tests/test_client_fake.c) over real gRPC on loopback
#   test_client_cli     build/bin/hyla run as a subprocess: usage errors, --help, exit codes,
#                       output contract, progress display (pty), against the same fake server
#   test_client_python  client/python/example.py (grpcio) against the fake server; skipped
#                       without a python3 that has grpc and grpc_tools
if(TARGET hyla_client AND TARGET hyla_cli)
  hyla_add_test(test_client SOURCES test_client.c test_client_fake.c LABELS quick
                LIBS hyla_client hyla_rpc hyla_proto TIMEOUT 120)
  hyla_add_test(test_client_cli SOURCES test_client_cli.c test_client_fake.c LABELS quick
                LIBS hyla_cli hyla_rpc hyla_proto TIMEOUT 180)
  if(TARGET test_client_cli)
    add_dependencies(test_client_cli hyla)
    # the same executable, run in its python mode
    add_test(NAME test_client_python COMMAND test_client_cli python WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
    set_tests_properties(test_client_python PROPERTIES LABELS "quick" TIMEOUT 180 SKIP_RETURN_CODE 77
      ENVIRONMENT "HYLA_SOURCE_DIR=${CMAKE_SOURCE_DIR};HYLA_BIN_DIR=${CMAKE_BINARY_DIR}/bin;HYLA_BUILD_DIR=${CMAKE_BINARY_DIR}")
  endif()
endif()
