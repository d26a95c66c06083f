/* hyla_model.c — loads a model directory onto a backend (docs/MODELS.md §1–§5).
 * The tensors every layer has (norms, MLP), the embedding and the head are named here; each
 * layer's mixer declares its own (hyla_mixer.h: tensors()), looked up by the first of their
 * names the checkpoint has and shape-checked before upload; errors name the file, the tensor
 * and the expected shape. Threading: loading is single-threaded; the loaded model is read-only. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "hyla_log.h"
#include "hyla_model_impl.h"
#include "hyla_safetensors.h"

hyla_model_params hyla_model_default_params(void) {
    hyla_model_params p;
    memset(&p, 0, sizeof p);
    p.layer_begin = 0;
    p.layer_end = -1;
    return p;
}

typedef struct {
    hyla_model *m;
    hyla_st *st;
    char ctx[96]; /* "layer 3 (gla)": what needs the tensor */
} loader;

static hyla_status track_alloc(hyla_model *m, void *p) {
    if (m->n_allocs == m->cap_allocs) {
        int cap = m->cap_allocs ? m->cap_allocs * 2 : 64;
        void **n = realloc(m->allocs, (size_t)cap * sizeof *n);
        if (!n) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
        m->allocs = n;
        m->cap_allocs = cap;
    }
    m->allocs[m->n_allocs++] = p;
    return HYLA_OK;
}

static hyla_status track_weight(hyla_model *m, hyla_weight *w) {
    if (m->n_weights == m->cap_weights) {
        int cap = m->cap_weights ? m->cap_weights * 2 : 64;
        hyla_weight **n = realloc(m->weights, (size_t)cap * sizeof *n);
        if (!n) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
        m->weights = n;
        m->cap_weights = cap;
    }
    m->weights[m->n_weights++] = w;
    return HYLA_OK;
}

static void shape_str(char *buf, size_t n, const int64_t *shape, int ndim) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++) o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* Find `name` and check its shape. In a tensor-parallel shard (tp_size T > 1) the checkpoint may
 * hold the whole tensor of a split one: the same shape but T times larger in exactly one
 * dimension, which *axis receives (-1: the shapes are equal, the tensor is replicated). */
static hyla_status find_checked(loader *L, const char *name, int ndim, const int64_t *shape, const int *seg,
                                const hyla_st_tensor **out, int *axis) {
    const hyla_st_tensor *t = hyla_st_find(L->st, name);
    if (!t)
        return hyla_fail(HYLA_ERR_NOT_FOUND, "%s: tensor '%s' is missing (needed by %s)", L->m->dir, name, L->ctx);
    int T = L->m->tp_size, ok = t->ndim == ndim, split = -1;
    for (int i = 0; ok && i < ndim; i++) {
        if (t->shape[i] == shape[i]) continue;
        if (T > 1 && split < 0 && t->shape[i] == hyla_tp_whole_len(seg, shape[i], T)) split = i;
        else ok = 0;
    }
    if (!ok) {
        char got[96], want[96], tp[64] = "";
        shape_str(got, sizeof got, t->shape, t->ndim);
        shape_str(want, sizeof want, shape, ndim);
        if (T > 1)
            snprintf(tp, sizeof tp, ", or the whole of that shard (%d of %d) in one dimension", L->m->tp_rank, T);
        return hyla_fail(HYLA_ERR_MISMATCH, "%s: tensor '%s' has shape %s, expected %s%s (%s)", t->file, name, got, want,
                         tp, L->ctx);
    }
    if (t->dtype != HYLA_DT_F32 && t->dtype != HYLA_DT_F16 && t->dtype != HYLA_DT_BF16)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; weights must be F32, F16 or BF16", t->file,
                         name, hyla_dtype_name(t->dtype));
    *out = t;
    *axis = split;
    return HYLA_OK;
}

/* The data of this shard's slice of t along `axis` (shape: the slice's; seg: the split
 * dimension's layout, hyla_mixer.h): t's own bytes when the tensor is replicated, else a copy in
 * *owned (the caller frees it). */
static const void *shard_data(const loader *L, const hyla_st_tensor *t, int ndim, const int64_t *shape, int axis,
                              const int *seg, void **owned) {
    *owned = NULL;
    if (axis < 0) return t->data;
    size_t outer = 1, inner = hyla_dtype_size(t->dtype), n = inner;
    for (int i = 0; i < axis; i++) outer *= (size_t)shape[i];
    for (int i = axis + 1; i < ndim; i++) inner *= (size_t)shape[i];
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    uint8_t *dst = malloc(n);
    if (!dst) return NULL;
    hyla_tp_cut(seg, outer, shape[axis], inner, L->m->tp_size, L->m->tp_rank, t->data, dst);
    *owned = dst;
    return dst;
}

