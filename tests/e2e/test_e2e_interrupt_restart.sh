#!/usr/bin/env bash
# A Generate interrupted by a coordinator crash, with a client written from the .proto alone
# (grpcio stubs from proto/hyla/v1): hyla-coordinator and one hyla-worker on loopback, CPU
# backend, a tiny sse-h model. The coordinator is killed (SIGKILL) after the client has read 40
# tokens and restarted on the same data directory: the client's stream ends UNAVAILABLE with the
# twin's first tokens; the worker ends the orphaned call and keeps the tokens it sent. The client
# recovers by the rule of docs/API.md: ReadTokens from the count it received (retried while the
# worker registers again) says the session's `generated` (at or after the tokens received: tokens
# in flight when the coordinator died were kept but not read) and returns the missed ones; the
# token log from 0 is the twin's; a Generate then continues right after them (its first message's
# `generated` says where): received + read back + continued equals an uninterrupted twin token for
# token.
# Skips (77) until the binaries exist, or without a python3 that imports grpc and grpc_tools.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init interrupt-restart
PY=$(e2e_python) || e2e_skip "no python3 that imports grpc and grpc_tools (apt-get install python3-grpcio python3-grpc-tools)"

e2e_make_model "$E2E_DIR/model"
e2e_start_coordinator || e2e_done
e2e_start_worker w1 "$E2E_DIR/model" || e2e_done

"$PY" - "$E2E_SERVER" "$E2E_SRC/proto" "$E2E_DIR" <<'PY' &
import importlib, os, shutil, sys, tempfile, time
import grpc
from grpc_tools import protoc

server, proto_dir, work = sys.argv[1], sys.argv[2], sys.argv[3]
out = tempfile.mkdtemp(prefix="hyla-restart-stubs-")
files = [os.path.join(proto_dir, "hyla", "v1", n + ".proto") for n in ("common", "sessions")]
wk = os.path.join(os.path.dirname(importlib.import_module("grpc_tools").__file__), "_proto")
assert protoc.main(["protoc", "-I" + proto_dir, "-I" + wk, "--python_out=" + out, "--grpc_python_out=" + out] + files) == 0
sys.path.insert(0, out)
pb = importlib.import_module("hyla.v1.sessions_pb2")
rpc = importlib.import_module("hyla.v1.sessions_pb2_grpc")
shutil.rmtree(out, True)
S = rpc.SessionsStub(grpc.insecure_channel(server))
MD = (("x-hyla-tenant", "restart"),)
DOC = b"".join(b"Line %d of a document fed before every generation.\n" % i for i in range(30))
N, K = 2000, 40

def session():
    sid = S.CreateSession(pb.CreateSessionRequest(seed=7), metadata=MD).session_id
    for p in S.Append(iter([pb.AppendRequest(session_id=sid, text=DOC)]), metadata=MD):
        pass
    return sid

twin = [t for r in S.Generate(pb.GenerateRequest(session_id=session(), max_tokens=N, ignore_eos=True), metadata=MD)
        for t in r.token_ids]
sid = session()
got, code = [], None
try:
    for r in S.Generate(pb.GenerateRequest(session_id=sid, max_tokens=N, ignore_eos=True), metadata=MD):
        got.extend(r.token_ids)
        if len(got) == K:
            open(os.path.join(work, "ready"), "w").close()
except grpc.RpcError as e:
    code = e.code()
ok = code == grpc.StatusCode.UNAVAILABLE and got == twin[:len(got)]
print("%s: the stream ends %s after %d tokens, the twin's first" % ("ok" if ok else "FAIL", code, len(got)),
      file=sys.stderr)
while not os.path.exists(os.path.join(work, "restarted")):
    time.sleep(0.1)
r, last = None, None
for _ in range(300):  # until the worker has registered again
    try:
        r = S.ReadTokens(pb.ReadTokensRequest(session_id=sid, from_generated=len(got)), metadata=MD)
        break
    except grpc.RpcError as e:
        last = e
        if e.code() != grpc.StatusCode.UNAVAILABLE:
            break
        time.sleep(0.2)
if r is None:
    print("FAIL: no ReadTokens succeeded after the restart: %s %s" % (last and last.code(), last and last.details()),
          file=sys.stderr)
    sys.exit(1)
g = r.generated
missed = list(r.token_ids)
log = list(S.ReadTokens(pb.ReadTokensRequest(session_id=sid), metadata=MD).token_ids)
read_ok = g >= len(got) and len(missed) == g - len(got) and got + missed == twin[:g] and log == twin[:g]
print("%s: after the restart ReadTokens says generated %d (received %d): the %d missed tokens and the log are the "
      "twin's" % ("ok" if read_ok else "FAIL", g, len(got), len(missed)), file=sys.stderr)
msgs = list(S.Generate(pb.GenerateRequest(session_id=sid, max_tokens=N - g, ignore_eos=True), metadata=MD)) \
    if g < N else []
start = msgs[0].generated - len(msgs[0].token_ids) if msgs else g
toks = [t for m in msgs for t in m.token_ids]
good = read_ok and start == g and got + missed + toks == twin
print("%s: the session continues at %d (received %d, %d in flight kept and read back): received + read back + "
      "continued == the twin's %d tokens" % ("ok" if good else "FAIL", start, len(got), len(missed), N),
      file=sys.stderr)
sys.exit(0 if ok and good else 1)
PY
client=$!
if e2e_wait_for 300 test -e "$E2E_DIR/ready"; then
  e2e_kill coordinator KILL
  e2e_restart_coordinator || e2e_done
  touch "$E2E_DIR/restarted"
  wait "$client" || e2e_fail "a Generate interrupted by a coordinator restart"
else
  e2e_fail "the generating client never read $E2E_DIR/ready's 40 tokens"
  kill "$client" 2>/dev/null
fi

e2e_done
