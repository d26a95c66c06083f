/* test_loader.c — model directories that must be refused, each with an error that names what
 * was wrong: missing tensor, wrong shape, unknown model_type, bad config values, truncated
 * file, lying header, sharded index naming a missing shard; and a sharded model that loads and
 * gives the same logits as the single-file one, and bf16 weights that load. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyla_safetensors.h"
#include "hyla_session.h"
#include "hyla_test.h"
#include "hyla_test_model.h"

static char tmp[] = "/tmp/hyla-test-loader-XXXXXX";
static hyla_backend *be;

static void sh(const char *fmt, const char *a, const char *b) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    if (system(cmd) != 0) {
        fprintf(stderr, "command failed: %s\n", cmd);
        exit(1);
    }
}

/* Load dir; expect failure with status st and every needle in the message. */
static void expect_fail(const char *dir, hyla_status st, const char *n1, const char *n2) {
    hyla_model *m = NULL;
    hyla_status got = hyla_model_load(dir, be, NULL, &m);
    const char *msg = hyla_last_error();
    CHECK_MSG(got == st, "%s: expected status %s, got %s (%s)", dir, hyla_status_str(st), hyla_status_str(got), msg);
    CHECK_MSG(!n1 || strstr(msg, n1), "message '%s' lacks '%s'", msg, n1);
    CHECK_MSG(!n2 || strstr(msg, n2), "message '%s' lacks '%s'", msg, n2);
    CHECK(m == NULL);
    hyla_model_free(m);
}

/* Copy model `src` to `dst`, rewriting its tensors through `edit` (may drop or reshape). */
typedef int (*edit_fn)(hyla_st_entry *e);
static void rewrite(const char *src, const char *dst, edit_fn edit) {
    sh("rm -rf %s && mkdir -p %s", dst, dst);
    sh("cp %s/config.json %s/", src, dst);
    hyla_st *st = NULL;
    CHECK_OK(hyla_st_open(src, &st));
    int n = hyla_st_count(st), k = 0;
    hyla_st_entry *e = calloc((size_t)n, sizeof *e);
    for (int i = 0; i < n; i++) {
        const hyla_st_tensor *t = hyla_st_at(st, i);
        hyla_st_entry x = {t->name, t->dtype, t->ndim, {0}, t->data};
        memcpy(x.shape, t->shape, sizeof x.shape);
        if (edit(&x)) e[k++] = x;
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    CHECK_OK(hyla_st_write(path, e, k));
    free(e);
    hyla_st_close(st);
}

static int drop_e_proj(hyla_st_entry *e) { return strcmp(e->name, "model.layers.0.attn.e_proj.weight") != 0; }
static int shrink_o_proj(hyla_st_entry *e) {
    if (!strcmp(e->name, "model.layers.0.attn.o_proj.weight")) e->shape[1] /= 2; /* data is longer: fine */
    return 1;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    HYLA_ASSERT(f);
    fputs(text, f);
    fclose(f);
}

/* ---- checkpoint naming variants (flash-linear-attention writes several for one model) ---- */

/* Rename tensors whose name ends in `from` to end in `to`; drop those ending in `drop`. */
static const char *g_from, *g_to, *g_drop;
static char g_names[64][256];
static int g_nnames;
static int rename_edit(hyla_st_entry *e) {
    size_t n = strlen(e->name);
    if (g_drop && n >= strlen(g_drop) && !strcmp(e->name + n - strlen(g_drop), g_drop)) return 0;
    if (g_from && n >= strlen(g_from) && !strcmp(e->name + n - strlen(g_from), g_from)) {
        HYLA_ASSERT(g_nnames < 64);
        char *b = g_names[g_nnames++];
        snprintf(b, 256, "%.*s%s", (int)(n - strlen(g_from)), e->name, g_to);
        e->name = b;
    }
    return 1;
}
static void variant(const char *src, const char *dst, const char *from, const char *to, const char *drop) {
    g_from = from;
    g_to = to;
    g_drop = drop;
    g_nnames = 0;
    rewrite(src, dst, rename_edit);
}
/* Edit dst/config.json with a python3 expression on `c` (the parsed object). */
static void config_edit(const char *dst, const char *expr) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json,sys; p=sys.argv[1]+\"/config.json\"; c=json.load(open(p)); %s; "
             "json.dump(c, open(p, \"w\"))' %s",
             expr, dst);
    CHECK(system(cmd) == 0);
}
/* Both load and give the same logits, bit for bit, for a short prompt. */
static void same_logits(const char *a, const char *b) {
    hyla_runtime *ra = test_load(a, be, NULL), *rb = test_load(b, be, NULL);
    if (ra && rb) {
        hyla_session *s1 = NULL, *s2 = NULL;
        CHECK_OK(hyla_session_create(ra, &s1));
        CHECK_OK(hyla_session_create(rb, &s2));
        int32_t toks[5] = {1, 2, 3, 4, 5};
        float l1[4 * 260], l2[4 * 260];
        CHECK_OK(hyla_session_feed(s1, toks, 5, l1, NULL, NULL, NULL));
        CHECK_OK(hyla_session_feed(s2, toks, 5, l2, NULL, NULL, NULL));
        CHECK_MSG(!memcmp(l1, l2, sizeof l1), "%s and %s give different logits", a, b);
        hyla_session_free(s1);
        hyla_session_free(s2);
    }
    test_unload(ra);
    test_unload(rb);
}

