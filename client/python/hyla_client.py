"""hyla_client: a small Python client of a hyla cluster (hyla-coordinator) over grpcio.

The gRPC stubs are generated from the repository's proto/hyla/v1/*.proto when this module is
imported, with grpc_tools.protoc, into a temporary directory that is removed at exit; nothing
generated is committed. On Debian: apt-get install python3-grpcio python3-grpc-tools.

    from hyla_client import Client, HylaError
    with Client("127.0.0.1:7000", api_key=os.environ["HYLA_API_KEY"]) as c:
        s = c.create_session(temperature=0.8, seed=42)
        c.append(s.session_id, open("book.txt", "rb"), progress=print)
        r = c.generate(s.session_id, 64, on_piece=lambda ids, text: print(text.decode(errors="replace"), end=""))
        c.pause(s.session_id)

Errors are raised as HylaError with the gRPC code name (e.code_name) and the server's message.
A Generate that fails part-way (ABORTED when the session was paused or migrated, UNAVAILABLE
when its worker died) raises HylaError with e.delivered = tokens already delivered; the session
kept exactly those (after ABORTED), so calling generate again continues with no gap. After any
interruption (a cancel, a deadline, a coordinator restart, a worker failure) the session is the
truth: compare get(id).generated with the tokens received, R; read_tokens(id, R) returns the ones
missed when it is larger, and the last R - generated received are dropped when it is smaller (the
session went back to its last durable snapshot; generate produces them again). docs/CLIENTS.md
describes the calls.
"""

import atexit
import importlib
import os
import shutil
import sys
import tempfile
import time

import grpc

TENANT_KEY = "x-hyla-tenant"
AUTH_KEY = "authorization"
TOKENS_DELIVERED_KEY = "x-hyla-tokens-delivered"

_DEFAULT_PROTO_DIR = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto"))

pb = None  # namespace with common_pb2, sessions_pb2, sessions_pb2_grpc, cluster_pb2, cluster_pb2_grpc


class _Stubs:
    pass


def load_stubs(proto_dir=None):
    """Generate and import the hyla.v1 Python stubs (once per process). proto_dir: the directory
    holding hyla/v1/*.proto (default: $HYLA_PROTO_DIR, else ../../proto next to this file)."""
    global pb
    if pb is not None:
        return pb
    from grpc_tools import protoc

    proto_dir = proto_dir or os.environ.get("HYLA_PROTO_DIR") or _DEFAULT_PROTO_DIR
    files = [os.path.join(proto_dir, "hyla", "v1", name + ".proto") for name in ("common", "sessions", "cluster")]
    for f in files:
        if not os.path.exists(f):
            raise FileNotFoundError("hyla_client: %s not found (set HYLA_PROTO_DIR to the repository's proto/)" % f)
    out = tempfile.mkdtemp(prefix="hyla-stubs-")
    atexit.register(shutil.rmtree, out, True)
    args = ["grpc_tools.protoc", "-I" + proto_dir]
    try:  # the well-known types, where the package ships them (ours do not import any)
        import grpc_tools
        wk = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        if os.path.isdir(wk):
            args.append("-I" + wk)
    except ImportError:
        pass
    args += ["--python_out=" + out, "--grpc_python_out=" + out] + files
    if protoc.main(args) != 0:
        raise RuntimeError("hyla_client: grpc_tools.protoc failed on " + proto_dir)
    sys.path.insert(0, out)
    ns = _Stubs()
    for mod in ("common_pb2", "sessions_pb2", "sessions_pb2_grpc", "cluster_pb2", "cluster_pb2_grpc"):
        setattr(ns, mod, importlib.import_module("hyla.v1." + mod))
    pb = ns
    return pb


class HylaError(Exception):
    """A failed call. code: grpc.StatusCode (None for a local failure); code_name: its name
    ("NOT_FOUND", "UNAVAILABLE", ...); details: the server's message; delivered: tokens a failed
    generate delivered before the failure (None for other calls); server_delivered: the count
    in the server's x-hyla-tokens-delivered trailer of a failed generate (None if absent)."""

    def __init__(self, call, code, details, delivered=None):
        self.call = call
        self.code = code
        self.code_name = code.name if code is not None else "LOCAL"
        self.details = details or ""
        self.delivered = delivered
        self.server_delivered = None
        msg = "%s: %s: %s" % (call, self.code_name, self.details or "(no message)")
        if delivered:
            msg += "; %d token(s) were delivered before the failure" % delivered
            if code == grpc.StatusCode.ABORTED:
                msg += "; the session kept them: call generate again to continue"
            elif code == grpc.StatusCode.UNAVAILABLE:
                msg += "; call generate again to continue (from the session's last durable state)"
        super().__init__(msg)


