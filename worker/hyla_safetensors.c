/* hyla_safetensors.c — see hyla_safetensors.h. Files are mapped read-only (MAP_PRIVATE);
 * every header entry is validated against the file size before any data pointer is handed out,
 * so a truncated or lying file fails at open, naming the file and tensor. */
#include "hyla_safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyla_util.h"

typedef struct {
    char *path;
    char *base;
    void *map;
    size_t size;
} st_file;

struct hyla_st {
    st_file *files;
    int n_files;
    hyla_st_tensor *tensors;
    int n_tensors, cap_tensors;
};

static int dtype_from_str(const char *s, hyla_dtype *dt) {
    if (!strcmp(s, "F32")) *dt = HYLA_DT_F32;
    else if (!strcmp(s, "F16")) *dt = HYLA_DT_F16;
    else if (!strcmp(s, "BF16")) *dt = HYLA_DT_BF16;
    else if (!strcmp(s, "I32")) *dt = HYLA_DT_I32;
    else if (!strcmp(s, "I64")) *dt = HYLA_DT_I64;
    else if (!strcmp(s, "U8")) *dt = HYLA_DT_U8;
    else return 0;
    return 1;
}

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const hyla_st_tensor *)a)->name, ((const hyla_st_tensor *)b)->name);
}

static hyla_status map_file(hyla_st *st, const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    for (int i = 0; i < st->n_files; i++)
        if (!strcmp(st->files[i].path, path)) return HYLA_OK;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return hyla_fail(errno == ENOENT ? HYLA_ERR_NOT_FOUND : HYLA_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return hyla_fail(HYLA_ERR_IO, "%s: stat: %s", path, strerror(e));
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return hyla_fail(HYLA_ERR_FORMAT, "%s: truncated: %zu bytes, a safetensors file has at least 8", path, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return hyla_fail(HYLA_ERR_IO, "%s: mmap: %s", path, strerror(errno));
    st_file *nf = realloc(st->files, (size_t)(st->n_files + 1) * sizeof *nf);
    if (!nf) {
        munmap(map, size);
        return hyla_fail(HYLA_ERR_NOMEM, "%s: out of memory", path);
    }
    st->files = nf;
    st_file *f = &st->files[st->n_files++];
    f->path = strdup(path);
    f->base = strdup(name);
    f->map = map;
    f->size = size;

    const uint8_t *p = map;
    uint64_t hlen = hyla_get_le64(p);
    if (hlen > size - 8)
        return hyla_fail(HYLA_ERR_FORMAT, "%s: truncated: header says %llu bytes of JSON, file has %zu", path,
                         (unsigned long long)hlen, size - 8);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, 0, &jerr);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return hyla_fail(HYLA_ERR_FORMAT, "%s: header is not a JSON object: %s", path, jerr.text);
    }
    const uint8_t *data = p + 8 + hlen;
    size_t data_len = size - 8 - (size_t)hlen;
    const char *key;
    json_t *val;
    hyla_status s = HYLA_OK;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
               *jo = json_object_get(val, "data_offsets");
        if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2) {
            s = hyla_fail(HYLA_ERR_FORMAT, "%s: tensor '%s': header entry lacks dtype/shape/data_offsets", path, key);
            break;
        }
        hyla_st_tensor t = {0};
        if (!dtype_from_str(json_string_value(jd), &t.dtype)) {
            s = hyla_fail(HYLA_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s not supported (F32, F16, BF16)", path, key,
                          json_string_value(jd));
            break;
        }
        t.ndim = (int)json_array_size(js);
        if (t.ndim > HYLA_ST_MAX_DIMS) {
            s = hyla_fail(HYLA_ERR_FORMAT, "%s: tensor '%s': %d dims", path, key, t.ndim);
            break;
        }
        uint64_t n = 1;
        for (int d = 0; d < t.ndim; d++) {
            json_int_t v = json_integer_value(json_array_get(js, (size_t)d));
            if (v < 0) {
                s = hyla_fail(HYLA_ERR_FORMAT, "%s: tensor '%s': negative dimension", path, key);
                break;
            }
            t.shape[d] = v;
            n *= (uint64_t)v;
        }
        if (s != HYLA_OK) break;
        json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
        uint64_t want = n * hyla_dtype_size(t.dtype);
        if (b < 0 || e < b || (uint64_t)(e - b) != want) {
            s = hyla_fail(HYLA_ERR_FORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] do not hold %llu bytes", path,
                          key, (long long)b, (long long)e, (unsigned long long)want);
            break;
        }
        if ((uint64_t)e > data_len) {
            s = hyla_fail(HYLA_ERR_FORMAT,
                          "%s: truncated: tensor '%s' ends at byte %lld of the data region, which has %zu bytes", path,
                          key, (long long)e, data_len);
            break;
        }
        t.data = data + b;
        t.nbytes = (size_t)want;
        t.name = strdup(key);
        t.file = f->base;
        if (st->n_tensors == st->cap_tensors) {
            int cap = st->cap_tensors ? st->cap_tensors * 2 : 256;
            hyla_st_tensor *nt = realloc(st->tensors, (size_t)cap * sizeof *nt);
            if (!nt) {
                free(t.name);
                s = hyla_fail(HYLA_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            st->tensors = nt;
            st->cap_tensors = cap;
        }
        st->tensors[st->n_tensors++] = t;
    }
    json_decref(root);
    return s;
}

