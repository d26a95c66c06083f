# The cluster processes: hyla-worker (and, when built, hyla-coordinator) over loopback gRPC.
if(TARGET hyla-worker)
  hyla_add_test(test_worker SOURCES test_worker.c LIBS hyla_store_rpc LABELS e2e TIMEOUT 300)
  add_dependencies(test_worker hyla-worker hyla-run hyla-mkmodel)
endif()