def _error(call, e, delivered=None):
    return HylaError(call, e.code(), e.details(), delivered)


class GenerateResult:
    """What a generate call delivered: token ids, their text (bytes), finish reason ("length",
    "stop", "eos"), the session position after the last token, and the count."""

    def __init__(self):
        self.token_ids = []
        self.text = b""
        self.finish_reason = None
        self.position = 0
        self.delivered = 0

    def __repr__(self):
        return "GenerateResult(delivered=%d, finish_reason=%r, position=%d)" % (
            self.delivered, self.finish_reason, self.position)


_FINISH = {1: "length", 2: "stop", 3: "eos"}


class Client:
    """A connection to one coordinator for one tenant. timeout: deadline in seconds of each call
    except append and generate (None: none). Thread-safe like a grpc channel."""

    def __init__(self, server, tenant=None, timeout=60.0, proto_dir=None, api_key=None, tls_ca=None):
        """api_key: the tenant's API key (default $HYLA_API_KEY), sent as "authorization: Bearer
        KEY"; a coordinator started with --admin-key-file requires one and takes the tenant from
        it. tls_ca: PEM file of the CA of the coordinator's certificate (default $HYLA_TLS_CA):
        connect with TLS."""
        load_stubs(proto_dir)
        self.server = server
        self.tenant = tenant
        self.timeout = timeout
        api_key = api_key if api_key is not None else os.environ.get("HYLA_API_KEY") or None
        tls_ca = tls_ca if tls_ca is not None else os.environ.get("HYLA_TLS_CA") or None
        md = []
        if tenant:
            md.append((TENANT_KEY, tenant))
        if api_key:
            md.append((AUTH_KEY, "Bearer " + api_key))
        self._metadata = tuple(md)
        if tls_ca:
            with open(tls_ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            self._channel = grpc.secure_channel(server, creds)
        else:
            self._channel = grpc.insecure_channel(server)
        self._sessions = pb.sessions_pb2_grpc.SessionsStub(self._channel)
        self._cluster = pb.cluster_pb2_grpc.ClusterStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- helpers --------------------------------------------------------------------------

    def _unary(self, name, method, request, timeout=-1):
        try:
            return method(request, timeout=self.timeout if timeout == -1 else timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise _error(name, e) from None

    def _sampling(self, session_id, temperature, top_k, top_p):
        """The session's current sampling with the given values on top (None: keep)."""
        if temperature is None and top_k is None and top_p is None:
            return None
        cur = self.get(session_id).sampling
        return pb.common_pb2.SamplingParams(
            temperature=cur.temperature if temperature is None else temperature,
            top_k=cur.top_k if top_k is None else top_k,
            top_p=cur.top_p if top_p is None else top_p)

    def _resample(self, req, session_id, temperature, top_k, top_p, seed):
        """Set req's sampling (the given values over the session's) and reseed when asked:
        Generate and Fork change a session's sampling the same way."""
        sampling = self._sampling(session_id, temperature, top_k, top_p)
        if sampling is not None:
            req.sampling.CopyFrom(sampling)
        if seed is not None:
            req.reseed = True
            req.seed = seed

    # -- Sessions -------------------------------------------------------------------------

    def create_session(self, model="", temperature=None, top_k=None, top_p=None, seed=0, worker=None):
        """A new empty session; returns its Session message (.session_id). model may be "" when
        the cluster serves one model. Sampling values not given are 0 (temperature 0: greedy)."""
        req = pb.sessions_pb2.CreateSessionRequest(model=model or "", seed=seed, worker_hint=worker or "")
        if temperature is not None or top_k is not None or top_p is not None:
            req.sampling.CopyFrom(pb.common_pb2.SamplingParams(
                temperature=temperature or 0.0, top_k=top_k or 0, top_p=top_p or 0.0))
        return self._unary("CreateSession", self._sessions.CreateSession, req)

    def append(self, session_id, text=None, tokens=None, chunk_bytes=65536, chunk_tokens=16384, add_bos=False,
               total_bytes=0, progress=None):
        """Feed a document: text (str, bytes, or a binary file object read in chunks) or tokens (a
        sequence of ints). progress(AppendProgress) is called for each report of the server.
        Returns the last AppendProgress (done=True)."""
        if (text is None) == (tokens is None):
            raise ValueError("append: give exactly one of text and tokens")
        if isinstance(text, str):
            text = text.encode("utf-8")
        if isinstance(text, (bytes, bytearray)) and not total_bytes:
            total_bytes = len(text)
        first = {"session_id": session_id, "total_bytes_hint": total_bytes, "add_bos": add_bos}
        if tokens is not None:
            tokens = list(tokens)
            first["total_tokens_hint"] = len(tokens)

        def chunks():
            if tokens is not None:
                for i in range(0, max(len(tokens), 1), chunk_tokens):
                    yield {"tokens": tokens[i:i + chunk_tokens]}
            elif isinstance(text, (bytes, bytearray)):
                for i in range(0, max(len(text), 1), chunk_bytes):
                    yield {"text": bytes(text[i:i + chunk_bytes])}
            else:  # a file object
                sent = False
                while True:
                    b = text.read(chunk_bytes)
                    if not b:
                        break
                    if isinstance(b, str):
                        b = b.encode("utf-8")
                    sent = True
                    yield {"text": b}
                if not sent:
                    yield {"text": b""}

        def requests():
            for i, c in enumerate(chunks()):
                if i == 0:
                    c = dict(first, **c)
                yield pb.sessions_pb2.AppendRequest(**c)

        last = None
        try:
            for p in self._sessions.Append(requests(), metadata=self._metadata):
                last = p
                if progress:
                    progress(p)
        except grpc.RpcError as e:
            raise _error("Append " + session_id, e) from None
        return last

    def generate(self, session_id, max_tokens, stop=(), stop_token_ids=(), temperature=None, top_k=None,
                 top_p=None, seed=None, ignore_eos=False, on_piece=None):
        """Generate up to max_tokens tokens. on_piece(token_ids, text_bytes) is called as they
        arrive. Sampling values given change the session's sampling from now on (the others keep
        their current values); seed re-seeds the session's RNG. Returns a GenerateResult; raises
        HylaError with .delivered set when the call fails part-way."""
        req = pb.sessions_pb2.GenerateRequest(session_id=session_id, max_tokens=max_tokens, stop=list(stop),
                                              stop_token_ids=list(stop_token_ids), ignore_eos=ignore_eos)
        self._resample(req, session_id, temperature, top_k, top_p, seed)
        res = GenerateResult()
        call = self._sessions.Generate(req, metadata=self._metadata)
        try:
            for m in call:
                if m.token_ids or m.text:
                    res.token_ids.extend(m.token_ids)
                    res.text += m.text
                    res.delivered += len(m.token_ids)
                    res.position = m.position
                    if on_piece:
                        on_piece(list(m.token_ids), m.text)
                if m.done:
                    res.finish_reason = _FINISH.get(m.finish_reason, "unspecified")
        except grpc.RpcError as e:
            err = _error("Generate " + session_id, e, res.delivered)
            try:  # the server's own count, when it sent one
                md = dict(e.trailing_metadata() or ())
                err.server_delivered = int(md[TOKENS_DELIVERED_KEY]) if TOKENS_DELIVERED_KEY in md else None
            except (ValueError, TypeError, AttributeError):
                err.server_delivered = None
            raise err from None
        return res

    def pause(self, session_id, evict=False):
        """A durable snapshot; returns PauseResponse (.snapshot.version, sizes; .session)."""
        return self._unary("Pause " + session_id, self._sessions.Pause,
                           pb.sessions_pb2.PauseRequest(session_id=session_id, evict=evict))

    def resume(self, session_id, worker=None, version=0):
        """Place a paused session again (on worker's group if given); returns its Session.
        version: rewind to this kept snapshot version (list_snapshots): its state becomes the
        session's and is committed as a new head version; 0 = where the session is."""
        return self._unary("Resume " + session_id, self._sessions.Resume,
                           pb.sessions_pb2.ResumeRequest(session_id=session_id, worker_hint=worker or "",
                                                         version=version))

    def read_tokens(self, session_id, from_generated=0, max_tokens=0):
        """Generated tokens read back from the session's token log (its last 65536 generated
        tokens at least): a ReadTokensResponse with token_ids (generated indices from_generated
        on, at most max_tokens, 0 = up to 65536), text (their text when the model has a
        tokenizer), generated (Session.generated now) and first_available (the oldest index the
        log holds). from_generated below first_available raises HylaError OUT_OF_RANGE."""
        return self._unary("ReadTokens " + session_id, self._sessions.ReadTokens,
                           pb.sessions_pb2.ReadTokensRequest(session_id=session_id, from_generated=from_generated,
                                                             max_tokens=max_tokens))

    def list_snapshots(self, session_id):
        """The snapshot versions the store keeps of a session, ascending: a list of
        SnapshotVersion (version, position, generated, created_unix_ms, state_bytes,
        stored_bytes, head)."""
        return list(self._unary("ListSnapshots " + session_id, self._sessions.ListSnapshots,
                                pb.sessions_pb2.ListSnapshotsRequest(session_id=session_id)).snapshots)

    def migrate(self, session_id, to_worker=None):
        """Move to to_worker's group, or any other group; returns MigrateResponse."""
        return self._unary("Migrate " + session_id, self._sessions.Migrate,
                           pb.sessions_pb2.MigrateRequest(session_id=session_id, to_worker=to_worker or ""))

    def fork(self, session_id, temperature=None, top_k=None, top_p=None, seed=None, worker=None, version=0):
        """A new session with a copy of this one's state (or, version != 0, of that kept
        snapshot version, with its own sampling and RNG); returns the fork's Session."""
        req = pb.sessions_pb2.ForkRequest(session_id=session_id, worker_hint=worker or "", version=version)
        self._resample(req, session_id, temperature, top_k, top_p, seed)
        return self._unary("Fork " + session_id, self._sessions.Fork, req)

    def get(self, session_id):
        return self._unary("GetSession " + session_id, self._sessions.GetSession,
                           pb.sessions_pb2.GetSessionRequest(session_id=session_id))

    def list(self, model=None):
        """Every session of this tenant (all pages), ordered by id."""
        out, token = [], ""
        while True:
            r = self._unary("ListSessions", self._sessions.ListSessions,
                            pb.sessions_pb2.ListSessionsRequest(model=model or "", page_token=token))
            out.extend(r.sessions)
            if not r.next_page_token or r.next_page_token == token:
                return out
            token = r.next_page_token

    def delete(self, session_id):
        """Forget the session and its snapshots; returns the number of snapshots deleted."""
        return self._unary("DeleteSession " + session_id, self._sessions.DeleteSession,
                           pb.sessions_pb2.DeleteSessionRequest(session_id=session_id)).snapshots_deleted

    def export_session(self, session_id, out, version=0):
        """Write the session's portable snapshot file (docs/STATE_FORMAT.md) to out: a path, or a
        binary file object (written, not closed). version 0: its current state (an active
        session commits it first and stays active); else a kept version (list_snapshots). A
        path is written whole or not at all (PATH.tmp.PID, then renamed). Returns the first
        ExportSessionChunk's header: (version, position, total_bytes, model)."""
        if isinstance(out, (str, bytes, os.PathLike)):
            tmp = "%s.tmp.%d" % (os.fsdecode(out), os.getpid())
            try:
                with open(tmp, "wb") as f:
                    head = self.export_session(session_id, f, version)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, out)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            return head
        req = pb.sessions_pb2.ExportSessionRequest(session_id=session_id, version=version)
        head, got = None, 0
        try:
            for k in self._sessions.ExportSession(req, metadata=self._metadata):
                if head is None:
                    head = (k.version, k.position, k.total_bytes, k.model)
                out.write(k.data)
                got += len(k.data)
        except grpc.RpcError as e:
            raise _error("ExportSession " + session_id, e) from None
        if head is None or got != head[2]:
            raise HylaError("ExportSession " + session_id, None,
                            "the server sent %d of the file's %d bytes" % (got, head[2] if head else 0))
        return head

    def import_session(self, src, session_id=None, worker=None, chunk_bytes=1 << 20):
        """A new session of this tenant from a portable snapshot file: src is a path, bytes, or a
        binary file object (read to its end). session_id: the new id (None: the cluster chooses).
        Returns its Session. A damaged file raises HylaError DATA_LOSS, another model's
        FAILED_PRECONDITION, a taken id ALREADY_EXISTS; nothing is left behind."""
        if isinstance(src, (str, os.PathLike)):
            with open(src, "rb") as f:
                return self.import_session(f, session_id, worker, chunk_bytes)

        def pieces():
            if isinstance(src, (bytes, bytearray)):
                for i in range(0, max(len(src), 1), chunk_bytes):
                    yield bytes(src[i:i + chunk_bytes])
            else:
                while True:
                    b = src.read(chunk_bytes)
                    if not b:
                        break
                    yield b

        def requests():
            first = True
            for b in pieces():
                if first:
                    yield pb.sessions_pb2.ImportSessionRequest(session_id=session_id or "", worker_hint=worker or "",
                                                                data=b)
                    first = False
                else:
                    yield pb.sessions_pb2.ImportSessionRequest(data=b)

        try:
            return self._sessions.ImportSession(requests(), metadata=self._metadata)
        except grpc.RpcError as e:
            raise _error("ImportSession" + (" " + session_id if session_id else ""), e) from None

    def list_models(self):
        """The models the cluster serves now: a list of ModelInfo (name, fingerprint,
        ready_workers, max_generate: the largest max_tokens a Generate may ask, 0 if unknown).
        Any valid key may ask."""
        return list(self._unary("ListModels", self._sessions.ListModels, pb.sessions_pb2.ListModelsRequest()).models)

    # -- Cluster --------------------------------------------------------------------------

    def cluster_status(self):
        """(ListWorkersResponse, {"gpu": n, "host": n, "store": n}) over all tenants."""
        w = self._unary("ListWorkers", self._cluster.ListWorkers, pb.cluster_pb2.ListWorkersRequest())
        s = self._unary("ListClusterSessions", self._cluster.ListClusterSessions,
                        pb.cluster_pb2.ListClusterSessionsRequest(page_size=1))
        return w, {"gpu": s.sessions_gpu, "host": s.sessions_host, "store": s.sessions_store}

    def drain(self, worker_id, wait=False, timeout=600.0, progress=None):
        """Drain a worker (hand its sessions to other groups, place none on it); returns the
        DrainWorkerResponse. wait: return only once the worker is drained, polling DrainWorker
        every 0.25 s (each poll also re-marks it draining) for at most `timeout` seconds, as
        `hyla drain --wait` does. When they pass, raises HylaError DEADLINE_EXCEEDED naming the
        sessions still on the worker and its last handover error; the worker stays draining
        (call again to keep waiting). Raises HylaError FAILED_PRECONDITION when the worker is
        dead or not draining (e.g. it stopped sending heartbeats before it was seen drained).
        progress(left, moved, elapsed_s, last_error) is called about every 5 s while waiting."""
        name = "DrainWorker " + worker_id
        req = pb.cluster_pb2.DrainWorkerRequest(worker_id=worker_id, wait=False)
        d = self._unary(name, self._cluster.DrainWorker, req)
        common = pb.common_pb2
        if not wait or d.worker.state == common.WORKER_DRAINED:
            return d
        if d.worker.state != common.WORKER_DRAINING:
            raise HylaError(name, grpc.StatusCode.FAILED_PRECONDITION,
                            "%s is %s, it cannot be drained (%d session(s) on its group)" % (
                                worker_id, common.WorkerState.Name(d.worker.state), d.sessions_remaining))
        t0 = last = time.monotonic()
        left = d.sessions_remaining
        start = left + d.sessions_moved
        handover_err, poll_err = d.last_error, ""
        while True:
            now = time.monotonic()
            if now - t0 >= timeout:
                msg = "%s is not drained after %g s: %d session(s) still on it, %d handed over; it stays draining" % (
                    worker_id, timeout, left, max(start - left, 0))
                msg += ("; last handover error: " + handover_err) if handover_err else \
                    "; no handover error reported (a session that is appending or generating is handed over when that call ends)"
                if poll_err:
                    msg += "; the last poll failed: " + poll_err
                raise HylaError(name, grpc.StatusCode.DEADLINE_EXCEEDED, msg)
            if progress is not None and now - last >= 5.0:
                progress(left, max(start - left, 0), now - t0, handover_err)
                last = now
            time.sleep(min(0.25, max(0.0, timeout - (now - t0))))
            try:
                d = self._unary(name, self._cluster.DrainWorker, req, timeout=10.0)
            except HylaError as e:
                if e.code_name in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):  # the coordinator may come back
                    poll_err = str(e)
                    continue
                raise
            poll_err = ""
            left = d.sessions_remaining
            start = max(start, left)
            if d.last_error:
                handover_err = d.last_error
            if d.worker.state == common.WORKER_DRAINED:
                d.sessions_moved = max(start - left, 0)
                return d
            if d.worker.state != common.WORKER_DRAINING:
                what = ("%s is dead: it stopped sending heartbeats before it was seen drained; the session(s) it had "
                        "not handed over continue from their last durable snapshot" % worker_id
                        if d.worker.state == common.WORKER_DEAD else
                        "%s is %s, no longer draining" % (worker_id, common.WorkerState.Name(d.worker.state)))
                if handover_err:
                    what += "; last handover error: " + handover_err
                raise HylaError(name, grpc.StatusCode.FAILED_PRECONDITION, what)
