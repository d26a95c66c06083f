#!/usr/bin/env bash
# The Sessions API under interruption and bad input, with a client written from the .proto alone
# (grpcio stubs generated from proto/hyla/v1, no hyla library): hyla-coordinator and two
# hyla-worker processes on loopback, CPU backend, a tiny sse-h model.
#
# Every interrupted Generate is recovered by the rule of docs/API.md ("the session is the truth")
# and checked against an uninterrupted twin (same seed, same document): after the interruption the
# client asks ReadTokens (retrying UNAVAILABLE while the session is re-placed) for `generated`;
# it reads back the tokens it missed (generated > received), or drops the ones received beyond
# `generated` (the session went back to a durable snapshot), then continues with Generate; the
# result must equal the twin token for token:
#   - Migrate, Pause with evict, Pause, Delete: the stream ends (ABORTED, or CANCELLED for Delete)
#     with the trailer x-hyla-tokens-delivered equal to the tokens received and Session.generated
#     equal to it too;
#   - client cancel and deadline: the missed tokens are read back;
#   - the owning worker killed (last): UNAVAILABLE with the trailer; the session is back at its
#     durable snapshot; the tokens dropped come back identical, for a greedy session and for a
#     seeded sampling one (twins of their own).
# The token log: ReadTokens(0) equals the twin's first `generated` tokens after every case (so it
# survives Migrate, Pause, Pause with evict — answered from the store while paused — and a worker
# death); beyond `generated` it is empty; another tenant is refused PERMISSION_DENIED; below the
# log's first token OUT_OF_RANGE (a third worker, w3, runs with --token-log 64 for it, resident and
# from the store, and is then drained).
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
e2e_start_worker w3 "$E2E_DIR/model" --token-log 64 || e2e_done  # drained after the OUT_OF_RANGE check

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

def read(sid, frm=0, n=0, md=MD):
    return S.ReadTokens(pb.ReadTokensRequest(session_id=sid, from_generated=frm, max_tokens=n), metadata=md)

def read_retry(sid, frm=0):
    """ReadTokens, retried while the session is being re-placed (UNAVAILABLE)."""
    for _ in range(150):
        try:
            return read(sid, frm)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            time.sleep(0.2)
    return read(sid, frm)

def recover(name, sid, got, twin, n):
    """The client's side of the rule: the session is the truth. Returns the tokens the client
    holds after recovering (a prefix of the session's) and `generated`."""
    r = read_retry(sid, len(got))
    g = r.generated
    if g >= len(got):
        missed = list(r.token_ids)
        check(r.from_generated == len(got) and len(missed) == g - len(got),
              "%s: ReadTokens from %d returned the %d missed tokens (generated %d)" % (name, len(got), len(missed), g))
        have = got + missed
    else:
        check(not r.token_ids, "%s: ReadTokens beyond generated (%d >= %d) is empty" % (name, len(got), g))
        have = got[:g]  # drop what the session no longer holds: the next Generate produces it again
    log = read(sid).token_ids
    check(list(log) == twin[:g], "%s: the token log holds the twin's first %d tokens" % (name, g))
    return have, g

def continue_and_compare(name, sid, got, exact, twin=None, n=N):
    twin = twin if twin is not None else globals()["twin"]
    if exact:
        s = get(sid)
        check(s.generated == len(got), "%s: Session.generated %d == tokens received %d" % (name, s.generated, len(got)))
    have, g = recover(name, sid, got, twin, n)
    rest = gen(sid, n - g) if g < n else []
    check(have + rest == twin[:n], "%s: recovering at %d (received %d) and continuing gives the twin's tokens (no "
          "duplicate, no gap)" % (name, g, len(got)))
    return have, g, rest

def trailer(e):
    for k, v in (e.trailing_metadata() or ()):
        if k == "x-hyla-tokens-delivered":
            return int(v)
    return None

# OUT_OF_RANGE: a session on w3 (--token-log 64) keeps its last 64 generated tokens; then w3 is
# drained so that no other session lands on it
o = create(worker_hint="w3")
append(o)
ot = gen(o, 100)
check(get(o).worker_ids[0] == "w3", "the small-log session is on w3")
for where in ("resident", "in the store"):
    r = read(o, 36, 10)
    check(r.first_available == 36 and r.generated == 100 and list(r.token_ids) == ot[36:46],
          "%s: a 64-token log: first_available %d, generated %d, tokens from 36 as generated" % (where,
          r.first_available, r.generated))
    try:
        read(o, 35)
        check(False, "%s: ReadTokens below first_available is refused" % where)
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.OUT_OF_RANGE and "first_available 36" in e.details(),
              "%s: ReadTokens below first_available: OUT_OF_RANGE naming it (%s: %s)" % (where, e.code(), e.details()))
    S.Pause(pb.PauseRequest(session_id=o, evict=True), metadata=MD)
