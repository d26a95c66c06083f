#!/usr/bin/env bash
# The Sessions API under interruption and bad input, with a client written from the .proto alone
# (grpcio stubs generated from proto/hyla/v1, no hyla library): hyla-coordinator and two
# hyla-worker processes on loopback, CPU backend, a tiny sse-h model.
#
# Every interrupted Generate is checked against an uninterrupted twin (same seed, same document):
#   - Migrate, Pause with evict, Pause, Delete: the stream ends (ABORTED, or CANCELLED for Delete)
#     with the trailer x-hyla-tokens-delivered equal to the tokens received, Session.generated
#     equal to it too, and a second Generate continues with no duplicate and no gap;
#   - client cancel and deadline: the session keeps the tokens the server sent before it saw the
#     cancellation (Session.generated); what the client received is a prefix of them, and the
#     continuation starts right after Session.generated;
#   - the owning worker killed (last): UNAVAILABLE with the trailer; the next Generate continues
#     from the last durable snapshot, and its first message says from where.
# Then: an Append whose second message names another session leaves the first one usable; a
# session id with a NUL byte, a space or too many bytes is refused and acts on nothing; stop [""]
# is refused; top_k < 0 disables top-k; position counts the same after Append, Pause and
# Generate; Pause leaves state PAUSED with the resident copy in tier/group_id.
# Skips (77) until the binaries exist, or without a python3 that imports grpc and grpc_tools.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init interrupt
PY=$(e2e_python) || e2e_skip "no python3 that imports grpc and grpc_tools (apt-get install python3-grpcio python3-grpc-tools)"

e2e_make_model "$E2E_DIR/model"
e2e_start_coordinator || e2e_done
e2e_start_worker w1 "$E2E_DIR/model" || e2e_done
e2e_start_worker w2 "$E2E_DIR/model" || e2e_done

"$PY" - "$E2E_SERVER" "$E2E_SRC/proto" "w1=$(e2e_pid w1)" "w2=$(e2e_pid w2)" <<'PY' || e2e_fail "interruption checks"
import importlib, os, shutil, sys, tempfile, threading, time
import grpc
from grpc_tools import protoc

server, proto_dir = sys.argv[1], sys.argv[2]
worker_pids = dict(a.split("=") for a in sys.argv[3:])
out = tempfile.mkdtemp(prefix="hyla-interrupt-stubs-")
files = [os.path.join(proto_dir, "hyla", "v1", n + ".proto") for n in ("common", "sessions", "cluster")]
wk = os.path.join(os.path.dirname(importlib.import_module("grpc_tools").__file__), "_proto")
assert protoc.main(["protoc", "-I" + proto_dir, "-I" + wk, "--python_out=" + out, "--grpc_python_out=" + out] + files) == 0
sys.path.insert(0, out)
pb = importlib.import_module("hyla.v1.sessions_pb2")
cpb = importlib.import_module("hyla.v1.common_pb2")
rpc = importlib.import_module("hyla.v1.sessions_pb2_grpc")
crpc = importlib.import_module("hyla.v1.cluster_pb2_grpc")
cl = importlib.import_module("hyla.v1.cluster_pb2")
shutil.rmtree(out, True)

ch = grpc.insecure_channel(server)
S = rpc.SessionsStub(ch)
C = crpc.ClusterStub(ch)
MD = (("x-hyla-tenant", "interrupt"),)
DOC = b"".join(b"Line %d of a document fed before every generation.\n" % i for i in range(30))
N = 3000          # tokens per generation: long enough to be interrupted mid-stream
K = 40            # tokens received before the interruption
failures = []

def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, file=sys.stderr)
    if not cond:
        failures.append(what)

def code_of(f):
    try:
        f()
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()

def create(seed=7, **kw):
    return S.CreateSession(pb.CreateSessionRequest(seed=seed, **kw), metadata=MD).session_id

def append(sid, doc=DOC):
    msgs = [pb.AppendRequest(session_id=sid, text=doc[:500])] + \
           [pb.AppendRequest(text=doc[i:i + 500]) for i in range(500, len(doc), 500)]
    last = None
    for p in S.Append(iter(msgs), metadata=MD):
        last = p
    return last

