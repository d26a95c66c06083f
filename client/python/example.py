#!/usr/bin/env python3
"""example.py: the life of a hyla session from Python (client/python/hyla_client.py).

    /usr/bin/python3 client/python/example.py --server 127.0.0.1:7000 [--tenant T] [--api-key K] [--tls-ca CA] [--file DOC]
        [--model NAME] [-n N] [--temperature T] [--seed S]

Creates a session, appends a document (DOC, or a built-in text) with progress on stderr,
generates N tokens (text on stdout as it comes), pauses (a durable snapshot), resumes, and
generates N more. Exits 0 on success; on failure prints the error (gRPC code name and the
server's message) on stderr and exits 1 (4 for UNAVAILABLE, like the hyla CLI).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hyla_client import Client, HylaError  # noqa: E402

DEFAULT_TEXT = (
    "Linear attention keeps a fixed-size state per layer instead of a cache that grows with "
    "every token, so a conversation of any length can be saved, resumed and moved. ") * 20


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", default=os.environ.get("HYLA_SERVER"), help="coordinator host:port ($HYLA_SERVER)")
    ap.add_argument("--tenant", default=os.environ.get("HYLA_TENANT"))
    ap.add_argument("--api-key", default=None, help="API key ($HYLA_API_KEY); required by a keyed coordinator")
    ap.add_argument("--tls-ca", default=None, help="PEM CA of a TLS coordinator ($HYLA_TLS_CA)")
    ap.add_argument("--file", help="document to append (default: a built-in text)")
    ap.add_argument("--model", default="", help="model name (may be omitted when the cluster serves one)")
    ap.add_argument("-n", type=int, default=32, help="tokens per generate call (default 32)")
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if not a.server:
        ap.error("--server ADDR (or HYLA_SERVER) is required")

    def show(piece_ids, text):
        sys.stdout.write(text.decode("utf-8", errors="replace"))
        sys.stdout.flush()

    try:
        with Client(a.server, tenant=a.tenant, api_key=a.api_key, tls_ca=a.tls_ca) as c:
            s = c.create_session(model=a.model, temperature=a.temperature, seed=a.seed)
            sid = s.session_id
            print("session %s (model %s, group %s)" % (sid, s.model, s.group_id or "-"), file=sys.stderr)

            doc = open(a.file, "rb").read() if a.file else DEFAULT_TEXT.encode()

            def progress(p):
                total = p.total_tokens or "?"
                print("  append: %d/%s tokens ingested, %.0f tokens/s%s"
                      % (p.tokens_ingested, total, p.tokens_per_second, " (done)" if p.done else ""),
                      file=sys.stderr)

            last = c.append(sid, doc, progress=progress)
            print("appended: position %d" % last.position, file=sys.stderr)

            r1 = c.generate(sid, a.n, on_piece=show)
            print("", file=sys.stderr)
            print("generated %d tokens (finish: %s)" % (r1.delivered, r1.finish_reason), file=sys.stderr)

            snap = c.pause(sid).snapshot
            print("paused: snapshot version %d at position %d, %d bytes of state, %d stored"
                  % (snap.version, snap.position, snap.state_bytes, snap.stored_bytes), file=sys.stderr)

            s = c.resume(sid)
            print("resumed on group %s (workers %s)" % (s.group_id or "-", ",".join(s.worker_ids) or "-"),
                  file=sys.stderr)

            r2 = c.generate(sid, a.n, on_piece=show)
            sys.stdout.write("\n")
            print("generated %d more tokens (finish: %s); session position %d"
                  % (r2.delivered, r2.finish_reason, r2.position), file=sys.stderr)
            print("RESULT session=%s position=%d snapshot=%d tokens=%d"
                  % (sid, r2.position, snap.version, r1.delivered + r2.delivered), file=sys.stderr)
    except HylaError as e:
        print("example.py: %s" % e, file=sys.stderr)
        return 4 if e.code_name == "UNAVAILABLE" else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