S.DeleteSession(pb.DeleteSessionRequest(session_id=o), metadata=MD)
C.DrainWorker(cl.DrainWorkerRequest(worker_id="w3", wait=True))

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
r = read(sid)  # answered from the committed snapshot: the session is in the store
check(s.state == cpb.SESSION_PAUSED and s.tier == cpb.TIER_STORE and list(r.token_ids) == twin[:len(got)] and
      r.generated == len(got), "pause-evict: ReadTokens of the session in the store gives its %d tokens" % len(got))
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
check(got == twin[:len(got)], "deadline: what arrived is the twin's prefix")
continue_and_compare("deadline", sid, got, False)

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

# ReadTokens: beyond `generated` empty, another tenant refused, a bad id refused
q = create()
append(q)
qt = gen(q, 30)
r = read(q, 30)
check(not r.token_ids and r.generated == 30 and r.first_available == 0, "ReadTokens at generated: empty, generated 30")
r = read(q, 1000)
check(not r.token_ids and r.generated == 30, "ReadTokens beyond generated: empty, generated 30")
r = read(q, 10, 5)
check(list(r.token_ids) == qt[10:15] and r.from_generated == 10, "ReadTokens from 10, at most 5: tokens 10..14")
c = code_of(lambda: read(q, md=(("x-hyla-tenant", "someone-else"),)))
check(c == grpc.StatusCode.PERMISSION_DENIED, "ReadTokens of another tenant's session: PERMISSION_DENIED (%s)" % c)
c = code_of(lambda: read(q + "\0x"))
check(c == grpc.StatusCode.INVALID_ARGUMENT, "ReadTokens with a NUL in the id: INVALID_ARGUMENT (%s)" % c)
c = code_of(lambda: read("s-none"))
check(c == grpc.StatusCode.NOT_FOUND, "ReadTokens of an unknown session: NOT_FOUND (%s)" % c)
# a fork inherits the log
fk = S.Fork(pb.ForkRequest(session_id=q), metadata=MD).session_id
check(list(read(fk).token_ids) == qt, "a fork's token log is its parent's")

# last (it leaves one worker): the owning worker dies mid-stream. The stream ends UNAVAILABLE with
# the trailer; the session goes back to its last durable snapshot: ReadTokens (retried while the
# session is re-placed) says where (`generated`), the client drops what it received beyond it,
# and Generate produces those positions again, identical, for a greedy session (d) and for a
# seeded sampling one (e, which had generated 50 tokens, been paused, and generated 150 more on
# the same worker: it goes back to 50, with the token log of that snapshot).
import signal
SAMPLING = cpb.SamplingParams(temperature=0.9, top_k=40, top_p=0.95)
ES = 200
twin_e_id = create(seed=9, sampling=SAMPLING)
append(twin_e_id)
twin_e = gen(twin_e_id, ES)
d = create()
append(d)
S.Pause(pb.PauseRequest(session_id=d), metadata=MD)  # a durable snapshot at the start
owner = get(d).worker_ids[0]
e = create(seed=9, sampling=SAMPLING, worker_hint=owner)
append(e)
got_e = gen(e, 50)
S.Pause(pb.PauseRequest(session_id=e), metadata=MD)  # durable at generated 50: its log survives the death
got_e += gen(e, ES - 50)
check(got_e == twin_e and get(e).worker_ids[0] == owner, "sampled session on %s: its %d tokens are its twin's"
      % (owner, ES))
def do_kill(sid, call):
    os.kill(int(worker_pids[owner]), signal.SIGKILL)
sid, got, code, dl = interrupted("worker death", do_kill, grpc.StatusCode.UNAVAILABLE, sid=d)
check(dl == len(got), "worker death: trailer %s == %d received" % (dl, len(got)))
have, g, rest = continue_and_compare("worker death", d, got, False)
check(g <= len(got), "worker death: the session went back to its snapshot at %d of the %d received" % (g, len(got)))
check(rest[:len(got) - g] == got[g:], "worker death (greedy): the %d tokens dropped come back identical" % (len(got) - g))
check(get(d).worker_ids and get(d).worker_ids[0] != owner, "worker death: the session moved off %s" % owner)
have_e, g_e, rest_e = continue_and_compare("worker death (sampled)", e, got_e, False, twin_e, ES)
check(g_e == 50 and rest_e[:ES - g_e] == got_e[g_e:], "worker death (sampled): back at %d (its Pause at 50), the %d "
      "tokens dropped come back identical" % (g_e, ES - g_e))

if failures:
    print("%d check(s) failed" % len(failures), file=sys.stderr)
    sys.exit(1)
PY

e2e_done