def gen(sid, n):
    toks = []
    for r in S.Generate(pb.GenerateRequest(session_id=sid, max_tokens=n, ignore_eos=True), metadata=MD):
        toks.extend(r.token_ids)
    return toks

def get(sid):
    return S.GetSession(pb.GetSessionRequest(session_id=sid), metadata=MD)

def trailer(e):
    for k, v in (e.trailing_metadata() or ()):
        if k == "x-hyla-tokens-delivered":
            return int(v)
    return None

# the uninterrupted twin
twin_id = create()
append(twin_id)
twin = gen(twin_id, N)
check(len(twin) == N, "twin generated %d tokens" % len(twin))

def interrupted(name, action, want_code, sid=None):
    """Generate N on sid (default: a new session fed DOC), run action(sid, call) after K tokens,
    read to the end."""
    if sid is None:
        sid = create()
        append(sid)
    call = S.Generate(pb.GenerateRequest(session_id=sid, max_tokens=N, ignore_eos=True), metadata=MD)
    got, code, delivered = [], grpc.StatusCode.OK, None
    try:
        for r in call:
            got.extend(r.token_ids)
            if len(got) >= K and action:
                a, action = action, None
                a(sid, call)
    except grpc.RpcError as e:
        code, delivered = e.code(), trailer(e)
    check(code == want_code, "%s: the stream ends %s (got %s after %d tokens)" % (name, want_code, code, len(got)))
    check(got == twin[:len(got)], "%s: the %d tokens received are the twin's first ones" % (name, len(got)))
    return sid, got, code, delivered

def continue_and_compare(name, sid, got, exact):
    s = get(sid)
    if exact:
        check(s.generated == len(got), "%s: Session.generated %d == tokens received %d" % (name, s.generated, len(got)))
    else:
        check(len(got) <= s.generated <= N, "%s: tokens received %d <= Session.generated %d (gap %d: in flight when "
              "the client cancelled)" % (name, len(got), s.generated, s.generated - len(got)))
    kept = s.generated
    rest = gen(sid, N - kept) if kept < N else []
    check(twin[:kept] + rest == twin, "%s: continuing after %d tokens gives the twin's tokens (no duplicate, no gap)"
          % (name, kept))

# Migrate mid-stream
def do_migrate(sid, call):
    S.Migrate(pb.MigrateRequest(session_id=sid), metadata=MD)
sid, got, code, d = interrupted("migrate", do_migrate, grpc.StatusCode.ABORTED)
check(d == len(got), "migrate: trailer x-hyla-tokens-delivered %s == %d received" % (d, len(got)))
continue_and_compare("migrate", sid, got, True)

# Pause with evict mid-stream
def do_pause_evict(sid, call):
    r = S.Pause(pb.PauseRequest(session_id=sid, evict=True), metadata=MD)
    check(r.session.state == cpb.SESSION_PAUSED and r.session.tier == cpb.TIER_STORE, "pause evict: PAUSED in the store")
sid, got, code, d = interrupted("pause-evict", do_pause_evict, grpc.StatusCode.ABORTED)
check(d == len(got), "pause-evict: trailer %s == %d received" % (d, len(got)))
s = get(sid)
check(s.generated == len(got), "pause-evict: Session.generated %d == %d (not counted twice)" % (s.generated, len(got)))
continue_and_compare("pause-evict", sid, got, True)

# Pause (resident) mid-stream
def do_pause(sid, call):
    r = S.Pause(pb.PauseRequest(session_id=sid), metadata=MD)
    check(r.session.state == cpb.SESSION_PAUSED and r.session.tier == cpb.TIER_GPU and r.session.group_id,
          "pause: state PAUSED, the resident copy in tier GPU on group %s" % r.session.group_id)
sid, got, code, d = interrupted("pause", do_pause, grpc.StatusCode.ABORTED)
check(d == len(got), "pause: trailer %s == %d received" % (d, len(got)))
continue_and_compare("pause", sid, got, True)
check(get(sid).state == cpb.SESSION_ACTIVE, "pause: a Generate makes the session ACTIVE again")

