/* hyla_runtime_impl.h — the runtime's private structs and the interface between the runtime
 * (hyla_runtime.c: scratch, snapshot buffers, the layer loop), the session state
 * (hyla_state.c) and sessions (hyla_session.c). Not a public header.
 *
 * Layering: model (immutable) <- runtime <- state <- session. The runtime's forward takes the
 * rows' layer states and hands the sessions to the downstream callback as opaque pointers; it
 * never looks inside a session. */
#ifndef HYLA_RUNTIME_IMPL_H
#define HYLA_RUNTIME_IMPL_H

#include "hyla_model_impl.h"
#include "hyla_runtime.h"

typedef struct hyla_snapbufs hyla_snapbufs;

#define HYLA_STAGEBUF_MAX 4 /* staging buffers a runtime keeps (exports in flight at once) */

struct hyla_runtime {
    const hyla_model *m;
    hyla_backend *be;
    int prefill_piece; /* tokens per prefill forward (hyla_runtime_set_prefill_piece) */
    int token_log;     /* tokens per session token log (hyla_runtime_set_token_log) */
    /* remaining pipeline stages (ds NULL: the model holds the last layer) */
    const hyla_downstream_ops *ds;
    void *ds_ud;
    hyla_downstream_fn sync_fn; /* hyla_runtime_set_downstream: behind the table `sync_ops` */
    void *sync_ud;
    int micro_batches; /* hyla_runtime_set_micro_batches */
    /* The downstream's posted steps (hyla_runtime.c): unanswered messages, and the step whose
     * logits are awaited (at most one: a step that wants logits is finished before the next).
     * Its groups' host logits: where host answers land; at the finish they are uploaded to
     * rt->logits (want_dev) or, when the step went over post_dev, downloaded to them. */
    int in_flight;
    struct {
        int open;     /* a step wanting logits is posted and not finished */
        int dev;      /* it goes over post_dev (decided at group 0) */
        int want_dev; /* its logits are wanted in rt->logits (else in the groups' host buffers) */
        int n_groups;
        struct {
            float *host; /* [n][V] */
            int off, n;
        } g[HYLA_MICRO_BATCH_MAX];
    } step;
    /* Decode lanes (hyla_runtime_post_lane): steps posted without finishing, each at its own
     * rows [off, off + n) of rt->x and rt->logits; post_seq: the lane's post, counted in
     * `posts` (every post ever made; posts - in_flight of them are answered). dev: over
     * post_dev, the logits land in rt->logits (else in rt->hlogits at the same rows). */
    uint64_t posts;
    struct {
        int busy, dev, off, n;
        uint64_t post_seq;
    } lane[HYLA_LANES_MAX];
    int lanes_busy;
    float *hlogits; /* host [hlrows][V]: where host answers land when rt->logits wants them */
    float *hhidden; /* host [hrows][D]: rows crossing the host to a post */
    int hrows, hlrows;
    hyla_allreduce_fn allreduce; /* a tensor-parallel shard's sum over its group (NULL: none) */
    void *allreduce_ud;
    hyla_allreduce_begin_fn allreduce_begin; /* the sum begun beside the stream (NULL: none) */
    hyla_allreduce_join_fn allreduce_join;
    hyla_allreduce_onto_fn allreduce_onto; /* the sum onto x from the group's buffers (NULL: none) */
    float *onto_buf[2];                    /* where the partial of such a sum is written */
    size_t onto_max;                       /* floats a buffer holds */
    int onto_j;                            /* the buffer of the next such sum */
    long wave_pieces; /* prefill pieces run as two halves (run_layers_wave) */
    /* Tensor parallelism (hyla_tp.c): the group this runtime is rank tp_rank of (NULL: none).
     * Sessions are created on rank 0's runtime and hold one session per rank (hyla_session.c). */
    struct hyla_tp_group *tp;
    int tp_rank;
    /* scratch activations for up to `rows` rows (a prefill piece or a decode batch), act_bytes of
     * device memory with the mixers' scratch */
    int rows;
    size_t act_bytes;
    float *x;             /* [rows][D] the residual stream */
    float *xn;            /* [rows][D] the normed input of a mixer or the MLP */
    float *mo;            /* [rows][D] a mixer's or the MLP's output */
    float *mlp_g, *mlp_u; /* [rows][F] the MLP's gate and up projections */
    /* [logit_rows][V]: reserved apart, for the rows that want logits (a decode batch, a prefill
     * piece whose caller asked for its logits), so a prefill piece that wants none holds none:
     * 8192 rows of a 152k vocabulary would be 5 GB */
    int logit_rows;
    float *logits;
    void *mixer_scratch;  /* the largest scratch_bytes of the held layers' mixers for `rows` */
    void **host_ptrs;     /* host [HYLA_MIXER_HOST_PTRS][rows] */
    hyla_snapbufs *snapbufs; /* NULL until the first export */
    /* device staging buffers of exports (hyla_stagebuf_get): cached, so an export allocates
     * nothing (and zero-fills nothing) in steady state. Driving thread only. */
    struct {
        void *dev;
        size_t bytes;
        int busy;
    } stagebufs[HYLA_STAGEBUF_MAX];
};

