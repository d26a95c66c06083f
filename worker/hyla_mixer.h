/* hyla_mixer.h — the mixer interface: what a token-mixer kind (gla, gdn, sse, attn, ...) is to
 * the rest of the runtime.
 *
 * A layer is pre-RMSNorm -> token mixer -> residual -> pre-RMSNorm -> SwiGLU MLP -> residual
 * (docs/MODELS.md §3). Everything specific to a mixer kind lives in one module under
 * worker/mixers/ that fills one `hyla_mixer` table: its config keys, its tensors, its state
 * parts, its scratch, its forward (prefill piece and decode batch, through the ops table) and
 * what hyla-mkmodel writes for it. The modules are registered in one list
 * (worker/mixers/hyla_mixers.c); config loading, weight loading, sessions, snapshots and
 * hyla-mkmodel iterate over layers and call the table — nothing outside worker/mixers/ knows a
 * mixer kind by name. docs/ARCHITECTURE.md "Adding a mixer" lists the steps.
 *
 * Data flows one way: config (hyla_model_config, per-layer mixer config objects) -> model
 * (immutable weights) -> runtime (scratch, snapshot buffers) -> session (state). A mixer's
 * forward reads its config and weights, writes only its scratch, its output and the state of
 * the sessions it is given.
 *
 * Threading: the tables are constant; forward runs on the thread that drives the backend. */
#ifndef HYLA_MIXER_H
#define HYLA_MIXER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "hyla_model.h"
#include "hyla_ops.h"
#include "hyla_snapshot.h"

#define HYLA_MIXER_MAX_PARTS 8    /* state parts of one layer */
#define HYLA_MIXER_MAX_TENSORS 48 /* tensors of one layer's mixer */
#define HYLA_MIXER_HOST_PTRS 4    /* host pointer arrays of R entries a forward may use (gathers) */
#define HYLA_SCRATCH_ALIGN 256    /* every carved scratch buffer starts at this alignment */

/* ------------------------------------------------------------------------------------------ */
/* Config: a reader over config.json that keeps the first error, naming the file and the key. */

typedef struct hyla_cfg {
    const char *path;   /* config.json's path, for messages */
    const char *where;  /* "" for the root object, or the spec being read: "attn", "attn[1]" */
    hyla_status st;     /* first error (HYLA_OK while none) */
} hyla_cfg;

/* Parse config.json at path (jansson; caller json_decrefs). Non-finite floats are read as null
 * (which keys document as "no limit"), in both forms Python writes them: the bare tokens
 * Infinity, -Infinity and NaN of Python's json module, and transformers 5's objects
 * {"__float__": "Infinity"} (Mamba2's time_step_limit is [0.0, inf]). NULL on failure with err
 * filled. */
json_t *hyla_cfg_load_json(const char *path, json_error_t *err);

/* Typed getters: dflt when the key is absent or null; an error naming the key when present with
 * the wrong type. */
