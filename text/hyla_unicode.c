/* hyla_unicode.c — UTF-8 helpers, code point classes and NFC (canonical decomposition,
 * canonical ordering, canonical composition, Hangul by arithmetic) for text/.
 * Invariants: tables are sorted by code point (generated). Threading: the BMP class table is
 * built once under pthread_once; everything else is pure. */
#include "hyla_unicode.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

size_t hyla_utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) len = 2, v = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, v = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, v = c & 0x07, min = 0x10000;
    else goto bad;
    if (n < len) goto bad;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) goto bad;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v < 0xE000)) goto bad;
    *cp = v;
    return len;
bad:
    *cp = 0xFFFD;
    return 1;
}

size_t hyla_utf8_put(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length a sequence starting with lead byte c needs, or 0 if c cannot start one. */
static size_t lead_len(unsigned c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* 1 when s[0..k) (k < lead_len) can still grow into a valid character. */
static int valid_partial(const unsigned char *s, size_t k) {
    unsigned c = s[0];
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        if (i == 1) { /* the second byte's range depends on the lead (overlongs, surrogates, > U+10FFFF) */
            if (c == 0xE0 && s[1] < 0xA0) return 0;
            if (c == 0xED && s[1] > 0x9F) return 0;
            if (c == 0xF0 && s[1] < 0x90) return 0;
            if (c == 0xF4 && s[1] > 0x8F) return 0;
        }
    }
    return 1;
}

size_t hyla_utf8_valid_prefix(const unsigned char *s, size_t n, int *bad) {
    size_t i = 0;
    *bad = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t len = lead_len(s[i]);
        if (!len) {
            *bad = 1;
            return i;
        }
        if (i + len > n) {
            if (!valid_partial(s + i, n - i)) *bad = 1;
            return i;
        }
        uint32_t cp;
        if (hyla_utf8_next(s + i, n - i, &cp) != len) {
            *bad = 1;
            return i;
        }
        i += len;
    }
    return i;
}

/* ---- classes ---- */

static uint8_t g_bmp[0x10000];
static pthread_once_t g_bmp_once = PTHREAD_ONCE_INIT;

static void bmp_init(void) {
    for (int i = 0; i < hyla_uc_n_ranges; i++) {
        const hyla_uc_range *r = &hyla_uc_ranges[i];
        if (r->lo > 0xFFFF) break;
        uint32_t hi = r->hi > 0xFFFF ? 0xFFFF : r->hi;
        for (uint32_t c = r->lo; c <= hi; c++) g_bmp[c] = r->cls;
    }
}

int hyla_uc_class(uint32_t cp) {
    if (cp < 0x10000) {
        pthread_once(&g_bmp_once, bmp_init);
        return g_bmp[cp];
    }
    int lo = 0, hi = hyla_uc_n_ranges - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < hyla_uc_ranges[mid].lo) hi = mid - 1;
        else if (cp > hyla_uc_ranges[mid].hi) lo = mid + 1;
        else return hyla_uc_ranges[mid].cls;
    }
    return 0;
}

/* ---- NFC ---- */

#define SBASE 0xAC00u
#define LBASE 0x1100u
#define VBASE 0x1161u
#define TBASE 0x11A7u
#define LCOUNT 19u
#define VCOUNT 21u
#define TCOUNT 28u
#define NCOUNT (VCOUNT * TCOUNT)
#define SCOUNT (LCOUNT * NCOUNT)

static int ccc_of(uint32_t cp) {
    if (cp < 0x300) return 0;
    int lo = 0, hi = hyla_uc_n_ccc - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < hyla_uc_ccc[mid].cp) hi = mid - 1;
        else if (cp > hyla_uc_ccc[mid].cp) lo = mid + 1;
        else return hyla_uc_ccc[mid].ccc;
    }
    return 0;
}

static const hyla_uc_decomp_entry *decomp_of(uint32_t cp) {
    if (cp < 0xC0) return NULL;
    int lo = 0, hi = hyla_uc_n_decomp - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < hyla_uc_decomp[mid].cp) hi = mid - 1;
        else if (cp > hyla_uc_decomp[mid].cp) lo = mid + 1;
        else return &hyla_uc_decomp[mid];
    }
    return NULL;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    int lo = 0, hi = hyla_uc_n_comp - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const hyla_uc_comp_entry *e = &hyla_uc_comp[mid];
        if (a < e->a || (a == e->a && b < e->b)) hi = mid - 1;
        else if (a > e->a || b > e->b) lo = mid + 1;
        else return e->c;
    }
    return 0;
}

int hyla_nfc_quick(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0xCC) return 0;
    return 1;
}

hyla_status hyla_nfc(const char *s, size_t n, char **out, size_t *out_len) {
    /* a full canonical decomposition is at most 4 code points per input code point; Hangul 3 */
    uint32_t *cps = malloc((n * 4 + 1) * sizeof *cps);
    uint8_t *cc = malloc(n * 4 + 1);
    char *o = malloc(n * 4 + 4); /* NFC output never needs more than 4 bytes per decoded cp */
    if (!cps || !cc || !o) {
        free(cps), free(cc), free(o);
        return hyla_fail(HYLA_ERR_NOMEM, "NFC: out of memory for %zu bytes", n);
    }
    size_t m = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += hyla_utf8_next(u + i, n - i, &cp);
        if (cp >= SBASE && cp < SBASE + SCOUNT) {
            uint32_t si = cp - SBASE;
            cps[m++] = LBASE + si / NCOUNT;
            cps[m++] = VBASE + (si % NCOUNT) / TCOUNT;
            if (si % TCOUNT) cps[m++] = TBASE + si % TCOUNT;
            continue;
        }
        const hyla_uc_decomp_entry *d = decomp_of(cp);
        if (d)
            for (int k = 0; k < d->len; k++) cps[m++] = hyla_uc_decomp_data[d->off + k];
        else
            cps[m++] = cp;
    }
    for (size_t i = 0; i < m; i++) cc[i] = (uint8_t)ccc_of(cps[i]);
    /* canonical ordering: a stable insertion sort of each run of non-starters */
    for (size_t i = 1; i < m; i++) {
        if (!cc[i]) continue;
        size_t j = i;
        while (j > 0 && cc[j - 1] > cc[j]) {
            uint32_t t = cps[j];
            cps[j] = cps[j - 1], cps[j - 1] = t;
            uint8_t tc = cc[j];
            cc[j] = cc[j - 1], cc[j - 1] = tc;
            j--;
        }
    }
    /* canonical composition: cp joins the last starter unless something between them is
     * a starter or has a combining class >= cp's (blocked) */
    size_t w = 0;
    long starter = -1; /* output index of the last starter */
    int between = 0, last_cc = 0;
    for (size_t i = 0; i < m; i++) {
        uint32_t cp = cps[i];
        int c = cc[i];
        if (starter >= 0 && (!between || last_cc < c)) {
            uint32_t comp = compose(cps[starter], cp);
            if (comp) {
                cps[starter] = comp;
                continue;
            }
        }
        if (c == 0) {
            starter = (long)w;
            between = 0;
        } else {
            between = 1;
            last_cc = c;
        }
        cps[w++] = cp;
    }
    size_t ol = 0;
    for (size_t i = 0; i < w; i++) ol += hyla_utf8_put(cps[i], o + ol);
    free(cps);
    free(cc);
    *out = o;
    *out_len = ol;
    return HYLA_OK;
}
