# tests/ops.cmake — operating the cluster (common/hyla_metrics.c, common/probe/, deploy/).
#   test_metrics   the registry's Prometheus text exposition, exactly, and concurrent updates
#   test_e2e_ops   (label e2e) coordinator and worker with --metrics: curl scrapes both, metric
#                  values move after requests, /readyz, grpc.health.v1 Check via Python grpcio,
#                  --log-format json
#   test_deploy    (quick) systemd-analyze verify of the units, the k8s manifests' structural check
#                  (tests/deploy/check_k8s.py), config files through the real parsers, the Dockerfile
#   test_e2e_config (label e2e) --config FILE on both binaries: every flag is a key, flags
#                  override the file, bad files are refused naming FILE:LINE
hyla_add_test(test_metrics SOURCES test_metrics.c LIBS hyla_common LABELS quick TIMEOUT 60)
hyla_add_script_test(test_e2e_ops e2e/test_e2e_ops.sh LABELS e2e TIMEOUT 300)
hyla_add_script_test(test_e2e_config e2e/test_e2e_config.sh LABELS e2e TIMEOUT 120)
hyla_add_script_test(test_deploy test_deploy.sh LABELS quick TIMEOUT 120)
hyla_add_script_test(test_e2e_quota e2e/test_e2e_quota.sh LABELS e2e TIMEOUT 180)
