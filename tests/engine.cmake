# Model runtime tests (worker/): loader errors, engine equivalences, CLI identity.
hyla_add_test(test_engine SOURCES test_engine.c LIBS hyla_engine LABELS quick TIMEOUT 600)
add_dependencies(test_engine hyla-mkmodel)
hyla_add_test(test_loader SOURCES test_loader.c LIBS hyla_engine LABELS quick)
add_dependencies(test_loader hyla-mkmodel)
hyla_add_script_test(test_identity test_identity.sh LABELS quick e2e TIMEOUT 1500)
hyla_add_script_test(test_cuda_toolkit test_cuda_toolkit.sh LABELS quick TIMEOUT 400)
hyla_add_script_test(test_bench_restore test_bench_restore.sh LABELS quick TIMEOUT 300)
hyla_add_script_test(test_bench_kernels test_bench_kernels.sh LABELS quick TIMEOUT 300)
