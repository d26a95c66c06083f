/* hyla-state — inspect and maintain a statestore directory: list sessions, show a snapshot's
 * parts, verify every checksum, export/import the portable snapshot file (the format of
 * `hyla-run --save-state FILE`), delete sessions, collect garbage. Read-only commands open the
 * store read-only, so they also work beside a running server. Exit 0 on success, 1 on failure
 * (message on stderr), 2 on a usage error. */
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyla_thread.h"
#include "hyla_codec.h"
#include "hyla_log.h"
#include "hyla_store.h"
#include "hyla_util.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: hyla-state --db DIR COMMAND [ARGS] [OPTIONS]\n"
            "commands:\n"
            "  ls                       one line per session: id, head version, versions kept, state bytes,\n"
            "                           position, model fingerprint (tab-separated, id first)\n"
            "  show SESSION             meta and parts (layer, name, kind, dtype, shape, chunks) of a version\n"
            "  snapshots SESSION        one line per kept version: version, position, commit time (UTC),\n"
            "                           state bytes, stored bytes, bytes its put wrote; '*' marks the head\n"
            "  verify [SESSION]         re-read and check every chunk of every version (without SESSION: of all\n"
            "                           sessions, plus heads and reference counts); exit 1 on any problem\n"
            "  export SESSION FILE      write a version to FILE in the portable snapshot format (temp name,\n"
            "                           fsync, rename); every checksum is verified on the way\n"
            "  import FILE [--session ID]  validate FILE and store it as the next version of ID\n"
            "                           (default: FILE's name without its extension)\n"
            "  rm SESSION               delete a session and every version; unshared chunks are freed\n"
            "  gc                       delete unreferenced chunks and compact to give the space back\n"
            "  du                       sessions, versions, chunks, bytes stored and on disk\n"
            "options:\n"
            "  --version N              show/export: version N instead of the head\n"
            "  --zstd-level N           import/export: zstd level (default 1; 0 = uncompressed); a chunk is\n"
            "                           stored compressed only when zstd saves at least 20 %% of it\n"
            "  --chunk-kib N            import/export: chunk size in KiB (default 512)\n"
            "  --bf16                   import/export: store fp32 parts as bf16 (lossy)\n"
            "  --threads N              worker threads (default: all cores)\n"
            "  -h, --help               this text\n");
}

static int fail(const char *what) {
    fprintf(stderr, "hyla-state: %s: %s\n", what, hyla_last_error());
    return 1;
}

static void on_problem(void *ctx, const char *msg) {
    (void)ctx;
    fprintf(stderr, "PROBLEM %s\n", msg);
}

static void shape_str(char *b, size_t n, const hyla_state_part *p) {
    size_t o = 0;
    b[0] = 0;
    for (uint32_t d = 0; d < p->ndim && o < n; d++)
        o += (size_t)snprintf(b + o, n - o, "%s%" PRIu64, d ? "x" : "", p->shape[d]);
}

static int cmd_show(hyla_store *st, const char *sid, uint64_t version) {
    hyla_manifest *m = NULL;
    uint64_t ver = 0;
    if (hyla_store_get_manifest(st, sid, version, &m, &ver) != HYLA_OK) return fail("show");
    hyla_store_session_info info;
    if (hyla_store_info(st, sid, &info) != HYLA_OK) {
        hyla_manifest_destroy(m);
        return fail("show");
    }
    uint64_t *vers = NULL;
    size_t nv = 0;
    if (hyla_store_versions(st, sid, &vers, &nv) != HYLA_OK) {
        hyla_manifest_destroy(m);
        return fail("show");
    }
    printf("session %s\nversion %" PRIu64 "%s\nversions", sid, ver, ver == info.head_version ? " (head)" : "");
    for (size_t i = 0; i < nv; i++) printf(" %" PRIu64, vers[i]);
    free(vers);
    const hyla_snapshot *s = &m->meta;
    printf("\nformat_version %u\nmodel_fingerprint %016" PRIx64 "\nposition %" PRIu64 "\nn_generated %" PRIu64
           "\npending_token %d\nsampler temperature=%g top_k=%d top_p=%g seed=%" PRIu64
           "\nlayers %u\nparts %u\nstate_bytes %" PRIu64 "\nchunks %zu\nchecksum %016" PRIx64 "\n",
           s->format_version, s->model_fingerprint, s->position, s->n_generated, s->pending_token,
           (double)s->sampler.temperature, s->sampler.top_k, (double)s->sampler.top_p, s->sampler.seed, s->n_layers,
           m->n_parts, m->raw_bytes, m->n_chunks, m->checksum);
    printf("%-5s %-15s %-9s %-5s %-6s %-20s %5s %12s %6s\n", "layer", "part", "kind", "dtype", "stored", "shape", "page",
           "bytes", "chunks");
    for (uint32_t i = 0; i < m->n_parts; i++) {
        const hyla_manifest_part *mp = &m->parts[i];
        char sh[128];
        shape_str(sh, sizeof sh, &mp->desc);
        printf("%-5u %-15s %-9s %-5s %-6s %-20s %5u %12" PRIu64 " %6u\n", mp->desc.layer, mp->desc.name,
               hyla_part_kind_name((hyla_part_kind)mp->desc.kind), hyla_dtype_name((hyla_dtype)mp->desc.dtype),
               hyla_dtype_name((hyla_dtype)mp->stored_dtype), sh, mp->desc.page_tokens, mp->desc.nbytes, mp->n_chunks);
    }
    hyla_manifest_destroy(m);
    return 0;
}

