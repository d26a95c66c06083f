/* hyla_safetensors.h — read (mmap) and write safetensors files, single or sharded.
 *
 * Format: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
 * then the data region; offsets are relative to its start.
 *
 * Ownership: hyla_st_open maps every file of a model directory; tensors' data pointers are
 * borrowed until hyla_st_close. Read-only; safe to share between threads. */
#ifndef HYLA_SAFETENSORS_H
#define HYLA_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "hyla_status.h"
#include "hyla_util.h"

#define HYLA_ST_MAX_DIMS 8

typedef struct {
    char *name;
    hyla_dtype dtype;
    int ndim;
    int64_t shape[HYLA_ST_MAX_DIMS];
    const void *data; /* into the mapping */
    size_t nbytes;
    const char *file; /* basename of the file holding it */
} hyla_st_tensor;

typedef struct hyla_st hyla_st;

/* Open model.safetensors, or every shard named by model.safetensors.index.json, in dir.
 * Errors name the file and, where it applies, the tensor. Caller frees with hyla_st_close. */
hyla_status hyla_st_open(const char *dir, hyla_st **out);
void hyla_st_close(hyla_st *st); /* accepts NULL */
/* NULL if absent. Borrowed until hyla_st_close. */
const hyla_st_tensor *hyla_st_find(const hyla_st *st, const char *name);
int hyla_st_count(const hyla_st *st);
const hyla_st_tensor *hyla_st_at(const hyla_st *st, int i); /* sorted by name */

/* Writing: tensors given as (name, dtype, shape, data) — data borrowed for the call. */
typedef struct {
    const char *name;
    hyla_dtype dtype;
    int ndim;
    int64_t shape[HYLA_ST_MAX_DIMS];
    const void *data;
} hyla_st_entry;
hyla_status hyla_st_write(const char *path, const hyla_st_entry *entries, int n);

#endif
