#!/usr/bin/env bash
# The Python client (client/python/hyla_client.py, grpcio) against a real
# cluster — hyla-coordinator and two hyla-worker processes on loopback, CPU backend, a tiny sse-h
# model. example.py does create / append / generate / pause / resume; then the identity that
# matters: 32 tokens generated in one go equal 16 + Pause (evict) + Resume on the other worker + 16
# in a second session fed the same document; export_session / import_session (path, file object,
# bytes) continue identically, a damaged file is DATA_LOSS and leaves nothing. Skips (77) until the binaries exist, or without a
# python3 that imports grpc and grpc_tools.
set -uo pipefail
. "${HYLA_SOURCE_DIR:-.}/tests/e2e/lib.sh"
e2e_init python
PY=$(e2e_python) || e2e_skip "no python3 that imports grpc and grpc_tools (apt-get install python3-grpcio python3-grpc-tools)"

e2e_make_model "$E2E_DIR/model"
e2e_start_coordinator || e2e_done
e2e_start_worker w1 "$E2E_DIR/model" || e2e_done
e2e_start_worker w2 "$E2E_DIR/model" || e2e_done

doc="$E2E_DIR/doc.txt"
for i in $(seq 1 40); do
  echo "Line $i of a document that the python client streams into a session in chunks."
done >"$doc"

# 1. the example, as a user runs it
if "$PY" "$E2E_SRC/client/python/example.py" --server "$E2E_SERVER" --tenant py --file "$doc" -n 16 \
    >"$E2E_DIR/example.out" 2>"$E2E_DIR/example.err"; then
  grep -q "RESULT session=s-" "$E2E_DIR/example.err" || e2e_fail "example.py printed no RESULT line"
  grep -q "paused: snapshot version" "$E2E_DIR/example.err" || e2e_fail "example.py: no pause report"
  e2e_log "ok: example.py"
else
  e2e_fail "example.py failed: $(tail -c 600 "$E2E_DIR/example.err")"
fi

# 2. the identity through the Python API
HYLA_PROTO_DIR="$E2E_SRC/proto" "$PY" - "$E2E_SERVER" "$E2E_SRC/client/python" "$doc" <<'PY' || e2e_fail "python identity check"
import sys
sys.path.insert(0, sys.argv[2])
from hyla_client import Client

server, doc = sys.argv[1], open(sys.argv[3], "rb").read()
with Client(server, tenant="py-identity") as c:
    a = c.create_session(seed=7).session_id
    c.append(a, doc, chunk_bytes=1000)
    full = c.generate(a, 32, ignore_eos=True).token_ids

    b = c.create_session(seed=7).session_id
    c.append(b, doc, chunk_bytes=1000)
    first = c.generate(b, 16, ignore_eos=True).token_ids
    placed = set(c.get(b).worker_ids)
    snap = c.pause(b, evict=True).snapshot
    assert snap.version >= 1 and snap.position > 0, snap
    workers, _ = c.cluster_status()
    other = [w.worker_id for w in workers.workers if w.worker_id not in placed and w.state == 1]
    assert other, "no other ready worker than %s" % placed
    s = c.resume(b, worker=other[0])
    assert set(s.worker_ids) == {other[0]}, "resumed on %s, asked %s" % (list(s.worker_ids), other[0])
    second = c.generate(b, 16, ignore_eos=True).token_ids
    if full != first + second:
        print("uninterrupted: %s\npaused/resumed: %s" % (full, first + second), file=sys.stderr)
        sys.exit(1)
    print("python identity ok: 32 == 16 + pause + resume (%s -> %s) + 16" % (",".join(placed), ",".join(s.worker_ids)),
          file=sys.stderr)
    # read_tokens: the session's token log, carried through the evicting pause and the resume
    r = c.read_tokens(b)
    if list(r.token_ids) != full or r.generated != 32 or r.first_available != 0:
        print("read_tokens: %s (generated %d, first %d), expected %s" % (list(r.token_ids), r.generated,
              r.first_available, full), file=sys.stderr)
        sys.exit(1)
    r = c.read_tokens(b, 20, 5)
    assert list(r.token_ids) == full[20:25] and r.from_generated == 20, r
    assert not c.read_tokens(b, 32).token_ids
    c.delete(a)
    c.delete(b)
PY

# 3. export and import through the Python API: the import continues as the original does
HYLA_PROTO_DIR="$E2E_SRC/proto" "$PY" - "$E2E_SERVER" "$E2E_SRC/client/python" "$doc" "$E2E_DIR/py.hys" <<'PY' ||
import io, sys
sys.path.insert(0, sys.argv[2])
from hyla_client import Client, HylaError

server, doc, path = sys.argv[1], open(sys.argv[3], "rb").read(), sys.argv[4]
with Client(server, tenant="py-port") as c:
    models = c.list_models()
    assert [m.name for m in models] == ["model"] and models[0].ready_workers == 2, models
    a = c.create_session(seed=3, temperature=0.8, top_k=10).session_id
    c.append(a, doc)
    c.generate(a, 4, ignore_eos=True)
    version, position, size, model = c.export_session(a, path)
    assert version >= 1 and position > 0 and size > 0 and model == "model", (version, position, size, model)
    buf = io.BytesIO()
    assert c.export_session(a, buf, version=version)[0] == version
    assert buf.getvalue() == open(path, "rb").read(), "export to a file object != export to a path"
    b = c.import_session(path, session_id="py-imported")
    assert b.session_id == "py-imported" and b.position == position, b
    d = c.import_session(buf.getvalue())
    want = c.generate(a, 8, ignore_eos=True).token_ids
    assert c.generate(b.session_id, 8, ignore_eos=True).token_ids == want, "import from a path"
    assert c.generate(d.session_id, 8, ignore_eos=True).token_ids == want, "import from bytes"
    damaged = bytearray(buf.getvalue())
    damaged[len(damaged) // 2] ^= 0xFF
    try:
        c.import_session(bytes(damaged), session_id="py-damaged")
        raise SystemExit("python: a damaged file was imported")
    except HylaError as e:
        assert e.code_name == "DATA_LOSS", e
    try:
        c.get("py-damaged")
        raise SystemExit("python: the damaged import left a session")
    except HylaError as e:
        assert e.code_name == "NOT_FOUND", e
    print("python export/import ok", file=sys.stderr)
PY
  e2e_fail "python export/import"

e2e_done