hyla_status hyla_st_open(const char *dir, hyla_st **out) {
    *out = NULL;
    hyla_st *st = calloc(1, sizeof *st);
    if (!st) return hyla_fail(HYLA_ERR_NOMEM, "out of memory");
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    hyla_status s;
    if (access(path, F_OK) == 0) {
        json_error_t jerr;
        json_t *root = json_load_file(path, 0, &jerr);
        json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
        if (!json_is_object(wm)) {
            json_decref(root);
            hyla_st_close(st);
            return hyla_fail(HYLA_ERR_FORMAT, "%s: no \"weight_map\" object (%s)", path, root ? "missing" : jerr.text);
        }
        const char *key;
        json_t *val;
        s = HYLA_OK;
        json_object_foreach(wm, key, val) {
            if (!json_is_string(val)) {
                s = hyla_fail(HYLA_ERR_FORMAT, "%s: weight_map['%s'] is not a file name", path, key);
                break;
            }
            if ((s = map_file(st, dir, json_string_value(val))) != HYLA_OK) break;
        }
        json_decref(root);
    } else {
        s = map_file(st, dir, "model.safetensors");
    }
    if (s != HYLA_OK) {
        hyla_st_close(st);
        return s;
    }
    qsort(st->tensors, (size_t)st->n_tensors, sizeof *st->tensors, cmp_tensor);
    for (int i = 1; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, st->tensors[i - 1].name)) {
            s = hyla_fail(HYLA_ERR_FORMAT, "%s: tensor '%s' appears twice (in %s and %s)", dir, st->tensors[i].name,
                          st->tensors[i - 1].file, st->tensors[i].file);
            hyla_st_close(st);
            return s;
        }
    *out = st;
    return HYLA_OK;
}

void hyla_st_close(hyla_st *st) {
    if (!st) return;
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    for (int i = 0; i < st->n_files; i++) {
        munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
        free(st->files[i].base);
    }
    free(st->files);
    free(st);
}

const hyla_st_tensor *hyla_st_find(const hyla_st *st, const char *name) {
    int lo = 0, hi = st->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (!c) return &st->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

int hyla_st_count(const hyla_st *st) { return st->n_tensors; }
const hyla_st_tensor *hyla_st_at(const hyla_st *st, int i) { return &st->tensors[i]; }

hyla_status hyla_st_write(const char *path, const hyla_st_entry *entries, int n) {
    json_t *hdr = json_object();
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const hyla_st_entry *e = &entries[i];
        json_t *shape = json_array();
        uint64_t cnt = 1;
        for (int d = 0; d < e->ndim; d++) {
            json_array_append_new(shape, json_integer(e->shape[d]));
            cnt *= (uint64_t)e->shape[d];
        }
        uint64_t nb = cnt * hyla_dtype_size(e->dtype);
        json_t *t = json_object();
        json_object_set_new(t, "dtype", json_string(hyla_dtype_name(e->dtype)));
        json_object_set_new(t, "shape", shape);
        json_t *offs = json_array();
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + nb)));
        json_object_set_new(t, "data_offsets", offs);
        json_object_set_new(hdr, e->name, t);
        off += nb;
    }
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(hdr, "__metadata__", meta);
    char *txt = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(hdr);
    if (!txt) return hyla_fail(HYLA_ERR_NOMEM, "%s: cannot serialise header", path);
    size_t hlen = strlen(txt);
    size_t pad = (8 - hlen % 8) % 8; /* align the data region to 8 bytes */
    size_t total = 8 + hlen + pad + off;
    uint8_t *buf = malloc(total);
    if (!buf) {
        free(txt);
        return hyla_fail(HYLA_ERR_NOMEM, "%s: cannot allocate %zu bytes", path, total);
    }
    uint64_t h = hlen + pad;
    hyla_put_le64(buf, h);
    memcpy(buf + 8, txt, hlen);
    memset(buf + 8 + hlen, ' ', pad);
    free(txt);
    uint8_t *d = buf + 8 + h;
    for (int i = 0; i < n; i++) {
        uint64_t cnt = 1;
        for (int k = 0; k < entries[i].ndim; k++) cnt *= (uint64_t)entries[i].shape[k];
        size_t nb = cnt * hyla_dtype_size(entries[i].dtype);
        memcpy(d, entries[i].data, nb);
        d += nb;
    }
    hyla_status s = hyla_write_file_atomic(path, buf, total);
    free(buf);
    return s;
}