static void test_naming_variants(const char *bin) {
    char src[700], d[700], cmd[2048];
    /* GLA saved with fuse_norm=False: the output norm is g_norm, not g_norm_swish_gate */
    snprintf(src, sizeof src, "%s/v-gla", tmp);
    snprintf(cmd, sizeof cmd, "%s/hyla-mkmodel --arch gla-h --layers 2 --hidden 64 --heads 4 --out %s 2>/dev/null", bin, src);
    CHECK(system(cmd) == 0);
    snprintf(d, sizeof d, "%s/v-gla-unfused", tmp);
    variant(src, d, "g_norm_swish_gate.weight", "g_norm.weight", NULL);
    config_edit(d, "c[\"fuse_norm\"]=False");
    same_logits(src, d);
    /* GLA without the output gate: g_norm and no g_proj */
    snprintf(d, sizeof d, "%s/v-gla-nogate", tmp);
    variant(src, d, "g_norm_swish_gate.weight", "g_norm.weight", "attn.g_proj.weight");
    config_edit(d, "c[\"use_output_gate\"]=False");
    hyla_runtime *r = test_load(d, be, NULL);
    test_unload(r);
    /* GLA with short convolutions */
    snprintf(d, sizeof d, "%s/v-gla-conv", tmp);
    snprintf(cmd, sizeof cmd, "%s/hyla-mkmodel --arch gla --short-conv 1 --layers 2 --hidden 64 --heads 4 --out %s 2>/dev/null", bin, d);
    CHECK(system(cmd) == 0);
    r = test_load(d, be, NULL);
    test_unload(r);
    /* GDN without the output gate (o_norm plain) and without short convolutions */
    snprintf(src, sizeof src, "%s/v-gdn", tmp);
    snprintf(cmd, sizeof cmd, "%s/hyla-mkmodel --arch gdn --short-conv 0 --layers 2 --hidden 64 --heads 4 --out %s 2>/dev/null", bin, src);
    CHECK(system(cmd) == 0);
    snprintf(d, sizeof d, "%s/v-gdn-nogate", tmp);
    variant(src, d, NULL, NULL, "attn.g_proj.weight");
    config_edit(d, "c[\"use_gate\"]=False");
    r = test_load(d, be, NULL);
    test_unload(r);
    /* tied embeddings: no lm_head tensor; the same logits as an untied model whose head is the table */
    snprintf(src, sizeof src, "%s/v-untied", tmp);
    snprintf(cmd, sizeof cmd,
             "%s/hyla-mkmodel --arch gdn-h --layers 2 --hidden 64 --heads 4 --out %s 2>/dev/null && python3 - %s <<'PY'\n"
             "import json, struct, sys\n"
             "p = sys.argv[1] + '/model.safetensors'\n"
             "b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8+n]); data = bytearray(b[8+n:])\n"
             "e, l = h['model.embeddings.weight']['data_offsets'], h['lm_head.weight']['data_offsets']\n"
             "data[l[0]:l[1]] = data[e[0]:e[1]]\n"
             "open(p, 'wb').write(b[:8+n] + bytes(data))\n"
             "PY",
             bin, src, src);
    CHECK(system(cmd) == 0);
    snprintf(d, sizeof d, "%s/v-tied", tmp);
    variant(src, d, NULL, NULL, "lm_head.weight");
    config_edit(d, "c[\"tie_word_embeddings\"]=True");
    same_logits(src, d);
    /* a key of newer flash-linear-attention models that we do not implement is refused by name */
    snprintf(d, sizeof d, "%s/v-attnres", tmp);
    variant(src, d, NULL, NULL, NULL);
    config_edit(d, "c[\"attnres_block_size\"]=2");
    expect_fail(d, HYLA_ERR_UNSUPPORTED, "attnres_block_size", NULL);
}