static hyla_status load_matrix(loader *L, const char *name, int rows, int cols, const int *seg, hyla_weight **out) {
    const hyla_st_tensor *t;
    int64_t shape[2] = {rows, cols};
    int axis;
    HYLA_TRY(find_checked(L, name, 2, shape, seg, &t, &axis));
    void *owned;
    const void *data = shard_data(L, t, 2, shape, axis, seg, &owned);
    if (!data) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    hyla_backend *be = L->m->be;
    hyla_status s = be->ops->weight_create(be->ctx, data, t->dtype, rows, cols, out);
    free(owned);
    if (s != HYLA_OK) return hyla_fail_wrap(s, "%s: uploading tensor '%s'", t->file, name);
    L->m->param_bytes += (uint64_t)rows * cols * hyla_dtype_size(t->dtype);
    return track_weight(L->m, *out);
}

/* A vector (or a tensor of `ndim` dims with `n` elements in all) converted to fp32 on the device. */
static hyla_status load_vector_nd(loader *L, const char *name, int ndim, const int64_t *shape, const int *seg,
                                  float **out) {
    const hyla_st_tensor *t;
    int axis;
    HYLA_TRY(find_checked(L, name, ndim, shape, seg, &t, &axis));
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    void *owned;
    const void *data = shard_data(L, t, ndim, shape, axis, seg, &owned);
    float *host = data ? malloc(n * sizeof(float)) : NULL;
    if (!host) {
        free(owned);
        return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    }
    hyla_to_f32(host, data, t->dtype, n);
    free(owned);
    hyla_backend *be = L->m->be;
    void *dev = NULL;
    hyla_status s = be->ops->alloc(be->ctx, n * sizeof(float), &dev);
    if (s == HYLA_OK) s = be->ops->upload(be->ctx, dev, host, n * sizeof(float));
    free(host);
    if (s != HYLA_OK) {
        be->ops->free(be->ctx, dev);
        return hyla_fail_wrap(s, "%s: uploading tensor '%s'", t->file, name);
    }
    L->m->param_bytes += n * hyla_dtype_size(t->dtype);
    *out = dev;
    return track_alloc(L->m, dev);
}

static hyla_status load_vector(loader *L, const char *name, int n, float **out) {
    int64_t shape[1] = {n};
    return load_vector_nd(L, name, 1, shape, NULL, out);
}

/* the layout's names are formats taking the layer index */
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
#define P(buf, ...) (snprintf(buf, sizeof buf, __VA_ARGS__), buf)

static hyla_status track_host(hyla_model *m, void *p) {
    if (m->n_host == m->cap_host) {
        int cap = m->cap_host ? m->cap_host * 2 : 64;
        void **n = realloc(m->host, (size_t)cap * sizeof *n);
        if (!n) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
        m->host = n;
        m->cap_host = cap;
    }
    m->host[m->n_host++] = p;
    return HYLA_OK;
}

/* One declared tensor: the first of its names the checkpoint has (a missing tensor is named by
 * its first name), into the weight struct at d->offset. */
static hyla_status load_decl(loader *L, const hyla_tensor_decl *d, void *wstruct) {
    const char *name = d->name[0];
    for (int a = 1; a < HYLA_TENSOR_ALTS && d->name[a][0]; a++)
        if (!hyla_st_find(L->st, name) && hyla_st_find(L->st, d->name[a])) name = d->name[a];
    void *slot = (uint8_t *)wstruct + d->offset;
    if (d->use == HYLA_TENSOR_MATRIX)
        return load_matrix(L, name, (int)d->shape[0], (int)d->shape[1], d->tp_seg, (hyla_weight **)slot);
    return load_vector_nd(L, name, d->ndim, d->shape, d->tp_seg, (float **)slot);
}

