#!/usr/bin/env python3
"""test_hyla_client.py: checks of hyla_client.py against the fake server of tests/test_client_fake.c
(run by tests/test_client_cli.c in its python mode, which starts the fake and arms its one-shot
"fail the next Generate after 3 tokens" knob first). Not a test of a real cluster: the fake's
"model" emits chr(ord('a') + (31 * position + seed) % 26) per token.

    test_hyla_client.py --server 127.0.0.1:PORT
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hyla_client import Client, HylaError  # noqa: E402

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL: " + what, file=sys.stderr)


def expected(pos, seed, n):
    return bytes(ord("a") + (31 * (pos + i) + seed) % 26 for i in range(n))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    a = ap.parse_args()
    with Client(a.server, tenant="py") as c:
        s = c.create_session(seed=3)
        sid = s.session_id
        check(sid.startswith("s-") and len(sid) == 18, "session id " + sid)
        check(s.tenant == "py" and s.model == "tiny", "tenant/model %s/%s" % (s.tenant, s.model))

        reports = []
        last = c.append(sid, b"x" * 1000, chunk_bytes=100, progress=reports.append)
        check(last.done and last.tokens_ingested == 1000 and last.position == 1000, "append final %s" % last)
        check(len(reports) >= 2, "%d progress reports" % len(reports))
        last = c.append(sid, tokens=range(50), chunk_tokens=16)
        check(last.position == 1050, "append tokens position %d" % last.position)

        # the armed knob: this generate fails after 3 tokens with UNAVAILABLE
        pieces = []
        try:
            c.generate(sid, 8, on_piece=lambda ids, text: pieces.append(text))
            check(False, "generate did not fail")
        except HylaError as e:
            check(e.code_name == "UNAVAILABLE" and e.delivered == 3 and e.server_delivered == 3,
                  "error %s delivered %s/%s" % (e, e.delivered, e.server_delivered))
            check("call generate again" in str(e), "message: %s" % e)
        check(b"".join(pieces) == expected(1050, 3, 3), "pieces before the failure %r" % pieces)
        r = c.generate(sid, 5)
        check(r.text == expected(1053, 3, 5) and r.finish_reason == "length" and r.delivered == 5,
              "continuation %r %s" % (r.text, r))

        r = c.generate(sid, 4, temperature=0.5, seed=11)
        check(r.text == expected(1058, 11, 4), "reseeded %r" % r.text)
        check(abs(c.get(sid).sampling.temperature - 0.5) < 1e-6, "temperature kept")

        p = c.pause(sid, evict=True)
        check(p.snapshot.version == 1 and p.snapshot.position == 1062, "pause %s" % p.snapshot)
        s = c.resume(sid, worker="w-2")
        check(s.group_id == "g-2" and list(s.worker_ids) == ["w-2"], "resume %s" % s.group_id)
        m = c.migrate(sid)
        check(m.from_group_id == "g-2" and m.session.group_id == "g-1", "migrate %s" % m)
        f = c.fork(sid, seed=5)
        check(f.parent_session_id == sid and f.seed == 5 and f.position == 1062, "fork %s" % f)

        ids = [x.session_id for x in c.list()]
        check(ids == sorted([sid, f.session_id]), "list %s" % ids)

        for call, want in ((lambda: c.get("s-00000000000000ff"), "NOT_FOUND"),
                           (lambda: Client(a.server, tenant="other").get(sid), "PERMISSION_DENIED"),
                           (lambda: c.generate(sid, 0), "INVALID_ARGUMENT"),
                           (lambda: c.create_session(model="nope"), "NOT_FOUND")):
            try:
                call()
                check(False, "no error, want " + want)
            except HylaError as e:
                check(e.code_name == want, "got %s want %s" % (e, want))

        workers, tiers = c.cluster_status()
        check([w.worker_id for w in workers.workers] == ["w-1", "w-2"], "workers")
        check(tiers["gpu"] >= 2, "tiers %s" % tiers)
        d = c.drain("w-2", wait=True)
        check(d.worker.worker_id == "w-2", "drain %s" % d)
        check(c.delete(f.session_id) == 0 and c.delete(sid) == 2, "delete")
        check(c.list() == [], "list after delete")
    if failures:
        print("test_hyla_client.py: %d failure(s)" % failures, file=sys.stderr)
        return 1
    print("test_hyla_client.py: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
