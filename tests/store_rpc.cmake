# The StateStore gRPC service (statestore/rpc/).
hyla_add_test(test_store_rpc SOURCES test_store_rpc.c LIBS hyla_store_rpc LABELS quick)