/* One session's state: the parts of every held layer (hyla_state.c). */
typedef struct hyla_state {
    const hyla_model *m;
    hyla_layer_state *ls; /* [num_layers]; entries outside the held range are empty */
    uint64_t bytes;       /* device bytes held */
} hyla_state;

/* A new state: every fixed part allocated (zero), paged parts empty. Caller frees with
 * hyla_state_free. */
hyla_status hyla_state_create(const hyla_model *m, hyla_state **out);
void hyla_state_free(hyla_state *st); /* accepts NULL */

/* The rows of one forward pass. */
typedef struct {
    int decode;                      /* 0: prefill piece of ss[0]; 1: one token per session */
    int R;                           /* rows */
    const int32_t *pos;              /* host [R]: the absolute position of each row */
    hyla_state *const *st;           /* host [decode ? R : 1] */
    hyla_session *const *ss;         /* host [decode ? R : 1]: passed to the downstream callback */
    /* a later stage's micro-batch (zero: a whole step): the rows sit at row_off of rt->x and
     * their logits go to row_off of rt->logits; the downstream gets the same numbering, and
     * the last group of a step finishes it */
    int group, groups, row_off, total_rows;
    float *logits_host; /* a later stage's host logits [R][V] of this group (NULL: rt->logits) */
    int lane;           /* a first stage's decode step posted as lane `lane - 1` (0: none) */
} hyla_fwd;

/* The group's size and rank r's runtime (hyla_tp.c), and hyla_tp_run (hyla_tp.h) for the
 * session code that drives every rank. */
int hyla_tp_group_size(const struct hyla_tp_group *g);
hyla_runtime *hyla_tp_group_runtime(const struct hyla_tp_group *g, int r);

/* Make the scratch hold `rows` rows of activations and `logit_rows` rows of logits (0: none
 * needed; reallocates what grows, doubling). Every forward that writes logits to rt->logits
 * (rows [row_off, row_off + R)) is preceded by a reservation of that many logit rows. */
hyla_status hyla_runtime_reserve(hyla_runtime *rt, int rows, int logit_rows);
/* Rows of rt->x (already filled) through the held layers; final norm + head into rt->logits
 * when want_logits and this is the last stage; else posted to the downstream. The first stage's
 * decode (f->groups 0) runs micro-batches and finishes; its prefill pieces are posted without
 * waiting unless want_logits (the caller finishes: hyla_runtime_finish); a later stage's group
 * (f->groups >= 1) finishes at the step's last group. */
hyla_status hyla_runtime_forward(hyla_runtime *rt, const hyla_fwd *f, int want_logits);

/* Wait for decode lane `lane`'s posted step (hyla_fwd.lane) and put its logits in rt->logits at
 * its rows: *off, *n. *aside: they are beside the compute stream, to sample through
 * rt->ds->sample_aside. */
hyla_status hyla_runtime_collect_lane(hyla_runtime *rt, int lane, int *off, int *n, int *aside);

/* Snapshot buffers: an arena of at least `need` bytes (64-byte aligned) from the runtime's cache
 * of pinned host buffers; give it back through hyla_snapbuf_release(hyla_runtime_snapbufs(rt),
 * base) (any thread). Driving thread. */
hyla_status hyla_snapbuf_get(hyla_runtime *rt, size_t need, uint8_t **base);
void hyla_snapbuf_release(void *snapbufs, void *base);
hyla_snapbufs *hyla_runtime_snapbufs(hyla_runtime *rt);
/* An export's arena of at least `need` bytes (64-byte aligned): a cached pinned buffer that fits,
 * else a new pinned one up to 256 MiB (HYLA_EXPORT_PIN_MAX_MB), else pageable memory, which the
 * backend's capture fills from a thread of its own instead of page-locking it. Give it back
 * with *release(*release_ctx, base) (any thread). Driving thread. */
hyla_status hyla_exportbuf_get(hyla_runtime *rt, size_t need, uint8_t **base, hyla_snapshot_release_fn *release,
                               void **release_ctx);
/* An empty arena snapshot of `bytes` bytes on such a buffer (its parts carved, not zero-filled;
 * destroying it gives the buffer back). Driving thread. */
hyla_status hyla_export_snapshot_new(hyla_runtime *rt, size_t bytes, hyla_snapshot **out);

/* Export staging: `need` bytes of device memory (not zero-filled) from the runtime's cache of
 * up to HYLA_STAGEBUF_MAX buffers (the smallest idle one that fits; a new one, or a larger one
 * in place of the smallest idle, when none fits); give it back with hyla_stagebuf_release once
 * nothing queued reads it. More than HYLA_STAGEBUF_MAX at once: allocated and freed each time.
 * Driving thread. */
hyla_status hyla_stagebuf_get(hyla_runtime *rt, size_t need, void **dev);
void hyla_stagebuf_release(hyla_runtime *rt, void *dev);

#endif
