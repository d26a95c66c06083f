# tests/client.cmake — libhyla, the hyla CLI and the Python client (client/).
#   test_client         libhyla against an in-process fake Sessions/Cluster server
#                       (tests/test_client_fake.c) over real gRPC on loopback
if(TARGET hyla_client)
  hyla_add_test(test_client SOURCES test_client.c test_client_fake.c LABELS quick
                LIBS hyla_client hyla_rpc hyla_proto TIMEOUT 120)
endif()
