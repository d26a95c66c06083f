# tests/http.cmake — the OpenAI-compatible HTTP gateway of hyla-coordinator (coordinator/http/).
#   test_chat_template  the Jinja-subset renderer: feature cases, and the real Qwen3 / Llama-3
#                       templates (fetched from npm into a cache) against transformers' renderings
#                       in tests/fixtures/chat/
#   test_e2e_http       (label e2e) a real coordinator with --http + CPU workers: curl and the
#                       `openai` npm client (models, completions, streaming, chat, errors,
#                       session_id continuation compared with the gRPC path)
if(TARGET hyla_chat_template)
  hyla_add_test(test_chat_template SOURCES test_chat_template.c LIBS hyla_chat_template LABELS quick TIMEOUT 180)
endif()
hyla_add_script_test(test_e2e_http e2e/test_e2e_http.sh LABELS e2e TIMEOUT 400)
# the same with the workers decoding one step ahead: streams, stops and disconnecting clients
hyla_add_script_test(test_e2e_http_ahead e2e/test_e2e_http.sh LABELS e2e TIMEOUT 400)
set_property(TEST test_e2e_http_ahead APPEND PROPERTY ENVIRONMENT "HYLA_DECODE_LANES=1")