static hyla_status load_layer(loader *L, int i) {
    hyla_model *m = L->m;
    const hyla_model_config *c = &m->cfg;
    hyla_layer *ly = &m->layers[i];
    char n[256];
    int D = c->hidden_size, F = c->intermediate_size;
    ly->mixer = c->mixer[i];
    ly->cfg = c->mixer_cfg[i];
    snprintf(L->ctx, sizeof L->ctx, "layer %d (%s)", i, ly->mixer->name);
    const hyla_layout *lay = c->layout;
    HYLA_TRY(load_vector(L, P(n, lay->layer_norm, i), D, &ly->attn_norm));
    if (lay->mlp_norm) { /* else the family's layers are mixer-only */
        char pre[160];
        P(pre, lay->mlp, i);
        HYLA_TRY(load_vector(L, P(n, lay->mlp_norm, i), D, &ly->mlp_norm));
        HYLA_TRY(load_matrix(L, P(n, "%sgate_proj.weight", pre), F, D, NULL, &ly->mlp_gate));
        HYLA_TRY(load_matrix(L, P(n, "%sup_proj.weight", pre), F, D, NULL, &ly->mlp_up));
        HYLA_TRY(load_matrix(L, P(n, "%sdown_proj.weight", pre), D, F, NULL, &ly->mlp_down));
    }
    if (!(ly->w = calloc(1, ly->mixer->w_size ? ly->mixer->w_size : 1))) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    HYLA_TRY(track_host(m, ly->w));
    hyla_tensor_decl *decls = malloc(HYLA_MIXER_MAX_TENSORS * sizeof *decls);
    if (!decls) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    int nd = ly->mixer->tensors(c, ly->cfg, i, decls);
    hyla_status st = HYLA_OK;
    for (int k = 0; st == HYLA_OK && k < nd; k++) st = load_decl(L, &decls[k], ly->w);
    free(decls);
    HYLA_TRY(st);
    ly->n_parts = ly->mixer->parts(c, ly->cfg, m->be->ops->kv_dtype, ly->parts);
    HYLA_ASSERT(ly->n_parts >= 0 && ly->n_parts <= HYLA_MIXER_MAX_PARTS);
    if (m->tp_size == 1) memcpy(ly->full_parts, ly->parts, sizeof ly->parts);
    return HYLA_OK;
}

/* Make m's config that of shard tp_rank of tp_size: each mixer config (shared by the layers of
 * a spec: divided once) and the MLP width divided; the whole layers' state parts kept first. */
static hyla_status shard_config(hyla_model *m) {
    hyla_model_config *c = &m->cfg;
    int T = m->tp_size;
    for (int i = m->layer_begin; i < m->layer_end; i++)
        m->layers[i].n_parts = c->mixer[i]->parts(c, c->mixer_cfg[i], m->be->ops->kv_dtype, m->layers[i].full_parts);
    for (int i = 0; i < c->num_layers; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = c->mixer_cfg[j] == c->mixer_cfg[i];
        if (seen) continue;
        const hyla_mixer *mx = c->mixer[i];
        char why[160] = "";
        if (!mx->tp_shard)
            return hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: layer %d (%s) cannot be split for tensor parallelism yet", m->dir,
                             i, mx->name);
        if (mx->tp_shard((void *)c->mixer_cfg[i], T, why, sizeof why))
            return hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: layer %d (%s): %s (tensor-parallel size %d)", m->dir, i,
                             mx->name, why, T);
    }
    if (c->intermediate_size % T)
        return hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: intermediate_size %d is not divisible by the tensor-parallel size %d",
                         m->dir, c->intermediate_size, T);
    c->intermediate_size /= T;
    return HYLA_OK;
}

/* Fingerprint: xxh64 over the canonical config JSON (sorted keys, compact) and every tensor's
 * name, dtype and shape in name order. */
static hyla_status compute_fingerprint(hyla_model *m, hyla_st *st) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", m->dir);
    json_error_t jerr;
    json_t *root = hyla_cfg_load_json(path, &jerr);
    if (!root) return hyla_fail(HYLA_ERR_FORMAT, "%s: %s", path, jerr.text);
    char *canon = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(root);
    if (!canon) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    XXH64_state_t *h = XXH64_createState();
    XXH64_reset(h, 0x68796c61u /* "hyla" */);
    XXH64_update(h, canon, strlen(canon) + 1);
    free(canon);
    for (int i = 0; i < hyla_st_count(st); i++) {
        const hyla_st_tensor *t = hyla_st_at(st, i);
        XXH64_update(h, t->name, strlen(t->name) + 1);
        uint32_t dt = (uint32_t)t->dtype, nd = (uint32_t)t->ndim;
        XXH64_update(h, &dt, sizeof dt);
        XXH64_update(h, &nd, sizeof nd);
        XXH64_update(h, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    }
    m->fingerprint = XXH64_digest(h);
    XXH64_freeState(h);
    return HYLA_OK;
}

