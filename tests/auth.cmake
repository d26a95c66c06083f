# tests/auth.cmake — authentication and TLS (docs/API.md "Authentication", docs/OPERATIONS.md).
#   test_auth       SHA-256 vectors, key shapes, the admin key file, and the rpc layer's central
#                   check on a real loopback server; also the probe the e2e scripts use
#   test_e2e_auth   (e2e fault) a keyed cluster of real processes (coordinator, two pipeline
#                   stages): keys issued and used, other tenant, revoked and missing keys refused,
#                   every internal service refusing callers without the cluster credential
#   test_e2e_tls    (e2e) the same cluster over TLS with a test CA (deploy/make-test-ca.sh), mutual
#                   TLS on the workers' ports; a plain client is refused
if(TARGET hyla_rpc AND TARGET hyla_proto)
  hyla_add_test(test_auth SOURCES test_auth.c LIBS hyla_rpc hyla_proto hyla_common LABELS quick TIMEOUT 60)
endif()
hyla_add_script_test(test_e2e_auth e2e/test_e2e_auth.sh LABELS e2e fault TIMEOUT 300)
hyla_add_script_test(test_e2e_tls e2e/test_e2e_tls.sh LABELS e2e TIMEOUT 300)