# client cancel mid-stream
sid, got, code, d = interrupted("cancel", lambda sid, call: call.cancel(), grpc.StatusCode.CANCELLED)
time.sleep(0.3)  # the worker sees the cancellation at its next step
continue_and_compare("cancel", sid, got, False)

# deadline
sid = create()
append(sid)
got = []
try:
    for r in S.Generate(pb.GenerateRequest(session_id=sid, max_tokens=60000, ignore_eos=True), metadata=MD,
                        timeout=0.3):
        got.extend(r.token_ids)
    code = grpc.StatusCode.OK
except grpc.RpcError as e:
    code = e.code()
check(code == grpc.StatusCode.DEADLINE_EXCEEDED, "deadline: the stream ends DEADLINE_EXCEEDED (%s, %d tokens)"
      % (code, len(got)))
time.sleep(0.3)
s = get(sid)
check(len(got) <= s.generated, "deadline: received %d <= Session.generated %d" % (len(got), s.generated))
check(got == twin[:len(got)], "deadline: what arrived is the twin's prefix")

# Delete mid-stream: CANCELLED
sid, got, code, d = interrupted("delete", lambda sid, call: S.DeleteSession(pb.DeleteSessionRequest(session_id=sid),
                                metadata=MD), grpc.StatusCode.CANCELLED)
check(d == len(got), "delete: trailer %s == %d received" % (d, len(got)))
check(code_of(lambda: get(sid)) == grpc.StatusCode.NOT_FOUND, "delete: the session is gone")

# 1. an Append whose second message names another session leaves the first one usable
a = create()
b = create()
msgs = [pb.AppendRequest(session_id=a, text=b"hello "), pb.AppendRequest(session_id=b, text=b"world")]
check(code_of(lambda: [p for p in S.Append(iter(msgs), metadata=MD)]) == grpc.StatusCode.INVALID_ARGUMENT,
      "append naming two sessions: INVALID_ARGUMENT")
ok = None
for _ in range(20):  # the worker ends the orphaned call at its next step
    ok = code_of(lambda: append(a))
    if ok == grpc.StatusCode.OK:
        break
    time.sleep(0.1)
check(ok == grpc.StatusCode.OK, "append naming two sessions: the first session takes a new Append (%s)" % ok)
check(len(gen(a, 5)) == 5, "append naming two sessions: ... and a Generate")

# every other failure of an Append or a Generate releases the session too
def usable(sid, what):
    c = None
    for _ in range(20):
        c = code_of(lambda: append(sid, b"more text "))
        if c == grpc.StatusCode.OK:
            break
        time.sleep(0.1)
    check(c == grpc.StatusCode.OK and len(gen(sid, 2)) == 2, "%s: the session takes the next Append and Generate (%s)"
          % (what, c))

f = create()
append(f)
for msgs, want, what in (
        ([pb.AppendRequest(session_id=f, text=b"x", tokens=[1])], grpc.StatusCode.INVALID_ARGUMENT, "a chunk with text and tokens"),
        ([pb.AppendRequest(session_id=f, tokens=[1, 2]), pb.AppendRequest(tokens=[1 << 30])], grpc.StatusCode.INVALID_ARGUMENT,
         "a token outside the vocabulary"),
        ([pb.AppendRequest(session_id=f + "\0x", text=b"x")], grpc.StatusCode.INVALID_ARGUMENT, "a first message with a NUL id")):
    check(code_of(lambda: [p for p in S.Append(iter(msgs), metadata=MD)]) == want, "append with %s: %s" % (what, want))
    usable(f, "append with " + what)
check(code_of(lambda: [r for r in S.Generate(pb.GenerateRequest(session_id=f, max_tokens=70000), metadata=MD)]) ==
      grpc.StatusCode.INVALID_ARGUMENT, "generate with max_tokens 70000: INVALID_ARGUMENT")
usable(f, "generate over the limit")

def slow_chunks():  # a client that cancels in the middle of its document
    yield pb.AppendRequest(session_id=f, text=b"first chunk ")
    time.sleep(0.2)
    yield pb.AppendRequest(text=b"second chunk ")
    time.sleep(5)
call = S.Append(slow_chunks(), metadata=MD)
threading.Timer(0.5, call.cancel).start()
check(code_of(lambda: [p for p in call]) == grpc.StatusCode.CANCELLED, "append cancelled by the client: CANCELLED")
usable(f, "append cancelled by the client")