hyla_status hyla_model_load(const char *dir, hyla_backend *be, const hyla_model_params *params, hyla_model **out) {
    *out = NULL;
    hyla_model_params p = params ? *params : hyla_model_default_params();
    hyla_model *m = calloc(1, sizeof *m);
    if (!m) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    m->be = be;
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    hyla_status s = hyla_model_config_load(dir, &m->cfg);
    if (s != HYLA_OK) {
        free(m);
        return s;
    }
    const hyla_model_config *c = &m->cfg;
    m->layer_begin = p.layer_begin;
    m->layer_end = p.layer_end < 0 ? c->num_layers : p.layer_end;
    m->tp_size = p.tp_size > 0 ? p.tp_size : 1;
    m->tp_rank = p.tp_rank;
    if (m->layer_begin < 0 || m->layer_begin >= m->layer_end || m->layer_end > c->num_layers)
        s = hyla_fail(HYLA_ERR_INVALID_ARG, "layer range %d:%d is not within the model's %d layers", p.layer_begin,
                      p.layer_end, c->num_layers);
    else if (m->tp_rank < 0 || m->tp_rank >= m->tp_size)
        s = hyla_fail(HYLA_ERR_INVALID_ARG, "tensor-parallel rank %d is not within 0..%d", m->tp_rank, m->tp_size - 1);
    else if (m->tp_size > 1)
        s = shard_config(m);
    if (s != HYLA_OK) {
        hyla_model_config_free(&m->cfg);
        free(m);
        return s;
    }
    hyla_st *st = NULL;
    s = hyla_st_open(dir, &st);
    if (s != HYLA_OK) {
        hyla_model_config_free(&m->cfg);
        free(m);
        return s;
    }
    loader L = {m, st, ""};
    s = compute_fingerprint(m, st);
    int D = c->hidden_size, V = c->vocab_size;
    int first = m->layer_begin == 0, last = m->layer_end == c->num_layers;
    if (s == HYLA_OK && (first || (last && c->tie_word_embeddings))) {
        snprintf(L.ctx, sizeof L.ctx, "the embedding");
        s = load_matrix(&L, c->layout->embed, V, D, NULL, &m->embed);
    }
    for (int i = m->layer_begin; s == HYLA_OK && i < m->layer_end; i++) s = load_layer(&L, i);
    if (s == HYLA_OK && last) {
        snprintf(L.ctx, sizeof L.ctx, "the output head");
        s = load_vector(&L, c->layout->final_norm, D, &m->final_norm);
        if (s == HYLA_OK) {
            if (c->tie_word_embeddings) m->lm_head = m->embed;
            else s = load_matrix(&L, c->layout->lm_head, V, D, NULL, &m->lm_head);
        }
    }
    hyla_st_close(st); /* backends copy weights at weight_create */
    if (s != HYLA_OK) {
        hyla_model_free(m);
        return s;
    }
    HYLA_DEBUG("loaded %s: %s, %d layers [%d, %d), %.1f MB of parameters", dir, c->model_type, c->num_layers,
               m->layer_begin, m->layer_end, m->param_bytes / 1e6);
    *out = m;
    return HYLA_OK;
}

void hyla_model_free(hyla_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_weights; i++) m->be->ops->weight_destroy(m->be->ctx, m->weights[i]);
    for (int i = 0; i < m->n_allocs; i++) m->be->ops->free(m->be->ctx, m->allocs[i]);
    for (int i = 0; i < m->n_host; i++) free(m->host[i]);
    free(m->weights);
    free(m->allocs);
    free(m->host);
    hyla_model_config_free(&m->cfg);
    free(m);
}

const hyla_model_config *hyla_model_get_config(const hyla_model *m) { return &m->cfg; }
hyla_backend *hyla_model_backend(const hyla_model *m) { return m->be; }
uint64_t hyla_model_fingerprint(const hyla_model *m) { return m->fingerprint; }
void hyla_model_layer_range(const hyla_model *m, int *begin, int *end) {
    *begin = m->layer_begin;
    *end = m->layer_end;
}
uint64_t hyla_model_param_bytes(const hyla_model *m) { return m->param_bytes; }
void hyla_model_tp(const hyla_model *m, int *rank, int *size) {
    *rank = m->tp_rank;
    *size = m->tp_size;
}