/* The sparse-attention specs refuse what we do not implement, naming the key inside the spec; an
 * SSE prefill_window that is no power of two from 64 is refused by name too. */
static void test_sparse_refusals(const char *bin) {
    char src[600], d[600], cmd[2048];
    static const struct {
        const char *arch, *edit, *key;
        hyla_status st;
    } cases[] = {
        {"lalte", "c[\"lte\"][\"window_size\"]=12", "lte.window_size", HYLA_ERR_FORMAT}, /* < receptive field 13 */
        {"lalte", "c[\"lte\"][\"conv_kernel_size\"]=2", "lte.conv_kernel_size", HYLA_ERR_FORMAT},
        {"lalte", "c[\"lte\"][\"conv_channels\"]=[8,0]", "lte.conv_channels", HYLA_ERR_FORMAT},
        {"lalte", "c[\"lte\"][\"budget\"]=0", "lte.budget", HYLA_ERR_FORMAT},
        {"lalte", "c[\"lte\"][\"scoring\"]=\"never\"", "lte.scoring", HYLA_ERR_UNSUPPORTED},
        {"lansa", "c[\"nsa\"][\"block_counts\"]=[1,2]", "nsa.block_counts", HYLA_ERR_UNSUPPORTED},
        {"lansa", "c[\"nsa\"][\"num_kv_heads\"]=3", "nsa.num_kv_heads", HYLA_ERR_UNSUPPORTED},
        {"sse-h", "c[\"prefill_window\"]=100", "prefill_window", HYLA_ERR_UNSUPPORTED},
        {"sse-h", "c[\"prefill_window\"]=32", "prefill_window", HYLA_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(src, sizeof src, "%s/sp-%s", tmp, cases[i].arch);
        if (i == 0 || strcmp(cases[i].arch, cases[i - 1].arch)) {
            snprintf(cmd, sizeof cmd, "%s/hyla-mkmodel --arch %s --layers 2 --hidden 64 --heads 4 --window 16 --out %s 2>/dev/null",
                     bin, cases[i].arch, src);
            CHECK(system(cmd) == 0);
        }
        snprintf(d, sizeof d, "%s/sp-%zu", tmp, i);
        variant(src, d, NULL, NULL, NULL);
        config_edit(d, cases[i].edit);
        expect_fail(d, cases[i].st, cases[i].key, NULL);
    }
}

/* ---- Mamba2 (transformers' config keys) ---- */
static void test_mamba2_keys(const char *bin) {
    char src[700], d[700], cmd[2048];
    snprintf(src, sizeof src, "%s/m2", tmp);
    snprintf(cmd, sizeof cmd, "%s/hyla-mkmodel --arch mamba2 --layers 2 --hidden 64 --heads 4 --out %s 2>/dev/null", bin, src);
    CHECK(system(cmd) == 0);
    /* Python's json writes time_step_limit (0.0, inf) as [0.0, Infinity]: read as no limit */
    snprintf(d, sizeof d, "%s/m2-inf", tmp);
    variant(src, d, NULL, NULL, NULL);
    config_edit(d, "c[\"time_step_limit\"]=[0.0, float(\"inf\")]");
    same_logits(src, d);
    /* transformers 5 writes it as [0.0, {"__float__": "Infinity"}] */
    snprintf(d, sizeof d, "%s/m2-inf5", tmp);
    variant(src, d, NULL, NULL, NULL);
    config_edit(d, "c[\"time_step_limit\"]=[0.0, {\"__float__\": \"Infinity\"}]");
    same_logits(src, d);
    /* the gated norm: grouped with FLA's keys (mkmodel's) or norm_grouped, over all channels as
     * transformers without them; G = 2 here, so the two differ */
    snprintf(d, sizeof d, "%s/m2-grp", tmp);
    variant(src, d, NULL, NULL, NULL);
    config_edit(d, "del c[\"norm_before_gate\"]; c[\"norm_grouped\"]=True");
    same_logits(src, d);
    snprintf(d, sizeof d, "%s/m2-hf", tmp);
    variant(src, d, NULL, NULL, NULL);
    config_edit(d, "del c[\"norm_before_gate\"]");
    {
        hyla_runtime *r1 = test_load(src, be, NULL), *r2 = test_load(d, be, NULL);
        if (r1 && r2) {
            hyla_session *s1 = NULL, *s2 = NULL;
            CHECK_OK(hyla_session_create(r1, &s1));
            CHECK_OK(hyla_session_create(r2, &s2));
            int32_t toks[5] = {1, 2, 3, 4, 5};
            float l1[4 * 260], l2[4 * 260];
            CHECK_OK(hyla_session_feed(s1, toks, 5, l1, NULL, NULL, NULL));
            CHECK_OK(hyla_session_feed(s2, toks, 5, l2, NULL, NULL, NULL));
            CHECK_MSG(memcmp(l1, l2, sizeof l1) != 0, "mamba2: the norm over all channels gave the grouped norm's logits");
            hyla_session_free(s1);
            hyla_session_free(s2);
        }
        test_unload(r1);
        test_unload(r2);
    }
    /* a binding limit is read (other logits) */
    snprintf(d, sizeof d, "%s/m2-lim", tmp);
    variant(src, d, NULL, NULL, NULL);
    config_edit(d, "c[\"time_step_limit\"]=[0.0, 0.002]");
    hyla_runtime *ra = test_load(src, be, NULL), *rb = test_load(d, be, NULL);
    if (ra && rb) {
        hyla_session *s1 = NULL, *s2 = NULL;
        CHECK_OK(hyla_session_create(ra, &s1));
        CHECK_OK(hyla_session_create(rb, &s2));
        int32_t toks[5] = {1, 2, 3, 4, 5};
        float l1[4 * 260], l2[4 * 260];
        CHECK_OK(hyla_session_feed(s1, toks, 5, l1, NULL, NULL, NULL));
        CHECK_OK(hyla_session_feed(s2, toks, 5, l2, NULL, NULL, NULL));
        CHECK_MSG(memcmp(l1, l2, sizeof l1) != 0, "mamba2: time_step_limit [0, 0.002] changed nothing");
        hyla_session_free(s1);
        hyla_session_free(s2);
    }
    test_unload(ra);
    test_unload(rb);
    /* refusals name the key */
    static const struct {
        const char *edit, *key;
        hyla_status st;
    } bad[] = {
        {"c[\"norm_before_gate\"]=True", "'norm_before_gate'", HYLA_ERR_UNSUPPORTED},
        {"c[\"rms_norm\"]=False", "'rms_norm'", HYLA_ERR_UNSUPPORTED},
        {"c[\"n_groups\"]=3", "'n_groups'", HYLA_ERR_UNSUPPORTED},
        {"c[\"num_heads\"]=8", "'num_heads'", HYLA_ERR_UNSUPPORTED},
        {"c[\"state_size\"]=0", "'state_size'", HYLA_ERR_FORMAT},
        {"c[\"time_step_limit\"]=[0.0]", "'time_step_limit'", HYLA_ERR_FORMAT},
        {"c[\"hidden_act\"]=\"gelu\"", "'hidden_act'", HYLA_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(d, sizeof d, "%s/m2-bad%zu", tmp, i);
        variant(src, d, NULL, NULL, NULL);
        config_edit(d, bad[i].edit);
        expect_fail(d, bad[i].st, bad[i].key, NULL);
    }
    /* the statex spec's state_size reaches the listed layers: their state tensors' shapes */
    snprintf(d, sizeof d, "%s/m2-sx", tmp);
    variant(src, d, NULL, NULL, NULL);
    config_edit(d, "c[\"statex\"]={\"layers\": [1], \"state_size\": 256}");
    expect_fail(d, HYLA_ERR_MISMATCH, "backbone.layers.1.mixer.in_proj.weight", NULL);
}

int main(void) {
    if (!mkdtemp(tmp)) return 1;
    CHECK_OK(hyla_backend_create("cpu", &be));
    const char *bin = hyla_test_env("HYLA_BIN_DIR", "build/bin");
    char good[600], d[600], cmd[2048], path[800];
    snprintf(good, sizeof good, "%s/good", tmp);
    snprintf(cmd, sizeof cmd, "%s/hyla-mkmodel --arch sse-h --layers 3 --hidden 64 --heads 4 --out %s 2>/dev/null", bin, good);
    if (system(cmd) != 0) return 1;

    /* missing tensor: names the file/dir, the tensor and who needs it */
    snprintf(d, sizeof d, "%s/missing", tmp);
    rewrite(good, d, drop_e_proj);
    expect_fail(d, HYLA_ERR_NOT_FOUND, "model.layers.0.attn.e_proj.weight", "layer 0 (sse)");

    /* wrong shape: names the file, tensor, got and expected shapes */
    snprintf(d, sizeof d, "%s/shape", tmp);
    rewrite(good, d, shrink_o_proj);
    expect_fail(d, HYLA_ERR_MISMATCH, "model.safetensors: tensor 'model.layers.0.attn.o_proj.weight' has shape [64, 32]",
                "expected [64, 64]");

    /* unknown model_type */
    snprintf(d, sizeof d, "%s/type", tmp);
    sh("cp -r %s %s", good, d);
    snprintf(path, sizeof path, "%s/config.json", d);
    write_text(path, "{\"model_type\": \"mamba7\", \"hidden_size\": 64}");
    expect_fail(d, HYLA_ERR_UNSUPPORTED, "unknown model_type 'mamba7'", "config.json");
    /* a key with a bad value / type */
    write_text(path, "{\"model_type\": \"gla\", \"hidden_size\": \"wide\"}");
    expect_fail(d, HYLA_ERR_FORMAT, "'hidden_size'", NULL);
    write_text(path, "{\"model_type\": \"gla\", \"hidden_size\": 64, \"num_heads\": 4, \"feature_map\": \"relu\"}");
    expect_fail(d, HYLA_ERR_UNSUPPORTED, "'feature_map'", NULL);
    write_text(path, "{\"model_type\": \"sse\", \"hidden_size\": 64, \"num_heads\": 4, \"num_writer\": 5}");
    expect_fail(d, HYLA_ERR_FORMAT, "num_writer (5)", NULL);
    write_text(path, "{not json");
    expect_fail(d, HYLA_ERR_FORMAT, "config.json", NULL);
    /* layer lists of hybrid specs: a layer outside the model, a layer two specs claim */
    write_text(path, "{\"model_type\": \"gla\", \"hidden_size\": 64, \"num_heads\": 4, \"num_hidden_layers\": 2, "
                     "\"attn\": {\"layers\": [2], \"num_heads\": 4}}");
    expect_fail(d, HYLA_ERR_FORMAT, "'attn.layers' has an entry outside [0, 2)", NULL);
    write_text(path, "{\"model_type\": \"gla\", \"hidden_size\": 64, \"num_heads\": 4, \"num_hidden_layers\": 2, "
                     "\"attn\": [{\"layers\": [1], \"num_heads\": 4}, {\"layers\": [1], \"num_heads\": 4}]}");
    expect_fail(d, HYLA_ERR_FORMAT, "'attn[1].layers' lists layer 1, which another spec already took", NULL);
    write_text(path, "{\"model_type\": \"gla\", \"hidden_size\": 64, \"num_heads\": 4, \"num_hidden_layers\": 2, "
                     "\"statex\": {\"layers\": [-1]}}");
    expect_fail(d, HYLA_ERR_FORMAT, "'statex.layers' has an entry outside [0, 2)", NULL);

    /* truncated safetensors: names the file and the tensor that runs past the end */
    snprintf(d, sizeof d, "%s/trunc", tmp);
    sh("cp -r %s %s", good, d);
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    CHECK(truncate(path, size - 1000) == 0);
    expect_fail(d, HYLA_ERR_FORMAT, "model.safetensors: truncated: tensor", "ends at byte");
    CHECK(truncate(path, 5) == 0);
    expect_fail(d, HYLA_ERR_FORMAT, "truncated", NULL);

    /* no weights at all */
    snprintf(d, sizeof d, "%s/noweights", tmp);
    sh("mkdir -p %s%s", d, "");
    sh("cp %s/config.json %s/", good, d);
    expect_fail(d, HYLA_ERR_NOT_FOUND, "model.safetensors", NULL);
    /* no directory */
    expect_fail("/nonexistent/model", HYLA_ERR_NOT_FOUND, "config.json", NULL);

    /* sharded: an index that splits tensors over two files loads and gives the same logits */
    snprintf(d, sizeof d, "%s/sharded", tmp);
    sh("rm -rf %s && mkdir -p %s", d, d);
    sh("cp %s/config.json %s/", good, d);
    {
        hyla_st *st = NULL;
        CHECK_OK(hyla_st_open(good, &st));
        int n = hyla_st_count(st), half = n / 2;
        hyla_st_entry *e = calloc((size_t)n, sizeof *e);
        char idx[65536];
        size_t o = (size_t)snprintf(idx, sizeof idx, "{\"metadata\": {}, \"weight_map\": {");
        for (int i = 0; i < n; i++) {
            const hyla_st_tensor *t = hyla_st_at(st, i);
            e[i] = (hyla_st_entry){t->name, t->dtype, t->ndim, {0}, t->data};
            memcpy(e[i].shape, t->shape, sizeof e[i].shape);
            o += (size_t)snprintf(idx + o, sizeof idx - o, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "",
                                  t->name, i < half ? 1 : 2);
        }
        snprintf(idx + o, sizeof idx - o, "}}");
        snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", d);
        CHECK_OK(hyla_st_write(path, e, half));
        snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", d);
        CHECK_OK(hyla_st_write(path, e + half, n - half));
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", d);
        write_text(path, idx);
        free(e);
        hyla_st_close(st);
        hyla_runtime *m1 = NULL, *m2 = NULL;
        m1 = test_load(good, be, NULL);
        m2 = test_load(d, be, NULL);
        if (m1 && m2) {
            CHECK(hyla_model_fingerprint(test_model(m1)) == hyla_model_fingerprint(test_model(m2)));
            hyla_session *s1 = NULL, *s2 = NULL;
            CHECK_OK(hyla_session_create(m1, &s1));
            CHECK_OK(hyla_session_create(m2, &s2));
            int32_t toks[5] = {1, 2, 3, 4, 5};
            float l1[4 * 260], l2[4 * 260];
            CHECK_OK(hyla_session_feed(s1, toks, 5, l1, NULL, NULL, NULL));
            CHECK_OK(hyla_session_feed(s2, toks, 5, l2, NULL, NULL, NULL));
            CHECK(!memcmp(l1, l2, sizeof l1));
            hyla_session_free(s1);
            hyla_session_free(s2);
        }
        test_unload(m1);
        test_unload(m2);
        /* a shard named by the index but absent */
        sh("rm %s/model-00002-of-00002.safetensors%s", d, "");
        expect_fail(d, HYLA_ERR_NOT_FOUND, "model-00002-of-00002.safetensors", NULL);
    }

    /* bf16 and f16 weights load */
    for (int k = 0; k < 2; k++) {
        snprintf(d, sizeof d, "%s/half%d", tmp, k);
        snprintf(cmd, sizeof cmd, "%s/hyla-mkmodel --arch gla-h --layers 2 --hidden 64 --heads 4 --dtype %s --out %s 2>/dev/null",
                 bin, k ? "f16" : "bf16", d);
        CHECK(system(cmd) == 0);
        hyla_runtime *m = test_load(d, be, NULL);
        test_unload(m);
    }

    test_naming_variants(bin);
    test_sparse_refusals(bin);
    test_mamba2_keys(bin);

    hyla_backend_destroy(be);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) return 1;
    return hyla_test_done("test_loader");
}