# 2. session ids byte for byte
victim = create()
for bad, what in ((victim + "\0zz", "a NUL byte"), (victim[:4] + " " + victim[5:], "a space"), ("s-" + "0" * 30, "32 bytes"),
                  ("", "empty")):
    c1 = code_of(lambda: S.DeleteSession(pb.DeleteSessionRequest(session_id=bad), metadata=MD))
    check(c1 == grpc.StatusCode.INVALID_ARGUMENT, "DeleteSession with an id of %s: INVALID_ARGUMENT (%s)" % (what, c1))
    c2 = code_of(lambda: [r for r in S.Generate(pb.GenerateRequest(session_id=bad, max_tokens=1), metadata=MD)])
    check(c2 == grpc.StatusCode.INVALID_ARGUMENT, "Generate with an id of %s: INVALID_ARGUMENT (%s)" % (what, c2))
check(code_of(lambda: get(victim)) == grpc.StatusCode.OK, "the session whose id prefixes the bad ones is intact")

# 4. validation and semantics
check(code_of(lambda: [r for r in S.Generate(pb.GenerateRequest(session_id=victim, max_tokens=1, stop=[""]),
                                             metadata=MD)]) == grpc.StatusCode.INVALID_ARGUMENT,
      "stop [\"\"]: INVALID_ARGUMENT")
k = create(sampling=cpb.SamplingParams(temperature=0.8, top_k=-1))
check(get(k).sampling.top_k == 0, "top_k -1 is accepted and means off (stored as 0)")
p = create()
last = append(p)
s1 = get(p)
r = S.Pause(pb.PauseRequest(session_id=p), metadata=MD)
time.sleep(1.5)  # a heartbeat or two: position must not move without a call
s2 = get(p)
check(last.position == s1.position == r.session.position == r.snapshot.position == s2.position,
      "position: Append %d, Get %d, Pause %d, snapshot %d, later Get %d" % (last.position, s1.position,
      r.session.position, r.snapshot.position, s2.position))
g = list(S.Generate(pb.GenerateRequest(session_id=p, max_tokens=3, ignore_eos=True), metadata=MD))
check(g[-1].position == s1.position + 3 and get(p).position == s1.position + 3,
      "position after 3 generated tokens: %d (stream) %d (Get)" % (g[-1].position, get(p).position))

# last (it leaves one worker): the owning worker dies mid-stream. The stream ends UNAVAILABLE with
# the trailer; the session goes back to its last durable snapshot, and the next Generate says
# where it stands (GenerateResponse.generated): continuing from there gives the twin's tokens.
import signal
d = create()
append(d)
S.Pause(pb.PauseRequest(session_id=d), metadata=MD)  # a durable snapshot at the start
owner = get(d).worker_ids[0]
def do_kill(sid, call):
    os.kill(int(worker_pids[owner]), signal.SIGKILL)
sid, got, code, dl = interrupted("worker death", do_kill, grpc.StatusCode.UNAVAILABLE, sid=d)
check(dl == len(got), "worker death: trailer %s == %d received" % (dl, len(got)))
msgs = []
for _ in range(100):  # until the coordinator has declared the worker dead and re-placed the session
    try:
        msgs = list(S.Generate(pb.GenerateRequest(session_id=d, max_tokens=50, ignore_eos=True), metadata=MD))
        break
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNAVAILABLE:
            check(False, "worker death: the next Generate failed %s: %s" % (e.code(), e.details()))
            break
        time.sleep(0.2)
if msgs:
    start = msgs[0].generated - len(msgs[0].token_ids)
    toks = [t for m in msgs for t in m.token_ids]
    check(start <= len(got), "worker death: the session resumed at %d of the %d tokens received" % (start, len(got)))
    check(toks == twin[start:start + len(toks)], "worker death: the continuation from %d is the twin's" % start)
    check(get(d).worker_ids and get(d).worker_ids[0] != owner, "worker death: the session moved off %s" % owner)

if failures:
    print("%d check(s) failed" % len(failures), file=sys.stderr)
    sys.exit(1)
PY

e2e_done