/* The whole number text of option name in [lo, hi]; 0 after saying why on stderr. */
static int num_arg(const char *name, const char *text, long long lo, long long hi, long long *out) {
    if (!hyla_parse_int(text, lo, hi, out)) {
        fprintf(stderr, "hyla-state: %s must be a whole number from %lld to %lld, got '%s'\n", name, lo, hi, text);
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    hyla_malloc_tune(); /* before any thread: chunk reads and writes on every core */
    const char *db = NULL, *sid_opt = NULL;
    const char *pos[4] = {0};
    int npos = 0;
    uint64_t version = 0;
    hyla_codec_params cp = hyla_codec_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--db") && has) {
            db = argv[++i];
        } else if (!strcmp(a, "--session") && has) {
            sid_opt = argv[++i];
        } else if ((!strcmp(a, "--version") || !strcmp(a, "--zstd-level") || !strcmp(a, "--chunk-kib") ||
                    !strcmp(a, "--threads")) &&
                   has) {
            long long v;
            int ok = !strcmp(a, "--version")      ? num_arg(a, argv[i + 1], 1, INT64_MAX, &v)
                     : !strcmp(a, "--zstd-level") ? num_arg(a, argv[i + 1], -131072, 22, &v)
                     : !strcmp(a, "--chunk-kib")  ? num_arg(a, argv[i + 1], 4, 256 * 1024, &v)
                                                  : num_arg(a, argv[i + 1], 0, 1024, &v);
            if (!ok) return 2;
            i++;
            if (!strcmp(a, "--version")) version = (uint64_t)v;
            else if (!strcmp(a, "--zstd-level")) cp.zstd_level = (int)v;
            else if (!strcmp(a, "--chunk-kib")) cp.chunk_bytes = (uint32_t)v * 1024u;
            else cp.threads = (int)v;
        } else if (!strcmp(a, "--bf16")) {
            cp.f32_as_bf16 = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "hyla-state: unknown option or missing value: %s\n", a);
            usage(stderr);
            return 2;
        } else if (npos < 4) {
            pos[npos++] = a;
        } else {
            fprintf(stderr, "hyla-state: too many arguments\n");
            return 2;
        }
    }
    if (!db || npos == 0) {
        fprintf(stderr, "hyla-state: %s\n", !db ? "--db DIR is required" : "no command given");
        usage(stderr);
        return 2;
    }
    const char *cmd = pos[0];
    struct {
        const char *name;
        int min, max, writes;
    } cmds[] = {{"ls", 0, 0, 0},     {"show", 1, 1, 0}, {"verify", 0, 1, 0}, {"export", 2, 2, 0},
                {"import", 1, 1, 1}, {"rm", 1, 1, 1},   {"gc", 0, 0, 1},     {"du", 0, 0, 0},
                {"snapshots", 1, 1, 0}};
    int ci = -1;
    for (int i = 0; i < (int)(sizeof cmds / sizeof cmds[0]); i++)
        if (!strcmp(cmd, cmds[i].name)) ci = i;
    if (ci < 0) {
        fprintf(stderr, "hyla-state: unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    if (npos - 1 < cmds[ci].min || npos - 1 > cmds[ci].max) {
        fprintf(stderr, "hyla-state: %s takes %d to %d argument(s)\n", cmd, cmds[ci].min, cmds[ci].max);
        usage(stderr);
        return 2;
    }
    hyla_log_set_level(HYLA_LOG_WARN);
    hyla_store_params sp = hyla_store_default_params();
    sp.codec = cp;
    sp.read_only = !cmds[ci].writes;
    sp.create_if_missing = !strcmp(cmd, "import");
    hyla_store *st = NULL;
    if (hyla_store_open(db, &sp, &st) != HYLA_OK) return fail("open");
    int rc = 0;
    if (!strcmp(cmd, "ls")) {
        hyla_store_session_info *l = NULL;
        size_t n = 0;
        if (hyla_store_list(st, &l, &n) != HYLA_OK) rc = fail("ls");
        for (size_t i = 0; rc == 0 && i < n; i++)
            printf("%s\thead=%" PRIu64 "\tversions=%u\tbytes=%" PRIu64 "\tposition=%" PRIu64 "\tmodel=%016" PRIx64 "\n",
                   l[i].id, l[i].head_version, l[i].n_versions, l[i].raw_bytes, l[i].position, l[i].model_fingerprint);
        free(l);
    } else if (!strcmp(cmd, "show")) {
        rc = cmd_show(st, pos[1], version);
    } else if (!strcmp(cmd, "verify")) {
        uint64_t problems = 0;
        hyla_status s = hyla_store_verify(st, npos > 1 ? pos[1] : NULL, on_problem, NULL, &problems);
        if (s != HYLA_OK) rc = fail("verify");
        else {
            hyla_store_usage_info u;
            if (npos > 1) printf("ok: session %s verified\n", pos[1]);
            else if (hyla_store_usage(st, &u) == HYLA_OK)
                printf("ok: %" PRIu64 " sessions, %" PRIu64 " versions, %" PRIu64 " chunks verified\n", u.sessions,
                       u.versions, u.chunks);
        }
    } else if (!strcmp(cmd, "export")) {
        hyla_snapshot *s = NULL;
        uint64_t ver = 0;
        if (hyla_store_get(st, pos[1], version, 0, &s, &ver) != HYLA_OK) rc = fail("export");
        else if (hyla_snapshot_save_file(pos[2], s, &cp) != HYLA_OK) rc = fail("export");
        else printf("exported session %s version %" PRIu64 " (%" PRIu64 " bytes of state) to %s\n", pos[1], ver,
                    hyla_snapshot_bytes(s), pos[2]);
        hyla_snapshot_destroy(s);
    } else if (!strcmp(cmd, "import")) {
        char idbuf[HYLA_SESSION_ID_MAX + 1];
        const char *sid = sid_opt;
        if (!sid) {
            char tmp[4096];
            snprintf(tmp, sizeof tmp, "%s", pos[1]);
            snprintf(idbuf, sizeof idbuf, "%s", basename(tmp));
            char *dot = strrchr(idbuf, '.');
            if (dot && dot != idbuf) *dot = 0;
            sid = idbuf;
        }
        hyla_snapshot *s = NULL;
        uint64_t ver = 0;
        if (hyla_snapshot_load_file(pos[1], &s) != HYLA_OK) rc = fail("import: refusing the file");
        else if (hyla_store_put(st, sid, s, &ver, NULL) != HYLA_OK) rc = fail("import");
        else printf("imported %s as session %s version %" PRIu64 "\n", pos[1], sid, ver);
        hyla_snapshot_destroy(s);
    } else if (!strcmp(cmd, "rm")) {
        if (hyla_store_delete(st, pos[1]) != HYLA_OK) rc = fail("rm");
        else printf("removed session %s\n", pos[1]);
    } else if (!strcmp(cmd, "gc")) {
        hyla_store_gc_stats g;
        if (hyla_store_gc(st, &g) != HYLA_OK) rc = fail("gc");
        else printf("gc: deleted %" PRIu64 " unreferenced chunks (%" PRIu64 " bytes)\n", g.chunks_deleted, g.bytes_deleted);
    } else if (!strcmp(cmd, "snapshots")) {
        hyla_store_snapshot_info *l = NULL;
        size_t n = 0;
        if (hyla_store_snapshots(st, pos[1], &l, &n) != HYLA_OK) rc = fail("snapshots");
        for (size_t i = 0; rc == 0 && i < n; i++) {
            char when[40] = "unknown";
            time_t secs = (time_t)(l[i].time_us / 1000000);
            struct tm tmv;
            if (l[i].time_us && gmtime_r(&secs, &tmv)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tmv);
            printf("%" PRIu64 "%s\tposition=%" PRIu64 "\ttime=%s\tbytes=%" PRIu64 "\tstored=%" PRIu64 "\twritten=%" PRIu64 "\n",
                   l[i].version, l[i].is_head ? "*" : "", l[i].position, when, l[i].raw_bytes, l[i].stored_bytes,
                   l[i].written_bytes);
        }
        free(l);
    } else if (!strcmp(cmd, "du")) {
        hyla_store_usage_info u;
        if (hyla_store_usage(st, &u) != HYLA_OK) rc = fail("du");
        else printf("sessions %" PRIu64 "\nversions %" PRIu64 "\nchunks %" PRIu64 "\nchunk_raw_bytes %" PRIu64
                    "\nchunk_bytes %" PRIu64 "\nreferenced_raw_bytes %" PRIu64 "\ndisk_bytes %" PRIu64
                    "\ndisk_free_bytes %" PRIu64 "\nreserve_bytes %" PRIu64 "\nfull %d\n",
                    u.sessions, u.versions, u.chunks, u.chunk_raw_bytes, u.chunk_bytes, u.referenced_raw_bytes,
                    u.disk_bytes, u.disk_free_bytes, u.reserve_bytes, u.full);
    }
    hyla_store_close(st);
    return rc;
}