int hyla_cfg_int(hyla_cfg *r, json_t *obj, const char *key, int dflt);
double hyla_cfg_num(hyla_cfg *r, json_t *obj, const char *key, double dflt);
int hyla_cfg_bool(hyla_cfg *r, json_t *obj, const char *key, int dflt);
const char *hyla_cfg_str(hyla_cfg *r, json_t *obj, const char *key, const char *dflt);
/* Whether obj has key with a non-null value. */
int hyla_cfg_has(json_t *obj, const char *key);
/* Error unless v > 0. */
void hyla_cfg_positive(hyla_cfg *r, const char *key, int v);
/* HYLA_ERR_UNSUPPORTED: "key 'K': why" (a value we do not implement). */
void hyla_cfg_refuse(hyla_cfg *r, const char *key, const char *why);
/* Any other error (code, printf-style message after "path: "). Keeps the first one. */
void hyla_cfg_fail(hyla_cfg *r, hyla_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------------------------------------ */
/* Tensor parallelism: how the split dimension of a shard's tensor or state part maps onto the
 * whole one (hyla_model_params tp_size T). The dimension is a run of segments, in the shard's
 * units: a positive length L is split (the whole holds T such runs, rank r's the r-th), a
 * negative one -L is replicated (L entries every rank holds whole); 0 ends the list. An empty
 * list is one split segment (heads in order: the common case). E.g. SSE's a_proj [2H] is {H, H}
 * (each half split on its own), an LTE cache's meta [2 + Hk] is {-2, Hk}. */
#define HYLA_TP_SEGS 6
/* The whole dimension's length for a shard length n. */
int64_t hyla_tp_whole_len(const int *seg, int64_t n, int T);
/* Copy between a whole array and rank r's shard of it: `outer` runs (the dimensions before the
 * split one), each holding the split dimension (shard length n) times `inner` bytes. cut: the
 * shard from the whole; join: the shard into the whole (replicated segments only from rank 0). */
void hyla_tp_cut(const int *seg, size_t outer, int64_t n, size_t inner, int T, int r, const void *whole, void *shard);
void hyla_tp_join(const int *seg, size_t outer, int64_t n, size_t inner, int T, int r, void *whole, const void *shard);

/* Tensors: one declaration per tensor, in the order hyla-mkmodel writes them. Loading and the
 * random-weights generator are both driven by this list, so a name is written once. */

typedef enum {
    HYLA_TENSOR_MATRIX = 0, /* 2-D, becomes a hyla_weight (backend's format) */
    HYLA_TENSOR_VECTOR = 1, /* any dims, becomes fp32 device memory (float *) */
} hyla_tensor_use;

typedef enum {
    HYLA_INIT_MATRIX = 0, /* U(-a, a), a = p0 * sqrt(3 / cols): unit-variance outputs */
    HYLA_INIT_VECTOR,     /* p0 + p1 * U(-1, 1) */
    HYLA_INIT_CONV,       /* short-conv taps: 0.5 * U(-1, 1), +0.5 on the newest tap */
    HYLA_INIT_A_LOG,      /* log(U(1, 16)) */
    HYLA_INIT_DT_BIAS,    /* softplus^-1(dt), dt log-uniform in [0.001, 0.1] */
} hyla_init;

#define HYLA_TENSOR_ALTS 3
typedef struct {
    char name[HYLA_TENSOR_ALTS][128]; /* name[0]: the name we write; name[1..]: other names the same
                                       * tensor has in checkpoints we load ("" = none) */
    int ndim;
    int64_t shape[3];
    hyla_tensor_use use;
    size_t offset; /* where the loaded pointer goes in the mixer's weight struct */
    hyla_init init;
    float p0, p1; /* init parameters (see hyla_init) */
    int tp_seg[HYLA_TP_SEGS]; /* tensor parallelism: the split dimension's layout (see below) */
} hyla_tensor_decl;

/* A list being built by a mixer's tensors(): names are prefix + suffix. */
typedef struct {
    hyla_tensor_decl *d;
    int n;
    char prefix[96]; /* e.g. "model.layers.3.attn." */
} hyla_decls;
/* An empty list for layer `layer`, prefixed as the model's layout names the mixer's tensors. */
hyla_decls hyla_decls_init(hyla_tensor_decl *out, const hyla_model_config *mc, int layer);
/* Append a tensor; returns it (for hyla_decl_alt). */
hyla_tensor_decl *hyla_decl(hyla_decls *ds, const char *suffix, hyla_tensor_use use, size_t offset, int ndim, int64_t d0,
                            int64_t d1, int64_t d2, hyla_init init, float p0, float p1);
/* W [rows][cols], HYLA_INIT_MATRIX with this gain. */
hyla_tensor_decl *hyla_decl_matrix(hyla_decls *ds, const char *suffix, size_t offset, int rows, int cols, float gain);
/* A vector [n] in fp32, HYLA_INIT_VECTOR(base, spread). */
hyla_tensor_decl *hyla_decl_vector(hyla_decls *ds, const char *suffix, size_t offset, int n, float base, float spread);
/* Another name (prefix + suffix) under which checkpoints store the same tensor. */
void hyla_decl_alt(hyla_decls *ds, hyla_tensor_decl *d, const char *suffix);

/* ------------------------------------------------------------------------------------------ */
/* State: each layer's parts, as they appear in snapshots (docs/STATE_FORMAT.md). */

typedef struct {
    char name[16];      /* unique within the layer: "S", "conv_q", "k" */
    hyla_part_kind kind;
    hyla_dtype dtype;
    uint32_t ndim;      /* of shape[] */
    uint64_t shape[4];  /* a fixed part: its shape; a paged part: the shape of one token's row */
    int paged;          /* rows appended per token, in pages of HYLA_KV_PAGE_TOKENS; a snapshot holds
                         * [position][row shape], cut at page boundaries (incremental) */
    int tp_seg[HYLA_TP_SEGS]; /* tensor parallelism: the split dimension's layout (above) */
} hyla_part_spec;

typedef struct {
    void *dev;          /* fixed part: device memory (zero at creation) */
    void **pages;       /* paged part: host array [n_pages] of device pages */
    int n_pages, cap_pages;
} hyla_part_state;

struct hyla_state;
/* One session's state of one layer: its parts, in the order of the mixer's parts(). */
typedef struct {
    hyla_part_state part[HYLA_MIXER_MAX_PARTS];
    struct hyla_state *owner; /* the session's state (page allocation, byte accounting) */
    int layer;
    /* A cache the mixer derives from its parts (NSA: the compressed blocks), never in
     * snapshots: empty at creation, so after an import too. Pages of HYLA_KV_PAGE_TOKENS rows;
     * derived_rows: the rows the mixer has filled (it keeps the count). */
    hyla_part_state derived;
    int64_t derived_rows;
} hyla_layer_state;

/* Make paged part `part` of ls hold at least `tokens` rows (allocates pages). */
hyla_status hyla_layer_state_reserve(hyla_layer_state *ls, int part, int64_t tokens);
/* Make the derived cache of ls hold at least `rows` rows of row_bytes each (allocates pages;
 * row_bytes must be the same at every call for a layer). */
hyla_status hyla_layer_state_reserve_derived(hyla_layer_state *ls, size_t row_bytes, int64_t rows);

/* ------------------------------------------------------------------------------------------ */
/* Forward */

typedef struct {
    const hyla_ops *o;
    void *ctx;
    const hyla_model_config *mc; /* the model's common config (hidden size, norm eps) */
    const void *cfg;             /* this layer's mixer config */
    const void *w;               /* this layer's mixer weights */
    int layer;
    int decode;                  /* 0: a prefill piece of one session; 1: one token per session */
    int R;                       /* rows */
    int cap_rows;                /* rows the scratch was laid out for (>= R): carve with this */
    const int32_t *pos;          /* host [R]: the absolute position of each row */
    hyla_layer_state *const *st; /* host [decode ? R : 1]: the sessions' states of this layer */
    const float *xn;             /* [R][D] the normed input */
    float *out;                  /* [R][D] the mixer's output */
    void *scratch;               /* device memory of scratch_bytes(mc, cfg, cap_rows) bytes, aligned */
    void **host_ptrs;            /* host [HYLA_MIXER_HOST_PTRS][R] pointer arrays for gathers */
    int xn_bf16;                 /* 1: xn holds bf16 rows (prompt rows on a backend with rmsnorm_bf16,
                                  * or decode rows where it says decode_bf16_rows): a mixer hands xn
                                  * only to hyla_mixer_linear(_multi), which tell the backend
                                  * (HYLA_LINEAR_X_BF16); the bits are those of fp32 rows */
    int out_acc;                 /* 1: out is the residual stream and the mixer's output is added onto it
                                  * (prompt rows): the mixer's one write of out, its output projection,
                                  * accumulates (linear's accumulate, HYLA_LINEAR_ACC) instead of
                                  * overwriting: the rounding of residual + output, as the runtime's add */
} hyla_mixer_fwd;

/* host_ptrs array i, filled with part `part` of every row's session (decode). */
void *const *hyla_mixer_gather(const hyla_mixer_fwd *f, int i, int part);

/* Scratch carving: one pass computes sizes (base NULL) or pointers (base = the arena), so a
 * module writes its scratch layout once. Each buffer starts HYLA_SCRATCH_ALIGN-aligned (the CUDA
 * backend picks GEMM algorithms by output alignment; cudaMalloc'd buffers had this alignment). */
typedef struct {
    uintptr_t base, off;
} hyla_carver;
static inline hyla_carver hyla_carver_init(void *base) { return (hyla_carver){(uintptr_t)base, 0}; }
static inline void *hyla_carve(hyla_carver *c, size_t bytes) {
    uintptr_t p = c->base + c->off;
    c->off += (bytes + HYLA_SCRATCH_ALIGN - 1) / HYLA_SCRATCH_ALIGN * HYLA_SCRATCH_ALIGN;
    return (void *)p;
}
static inline float *hyla_carve_f32(hyla_carver *c, size_t n) { return (float *)hyla_carve(c, n * sizeof(float)); }

/* ------------------------------------------------------------------------------------------ */
/* hyla-mkmodel's arguments, as a mixer's mk_config reads them. */

typedef struct {
    int hidden, heads, kv_heads, window, partitions, topk, head_dim;
    int short_conv;      /* -1: the mixer's default */
    const char *variant; /* an arch's variant of the mixer ("gdn" for sse-gdn), or NULL */
    int spec;            /* 1: writing the keys of a hybrid spec object, 0: of the config root */
    /* LTE */
    int sink, budget;    /* -1 / 0: the mixer's default */
    /* NSA */
    int nsa_block, nsa_counts; /* 0: the mixer's default */
    /* DLA */
    int dla_capacity;          /* 0: the mixer's default */
    double dla_threshold;      /* < 0: the mixer's default */
    /* SSE */
    int prefill_window;        /* 0: the mixer's default (the key left out) */
} hyla_mk_args;

/* ------------------------------------------------------------------------------------------ */
/* The table */

typedef struct hyla_mixer {
    const char *name;       /* the layer kind, as docs and messages name it: "gla" */
    const char *model_type; /* config.json model_type of a model whose layers are all this kind (NULL: none) */
    const char *spec_key;   /* config.json key of a hybrid spec that puts this kind at listed layers
                             * (an object or a list of objects with "layers": [...]; NULL: none) */
    const hyla_layout *layout; /* as a base kind: its model family's tensor layout (NULL: FLA's) */
    /* As a base kind: read the family's model-level keys that differ from FLA's (e.g. another
     * name for the norm epsilon), after the common ones (NULL: none). */
    void (*parse_model)(hyla_cfg *r, json_t *root, hyla_model_config *mc);
    size_t cfg_size;        /* bytes of the mixer's config struct */
    size_t w_size;          /* bytes of the mixer's weight struct (pointers filled by the loader) */

    /* Read this kind's keys from obj (the config root, or a spec object) into cfg (zeroed),
     * apply defaults, validate; errors through r, naming the key. mc holds the common keys. */
    void (*parse)(hyla_cfg *r, json_t *obj, const hyla_model_config *mc, void *cfg);
    /* The tensors of layer `layer` (at most HYLA_MIXER_MAX_TENSORS), in mkmodel's order. */
    int (*tensors)(const hyla_model_config *mc, const void *cfg, int layer, hyla_tensor_decl *out);
    /* The state parts of one layer (at most HYLA_MIXER_MAX_PARTS); kv_dtype: the backend's. */
    int (*parts)(const hyla_model_config *mc, const void *cfg, hyla_dtype kv_dtype, hyla_part_spec *out);
    /* Scratch bytes a forward of `rows` rows needs. */
    size_t (*scratch_bytes)(const hyla_model_config *mc, const void *cfg, int rows);
    /* The forward: xn -> out, reading and updating the sessions' states. */
    hyla_status (*forward)(const hyla_mixer_fwd *f);
    /* The alignment, in tokens, of the prefill calls whose bits this config's layers keep: a
     * power of two of at least HYLA_PREFILL_CHUNK (a call that starts at a multiple of it, or
     * does not cross one, gives the same bits however a prompt is cut at its multiples). NULL:
     * HYLA_PREFILL_CHUNK. The model's prefill chunk is the largest over its layers
     * (hyla_model_config.prefill_chunk). */
    int (*prefill_align)(const void *cfg);

    /* Tensor parallelism: divide this config's heads by T in place (a shard's config); NULL
     * when done, else why not, naming the key ("num_heads 6 is not divisible by 4"). The
     * module promises that its shard's tensors and state parts are the whole layer's sliced
     * along one dimension by heads (or channels) in order, so the loader and the snapshot code
     * slice and join them by shape. NULL hook: the kind cannot be split. */
    const char *(*tp_shard)(void *cfg, int T, char *why, size_t why_len);

    /* hyla-mkmodel: write this kind's keys into obj (the config root, or its spec object) for
     * args a; NULL when a fits, else a message saying why not. */
    const char *(*mk_config)(json_t *obj, const hyla_mk_args *a);
} hyla_mixer;

/* The registered mixers (worker/mixers/hyla_mixers.c), NULL-terminated. */
extern const hyla_mixer *const hyla_mixers[];
/* The mixer of that name / model_type / spec key, or NULL. */
const hyla_mixer *hyla_mixer_find(const char *name);

/* HYLA_PROFILE marks inside a forward (hyla_profile.h). */
#define HYLA_MIXER_MARK(f, label)                                                    \
    do {                                                                             \
        if (hyla_prof_on) hyla_prof_mark((f)->o, (f)->ctx, (f)->decode, (label));    \
    } while (0)

/* Linear helpers every mixer uses (worker/mixers/hyla_mixers.c):
 * hyla_mixer_linear: y [R][N] = x [R][K] W^T (+ bias) (+ y): decode rows through ops->linear,
 * prompt rows through ops->linear_multi with HYLA_LINEAR_PREFILL (a row's result still depends
 * only on the row; the CUDA backend then runs cuBLAS at a fixed row count). */
hyla_status hyla_mixer_linear(const hyla_mixer_fwd *f, const float *x, int K, const hyla_weight *W, const float *bias,
                              float *y, int N, int acc);
/* Linears of different inputs (each outs[j].x, [R][K]) and the same K, each adding onto its y
 * where acc or outs[j].acc says: in decode one ops->linear_multi (the bits of separate linears,
 * one launch where the backend can); prompt rows as separate hyla_mixer_linear calls, whose bits
 * they keep. */
hyla_status hyla_mixer_linear_each(const hyla_mixer_fwd *f, int K, int n, const hyla_linear_out *outs, int acc);
/* Projections of the same x [R][K] as one ops->linear_multi (the bits of separate calls, fewer
 * launches on the GPU). */
hyla_status hyla_mixer_linear_multi(const hyla_mixer_fwd *f, const float *x, int K, int n, const hyla_linear_out *outs);
/* The same for prompt rows whose outputs are bf16 [R][N] (HYLA_LINEAR_Y_BF16: each outs[j].y holds
 * bf16 rows; no bias, ldy == N), read by an op that takes them so (the conv's bf16 sources, a bf16
 * gate): only where f->xn_bf16 (a backend with bf16 rows) and not in decode. */
hyla_status hyla_mixer_linear_multi_bf16(const hyla_mixer_fwd *f, const float *x, int K, int n,
                                         const hyla_linear_out *outs);
/* Paged K/V of attention-like mixers (attn, nsa): reserve room for this forward's tokens in the
 * parts part_k and part_v of each session's layer state and describe them, one view per session
 * in decode (f->R), one in prefill. *views: caller frees with free(). */
hyla_status hyla_mixer_kv_views(const hyla_mixer_fwd *f, int part_k, int part_v, hyla_kv_view **views);
/* RoPE of q [R][Hq*hd] and k [R][Hk*hd] in place at the rows' positions: every GQA mixer (attn,
 * lte, nsa) rotates both the same way. */
hyla_status hyla_mixer_rope_qk(const hyla_mixer_fwd *f, float *q, float *k, int Hq, int Hk, int hd, float theta);

/* Scratch of a GQA mixer (attn, lte): q [R][Hq*hd], k and v [R][Hk*hd], o [R][Hq*hd]. */
typedef struct {
    float *q, *k, *v, *o;
} hyla_gqa_scratch;
/* Carve s for R rows (base NULL: sizes only); returns the bytes: one layout for the modules whose
 * scratch is just the projections and the attention output. */
size_t hyla_gqa_layout(int R, int Hq, int Hk, int hd, void *base, hyla_gqa_scratch *s);

/* tp_shard's common step: *v /= T when T divides it (NULL), else why not into why (returned). */
const char *hyla_tp_divide(int *v, const char *key, int T, char *why, size_t why_len);

/* hyla-mkmodel: the KV heads of a GQA mixer (--kv-heads, else half the heads when even) into
 * *kvh; NULL, or why the sizes do not divide: the one rule attn, lte and nsa apply. */
const char *hyla_mk_kv_heads(const hyla_mk_args *a, int *kvh);

/* A module's scratch_bytes from its layout(cfg, rows, base, &scratch) (a carve without a base),
 * so each module writes its scratch layout once. */
#define HYLA_MIXER_SCRATCH_BYTES(scratch_t)                                                   \
    static size_t scratch_bytes(const hyla_model_config *mc, const void *cfg, int rows) {  \
        (void)mc;                                                                          \
        scratch_t s_;                                                                      \
        return layout(cfg, rows, NULL, &s_);                                               \
    }

/* The table entries of a module whose hooks are its static parse, tensors, parts, scratch_bytes
 * and forward and whose structs are cfg_t and w_t: the convention every module follows, written
 * once (mk_config is named by each table: gdn and mamba2 export theirs to dla). */
#define HYLA_MIXER_HOOKS(cfg_t, w_t)                                                            \
    .cfg_size = sizeof(cfg_t), .w_size = sizeof(w_t), .parse = parse, .tensors = tensors, .parts = parts, \
    .scratch_bytes = scratch_bytes, .forward = forward

#endif
