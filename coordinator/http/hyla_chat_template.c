/* hyla_chat_template.c — a Jinja-subset renderer for chat templates (hyla_chat_template.h).
 *
 * Compile: the source is normalised as Jinja does (every line break becomes "\n", one trailing
 * newline is dropped), then parsed in one pass into a tree of statement and expression nodes;
 * whitespace control is applied to the text nodes while parsing (trim_blocks, lstrip_blocks and
 * `-`, as transformers configures Jinja). Render: the tree is walked with a stack of scopes
 * (globals, then one scope per for loop, as Jinja scopes `set`), values live in an arena freed
 * when the render ends, and the output grows in one buffer. Errors of either phase unwind with
 * longjmp to the public entry point, which turns them into a hyla_status and a message naming
 * the template line; nothing else is allocated outside the arenas, so nothing leaks.
 *
 * Semantics follow Python where templates lean on it: truthiness, `==` across int/float/bool,
 * negative indexes and slices (code points for strings), str.strip/split/startswith..., json
 * output as json.dumps(ensure_ascii=False). Upper/lower case only ASCII letters.
 *
 * Threading: a compiled template is read-only; each render has its own context. */
#include "hyla_chat_template.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyla_util.h"

/* ------------------------------------------------------------------------------------------ */
/* Arena                                                                                       */

typedef struct arena_blk {
    struct arena_blk *next;
    size_t used, cap;
    _Alignas(16) char data[];
} arena_blk;

typedef struct {
    arena_blk *head;
    jmp_buf *oom; /* where an allocation failure unwinds to */
} arena;

static void *ar_alloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->cap - a->head->used < n) {
        size_t cap = n > 60000 ? n : 60000;
        arena_blk *b = malloc(sizeof *b + cap);
        if (!b) {
            hyla_fail(HYLA_ERR_NOMEM, "chat template: out of memory");
            longjmp(*a->oom, 1);
        }
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void ar_free(arena *a) {
    arena_blk *b = a->head;
    while (b) {
        arena_blk *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Values                                                                                      */

typedef struct {
    const char *s;
    size_t n;
} str;

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_METHOD, V_FUNC } vtype;

typedef struct value value;
typedef struct vlist vlist;
typedef struct vdict vdict;

struct value {
    vtype t;
    union {
        int b;
        long long i;
        double f;
        str s;
        vlist *l;
        vdict *d;
        struct {
            value *self;
            const char *name;
        } m;
        const char *fn;
    } u;
};

struct vlist {
    value *items;
    size_t n, cap;
};

struct vdict {
    str *keys;
    value *vals;
    size_t n, cap;
};

static const value UNDEF = {.t = V_UNDEF};
static const value NONE = {.t = V_NONE};

static value v_bool(int b) { value v = {.t = V_BOOL}; v.u.b = !!b; return v; }
static value v_int(long long i) { value v = {.t = V_INT}; v.u.i = i; return v; }
static value v_float(double f) { value v = {.t = V_FLOAT}; v.u.f = f; return v; }
static value v_str(const char *s, size_t n) { value v = {.t = V_STR}; v.u.s.s = s; v.u.s.n = n; return v; }

static int str_eq(str a, const char *b) { return a.n == strlen(b) && !memcmp(a.s, b, a.n); }
static int str_eqs(str a, str b) { return a.n == b.n && (!a.n || !memcmp(a.s, b.s, a.n)); }

/* ------------------------------------------------------------------------------------------ */
/* Nodes                                                                                       */

enum {
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_BREAK, N_CONTINUE,
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_BIN, E_NOT, E_NEG, E_COND,
    E_LIST, E_DICT,
};

enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CAT, OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE,
       OP_GE, OP_IN, OP_NOTIN, OP_AND, OP_OR };

typedef struct node node;
typedef struct {
    node **v;
    size_t n, cap;
} nvec;

struct node {
    int kind, line;
    str s;       /* TEXT: text; NAME, ATTR, FILTER, TEST: the name; SET: the variable */
    str s2;      /* SET: the attribute of a namespace (ns.attr) */
    value lit;   /* LIT */
    int op;      /* BIN: OP_*; TEST: 1 = negated */
    node *a, *b; /* operands; IF: cond; FOR: iterable (a), filter (b); SET: value (a); COND: a if b else c */
    node *c;
    nvec kids;   /* IF/FOR: body; CALL/FILTER/TEST: positional args; LIST: items; DICT: keys; SLICE: 3 (NULL = none) */
    nvec kids2;  /* IF/FOR: else body; DICT: values; CALL/FILTER: keyword values */
    str *kw;     /* CALL/FILTER: keyword names [kids2.n] */
    str *names;  /* FOR: targets */
    size_t nnames;
};

struct hyla_chat_template {
    arena ar;
    jmp_buf jb;
    nvec body;
    json_t *specials;
};

/* ------------------------------------------------------------------------------------------ */
/* Parser                                                                                      */

typedef enum { T_EOF, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_END } ttype;

typedef struct {
    ttype t;
    str s;           /* NAME, OP: the text; STR: the unescaped value */
    long long i;
    double f;
    int strip;       /* END: `-` before the closing delimiter */
    size_t end_pos;  /* END: the position after the closing delimiter */
} token;

typedef struct {
    arena *ar;
    jmp_buf *jb;
    const char *src;
    size_t len, pos;
    int tag_kind;  /* inside {{ }} ('{') or {% %} ('%') */
    token tok;
    size_t tok_start;
    int strip_next;       /* the last tag ended with `-`: strip the next text's leading whitespace */
    int trim_next;        /* the last tag was a block: drop one leading newline of the next text */
} parser;

static int line_of(const char *src, size_t pos) {
    int l = 1;
    for (size_t i = 0; i < pos; i++)
        l += src[i] == '\n';
    return l;
}

__attribute__((noreturn, format(printf, 2, 3))) static void perr(parser *p, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    hyla_fail(HYLA_ERR_FORMAT, "chat template line %d: %s", line_of(p->src, p->tok_start), msg);
    longjmp(*p->jb, 1);
}

static void nv_push(arena *ar, nvec *v, node *n) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        node **nv = ar_alloc(ar, cap * sizeof *nv);
        if (v->n)
            memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = n;
}

static node *mk(parser *p, int kind) {
    node *n = ar_alloc(p->ar, sizeof *n);
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->line = line_of(p->src, p->tok_start);
    return n;
}

/* Python's str.isspace() for one code point. */
static int cp_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Decode the code point at s[i] (n bytes); *len: its byte length. Invalid bytes decode as
 * themselves, one byte each. */
static uint32_t cp_at(const char *s, size_t n, size_t i, size_t *len) {
    const unsigned char *u = (const unsigned char *)s + i;
    size_t left = n - i;
    if (u[0] < 0x80 || left < 2) { *len = 1; return u[0]; }
    if ((u[0] & 0xe0) == 0xc0 && (u[1] & 0xc0) == 0x80) { *len = 2; return ((uint32_t)(u[0] & 0x1f) << 6) | (u[1] & 0x3f); }
    if ((u[0] & 0xf0) == 0xe0 && left >= 3 && (u[1] & 0xc0) == 0x80 && (u[2] & 0xc0) == 0x80) {
        *len = 3;
        return ((uint32_t)(u[0] & 0x0f) << 12) | ((uint32_t)(u[1] & 0x3f) << 6) | (u[2] & 0x3f);
    }
    if ((u[0] & 0xf8) == 0xf0 && left >= 4 && (u[1] & 0xc0) == 0x80 && (u[2] & 0xc0) == 0x80 && (u[3] & 0xc0) == 0x80) {
        *len = 4;
        return ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3f) << 12) | ((uint32_t)(u[2] & 0x3f) << 6) |
               (u[3] & 0x3f);
    }
    *len = 1;
    return u[0];
}

/* The byte length of the whitespace that ends s[0..n) (code points, Python's definition). */
static size_t ws_tail(const char *s, size_t n) {
    size_t end = n;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xc0) == 0x80 && end - st < 4)
            st--;
        size_t l;
        uint32_t c = cp_at(s, end, st, &l);
        if (st + l != end || !cp_space(c))
            break;
        end = st;
    }
    return n - end;
}

static size_t ws_head(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t l;
        if (!cp_space(cp_at(s, n, i, &l)))
            break;
        i += l;
    }
    return i;
}

/* Jinja splits the source into lines (str.splitlines) and joins them with "\n": every line
 * break becomes "\n" and one trailing line break disappears. */
static char *normalize_source(arena *ar, const char *src, size_t *len_out) {
    size_t n = strlen(src);
    char *o = ar_alloc(ar, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)src[i];
        size_t br = 0;
        if (c == '\r') br = (i + 1 < n && src[i + 1] == '\n') ? 2 : 1;
        else if (c == '\n' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e) br = 1;
        else if (c == 0xc2 && i + 1 < n && (unsigned char)src[i + 1] == 0x85) br = 2;
        else if (c == 0xe2 && i + 2 < n && (unsigned char)src[i + 1] == 0x80 &&
                 ((unsigned char)src[i + 2] == 0xa8 || (unsigned char)src[i + 2] == 0xa9)) br = 3;
        if (br) {
            o[k++] = '\n';
            i += br;
        } else {
            o[k++] = src[i++];
        }
    }
    if (k > 0 && o[k - 1] == '\n')
        k--;
    o[k] = 0;
    *len_out = k;
    return o;
}

static int is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }

static void put_utf8(char *o, size_t *k, uint32_t c) {
    if (c < 0x80) o[(*k)++] = (char)c;
    else if (c < 0x800) { o[(*k)++] = (char)(0xc0 | (c >> 6)); o[(*k)++] = (char)(0x80 | (c & 0x3f)); }
    else if (c < 0x10000) {
        o[(*k)++] = (char)(0xe0 | (c >> 12)); o[(*k)++] = (char)(0x80 | ((c >> 6) & 0x3f));
        o[(*k)++] = (char)(0x80 | (c & 0x3f));
    } else {
        o[(*k)++] = (char)(0xf0 | (c >> 18)); o[(*k)++] = (char)(0x80 | ((c >> 12) & 0x3f));
        o[(*k)++] = (char)(0x80 | ((c >> 6) & 0x3f)); o[(*k)++] = (char)(0x80 | (c & 0x3f));
    }
}

/* The next token of the expression in the current tag. */
static void lex(parser *p) {
    const char *s = p->src;
    while (p->pos < p->len && (s[p->pos] == ' ' || s[p->pos] == '\t' || s[p->pos] == '\n'))
        p->pos++;
    p->tok_start = p->pos;
    token *t = &p->tok;
    memset(t, 0, sizeof *t);
    if (p->pos >= p->len) {
        t->t = T_EOF;
        return;
    }
    char close = p->tag_kind == '%' ? '%' : '}';
    const char *r = s + p->pos;
    size_t left = p->len - p->pos;
    if (left >= 3 && r[0] == '-' && r[1] == close && r[2] == '}') {
        t->t = T_END; t->strip = 1; t->end_pos = p->pos + 3; p->pos += 3; return;
    }
    if (left >= 2 && r[0] == close && r[1] == '}') {
        t->t = T_END; t->end_pos = p->pos + 2; p->pos += 2; return;
    }
    if (is_name_start(r[0])) {
        size_t i = 1;
        while (i < left && is_name_char(r[i]))
            i++;
        t->t = T_NAME; t->s.s = r; t->s.n = i; p->pos += i;
        return;
    }
    if (r[0] >= '0' && r[0] <= '9') {
        size_t i = 0;
        int fl = 0;
        while (i < left && ((r[i] >= '0' && r[i] <= '9') || r[i] == '_'))
            i++;
        if (i + 1 < left && r[i] == '.' && r[i + 1] >= '0' && r[i + 1] <= '9') {
            fl = 1;
            i++;
            while (i < left && r[i] >= '0' && r[i] <= '9')
                i++;
        }
        char buf[64];
        size_t k = 0;
        for (size_t j = 0; j < i && k < sizeof buf - 1; j++)
            if (r[j] != '_')
                buf[k++] = r[j];
        buf[k] = 0;
        if (fl) { t->t = T_FLOAT; t->f = strtod(buf, NULL); }
        else { t->t = T_INT; t->i = strtoll(buf, NULL, 10); }
        p->pos += i;
        return;
    }
    if (r[0] == '\'' || r[0] == '"') {
        char q = r[0];
        char *o = ar_alloc(p->ar, left + 1);
        size_t k = 0, i = 1;
        for (;;) {
            if (i >= left)
                perr(p, "unterminated string");
            char c = r[i];
            if (c == q) { i++; break; }
            if (c != '\\') { o[k++] = c; i++; continue; }
            if (i + 1 >= left)
                perr(p, "unterminated string");
            char e = r[i + 1];
            i += 2;
            switch (e) {
            case 'n': o[k++] = '\n'; break;
            case 't': o[k++] = '\t'; break;
            case 'r': o[k++] = '\r'; break;
            case '0': o[k++] = '\0'; break;
            case 'a': o[k++] = '\a'; break;
            case 'b': o[k++] = '\b'; break;
            case 'f': o[k++] = '\f'; break;
            case 'v': o[k++] = '\v'; break;
            case '\\': o[k++] = '\\'; break;
            case '\'': o[k++] = '\''; break;
            case '"': o[k++] = '"'; break;
            case '\n': break;
            case 'x': case 'u': case 'U': {
                size_t nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                if (i + nd > left)
                    perr(p, "truncated \\%c escape", e);
                char hex[9] = {0};
                memcpy(hex, r + i, nd);
                char *end;
                unsigned long cp = strtoul(hex, &end, 16);
                if (*end || cp > 0x10ffff)
                    perr(p, "bad \\%c escape", e);
                put_utf8(o, &k, (uint32_t)cp);
                i += nd;
                break;
            }
            default: o[k++] = '\\'; o[k++] = e; break;
            }
        }
        t->t = T_STR; t->s.s = o; t->s.n = k; p->pos += i;
        return;
    }
    static const char *two[] = {"==", "!=", "<=", ">=", "//", "**"};
    for (size_t j = 0; j < sizeof two / sizeof two[0]; j++)
        if (left >= 2 && r[0] == two[j][0] && r[1] == two[j][1]) {
            t->t = T_OP; t->s.s = r; t->s.n = 2; p->pos += 2;
            return;
        }
    if (strchr("()[]{}.,:|+-*/%~<>=", r[0])) {
        t->t = T_OP; t->s.s = r; t->s.n = 1; p->pos += 1;
        return;
    }
    perr(p, "unexpected character '%c'", r[0]);
}

static int is_op(parser *p, const char *op) { return p->tok.t == T_OP && str_eq(p->tok.s, op); }
static int is_kw(parser *p, const char *kw) { return p->tok.t == T_NAME && str_eq(p->tok.s, kw); }

static void expect_op(parser *p, const char *op) {
    if (!is_op(p, op))
        perr(p, "expected '%s'", op);
    lex(p);
}

static str expect_name(parser *p) {
    if (p->tok.t != T_NAME)
        perr(p, "expected a name");
    str s = p->tok.s;
    lex(p);
    return s;
}

static node *parse_expr(parser *p);
static node *parse_unary(parser *p, int with_filter);

/* name '=' ahead (a keyword argument)? Looks one token further without consuming. */
static int kwarg_ahead(parser *p) {
    if (p->tok.t != T_NAME)
        return 0;
    size_t save_pos = p->pos, save_start = p->tok_start;
    token save = p->tok;
    lex(p);
    int yes = is_op(p, "=");
    p->pos = save_pos;
    p->tok_start = save_start;
    p->tok = save;
    return yes;
}

/* '(' args ')' into n->kids (positional) and n->kw / n->kids2 (keywords). */
static void parse_args(parser *p, node *n) {
    expect_op(p, "(");
    str kws[32];
    nvec kv = {0};
    while (!is_op(p, ")")) {
        if (kwarg_ahead(p)) {
            if (kv.n >= 32)
                perr(p, "too many keyword arguments");
            kws[kv.n] = expect_name(p);
            expect_op(p, "=");
            nv_push(p->ar, &kv, parse_expr(p));
        } else {
            nv_push(p->ar, &n->kids, parse_expr(p));
        }
        if (!is_op(p, ","))
            break;
        lex(p);
    }
    expect_op(p, ")");
    n->kids2 = kv;
    if (kv.n) {
        n->kw = ar_alloc(p->ar, kv.n * sizeof *n->kw);
        memcpy(n->kw, kws, kv.n * sizeof *n->kw);
    }
}

static node *parse_primary(parser *p) {
    token t = p->tok;
    node *n;
    if (t.t == T_NAME) {
        n = mk(p, E_LIT);
        if (str_eq(t.s, "true") || str_eq(t.s, "True")) n->lit = v_bool(1);
        else if (str_eq(t.s, "false") || str_eq(t.s, "False")) n->lit = v_bool(0);
        else if (str_eq(t.s, "none") || str_eq(t.s, "None")) n->lit = NONE;
        else { n->kind = E_NAME; n->s = t.s; }
        lex(p);
        return n;
    }
    if (t.t == T_STR) {
        /* adjacent string literals concatenate */
        n = mk(p, E_LIT);
        str s = t.s;
        lex(p);
        while (p->tok.t == T_STR) {
            char *c = ar_alloc(p->ar, s.n + p->tok.s.n + 1);
            memcpy(c, s.s, s.n);
            memcpy(c + s.n, p->tok.s.s, p->tok.s.n);
            s.s = c;
            s.n += p->tok.s.n;
            lex(p);
        }
        n->lit = v_str(s.s, s.n);
        return n;
    }
    if (t.t == T_INT || t.t == T_FLOAT) {
        n = mk(p, E_LIT);
        n->lit = t.t == T_INT ? v_int(t.i) : v_float(t.f);
        lex(p);
        return n;
    }
    if (is_op(p, "(")) {
        lex(p);
        node *e = parse_expr(p);
        if (is_op(p, ",")) { /* a tuple: a list here */
            n = mk(p, E_LIST);
            nv_push(p->ar, &n->kids, e);
            while (is_op(p, ",")) {
                lex(p);
                if (is_op(p, ")"))
                    break;
                nv_push(p->ar, &n->kids, parse_expr(p));
            }
            e = n;
        }
        expect_op(p, ")");
        return e;
    }
    if (is_op(p, "[")) {
        n = mk(p, E_LIST);
        lex(p);
        while (!is_op(p, "]")) {
            nv_push(p->ar, &n->kids, parse_expr(p));
            if (!is_op(p, ","))
                break;
            lex(p);
        }
        expect_op(p, "]");
        return n;
    }
    if (is_op(p, "{")) {
        n = mk(p, E_DICT);
        lex(p);
        while (!is_op(p, "}")) {
            nv_push(p->ar, &n->kids, parse_expr(p));
            expect_op(p, ":");
            nv_push(p->ar, &n->kids2, parse_expr(p));
            if (!is_op(p, ","))
                break;
            lex(p);
        }
        expect_op(p, "}");
        return n;
    }
    if (t.t == T_END || t.t == T_EOF)
        perr(p, "expected an expression");
    perr(p, "unexpected '%.*s'", (int)t.s.n, t.s.s);
}

/* fn(args...): a call after a name, an item, a filter or a test, all parsed the same way. */
static node *parse_call(parser *p, node *fn) {
    node *c = mk(p, E_CALL);
    c->a = fn;
    parse_args(p, c);
    return c;
}

static node *parse_postfix(parser *p, node *n) {
    for (;;) {
        if (is_op(p, ".")) {
            lex(p);
            node *a = mk(p, E_ATTR);
            a->a = n;
            if (p->tok.t == T_INT) { /* x.0 is x[0] */
                a->kind = E_ITEM;
                a->b = mk(p, E_LIT);
                a->b->lit = v_int(p->tok.i);
                lex(p);
            } else {
                a->s = expect_name(p);
            }
            n = a;
        } else if (is_op(p, "[")) {
            lex(p);
            node *idx[3] = {NULL, NULL, NULL};
            int slice = 0;
            if (!is_op(p, ":"))
                idx[0] = parse_expr(p);
            if (is_op(p, ":")) {
                slice = 1;
                lex(p);
                if (!is_op(p, "]") && !is_op(p, ":"))
                    idx[1] = parse_expr(p);
                if (is_op(p, ":")) {
                    lex(p);
                    if (!is_op(p, "]"))
                        idx[2] = parse_expr(p);
                }
            }
            expect_op(p, "]");
            node *a = mk(p, slice ? E_SLICE : E_ITEM);
            a->a = n;
            if (slice)
                for (int i = 0; i < 3; i++)
                    nv_push(p->ar, &a->kids, idx[i]);
            else
                a->b = idx[0];
            n = a;
        } else if (is_op(p, "(")) {
            n = parse_call(p, n);
        } else {
            return n;
        }
    }
}

static node *parse_filter_expr(parser *p, node *n) {
    for (;;) {
        if (is_op(p, "|")) {
            lex(p);
            node *f = mk(p, E_FILTER);
            f->a = n;
            f->s = expect_name(p);
            if (is_op(p, "("))
                parse_args(p, f);
            n = f;
        } else if (is_kw(p, "is")) {
            lex(p);
            node *t = mk(p, E_TEST);
            t->a = n;
            if (is_kw(p, "not")) {
                t->op = 1;
                lex(p);
            }
            if (is_kw(p, "none") || is_kw(p, "true") || is_kw(p, "false")) {
                t->s = p->tok.s;
                lex(p);
            } else {
                t->s = expect_name(p);
            }
            if (is_op(p, "("))
                parse_args(p, t);
            n = t;
        } else if (is_op(p, "(")) {
            n = parse_call(p, n);
        } else {
            return n;
        }
    }
}

static node *parse_unary(parser *p, int with_filter) {
    node *n;
    if (is_op(p, "-")) {
        lex(p);
        n = mk(p, E_NEG);
        n->a = parse_unary(p, 0);
    } else if (is_op(p, "+")) {
        lex(p);
        n = parse_unary(p, 0);
    } else {
        n = parse_primary(p);
    }
    n = parse_postfix(p, n);
    if (with_filter)
        n = parse_filter_expr(p, n);
    return n;
}

static node *bin(parser *p, int op, node *a, node *b) {
    node *n = mk(p, E_BIN);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

/* One left-associative operator of a precedence level: its token (a keyword when kw) and op. */
typedef struct {
    const char *tok;
    int kw, op;
} infix_op;

/* next-level operands joined by any operator of ops (ended by a NULL tok), left to right: the
 * loop every plain binary level would otherwise repeat. */
static node *parse_binary(parser *p, const infix_op *ops, node *(*next)(parser *)) {
    node *n = next(p);
    for (;;) {
        const infix_op *b = ops;
        while (b->tok && !(b->kw ? is_kw(p, b->tok) : is_op(p, b->tok)))
            b++;
        if (!b->tok)
            return n;
        lex(p);
        n = bin(p, b->op, n, next(p));
    }
}

static node *parse_unary_filtered(parser *p) { return parse_unary(p, 1); }

static node *parse_pow(parser *p) {
    static const infix_op ops[] = {{"**", 0, OP_POW}, {NULL, 0, 0}};
    return parse_binary(p, ops, parse_unary_filtered);
}

static node *parse_math2(parser *p) {
    static const infix_op ops[] = {{"*", 0, OP_MUL}, {"/", 0, OP_DIV}, {"//", 0, OP_FLOORDIV}, {"%", 0, OP_MOD},
                                {NULL, 0, 0}};
    return parse_binary(p, ops, parse_pow);
}

static node *parse_concat(parser *p) {
    static const infix_op ops[] = {{"~", 0, OP_CAT}, {NULL, 0, 0}};
    return parse_binary(p, ops, parse_math2);
}

static node *parse_math1(parser *p) {
    static const infix_op ops[] = {{"+", 0, OP_ADD}, {"-", 0, OP_SUB}, {NULL, 0, 0}};
    return parse_binary(p, ops, parse_concat);
}

static node *parse_compare(parser *p) {
    node *n = parse_math1(p);
    for (;;) {
        int op = is_op(p, "==") ? OP_EQ : is_op(p, "!=") ? OP_NE : is_op(p, "<") ? OP_LT : is_op(p, ">") ? OP_GT
               : is_op(p, "<=") ? OP_LE : is_op(p, ">=") ? OP_GE : is_kw(p, "in") ? OP_IN : -1;
        if (op < 0 && is_kw(p, "not")) {
            size_t save_pos = p->pos, save_start = p->tok_start;
            token save = p->tok;
            lex(p);
            if (is_kw(p, "in")) {
                op = OP_NOTIN;
            } else {
                p->pos = save_pos;
                p->tok_start = save_start;
                p->tok = save;
                return n;
            }
        }
        if (op < 0)
            return n;
        lex(p);
        n = bin(p, op, n, parse_math1(p));
    }
}

static node *parse_not(parser *p) {
    if (is_kw(p, "not")) {
        lex(p);
        node *n = mk(p, E_NOT);
        n->a = parse_not(p);
        return n;
    }
    return parse_compare(p);
}

static node *parse_and(parser *p) {
    static const infix_op ops[] = {{"and", 1, OP_AND}, {NULL, 0, 0}};
    return parse_binary(p, ops, parse_not);
}

static node *parse_or(parser *p) {
    static const infix_op ops[] = {{"or", 1, OP_OR}, {NULL, 0, 0}};
    return parse_binary(p, ops, parse_and);
}

static node *parse_expr(parser *p) {
    node *n = parse_or(p);
    while (is_kw(p, "if")) {
        lex(p);
        node *c = mk(p, E_COND);
        c->a = n;
        c->b = parse_or(p);
        if (is_kw(p, "else")) {
            lex(p);
            c->c = parse_expr(p);
        }
        n = c;
    }
    return n;
}

/* The end of a tag: sets the whitespace flags for the text that follows. */
static void expect_end(parser *p) {
    if (p->tok.t != T_END)
        perr(p, "expected the end of the tag");
    p->pos = p->tok.end_pos;
    p->strip_next = p->tok.strip;
    p->trim_next = p->tag_kind == '%';
}

/* Enter a tag at p->pos ("{{" or "{%"); returns the first token's position. */
static void enter_tag(parser *p, int kind) {
    p->tag_kind = kind;
    p->pos += 2;
    if (p->pos < p->len && (p->src[p->pos] == '-' || p->src[p->pos] == '+'))
        p->pos++;
    lex(p);
}

/* The tag opening at `at` (its kind, whether it strips whitespace before it). */
static void tag_open_info(parser *p, size_t at, char *kind, int *minus, int *plus) {
    *kind = p->src[at + 1];
    *minus = at + 2 < p->len && p->src[at + 2] == '-';
    *plus = at + 2 < p->len && p->src[at + 2] == '+';
}

static size_t find_tag(parser *p, size_t from) {
    for (size_t i = from; i + 1 < p->len; i++)
        if (p->src[i] == '{' && (p->src[i + 1] == '{' || p->src[i + 1] == '%' || p->src[i + 1] == '#'))
            return i;
    return p->len;
}

static void add_text(parser *p, nvec *out, const char *s, size_t n) {
    if (!n)
        return;
    node *t = mk(p, N_TEXT);
    t->s.s = s;
    t->s.n = n;
    nv_push(p->ar, out, t);
}

static void parse_stmt_body(parser *p, nvec *out, const char *const *ends, str *which);

/* Text from p->pos to the next tag, with whitespace control; then the tag is left for the
 * caller at p->pos. Returns 0 at the end of the source. */
static int take_text(parser *p, nvec *out) {
    size_t start = p->pos, at = find_tag(p, start);
    const char *s = p->src + start;
    size_t n = at - start;
    if (p->strip_next) {
        size_t k = ws_head(s, n);
        s += k;
        n -= k;
    } else if (p->trim_next && n > 0 && s[0] == '\n') {
        s++;
        n--;
    }
    int line_start = start == 0 || p->src[start - 1] == '\n';
    if (s > p->src + start)
        line_start = s[-1] == '\n';
    p->strip_next = p->trim_next = 0;
    if (at < p->len) {
        char kind;
        int minus, plus;
        tag_open_info(p, at, &kind, &minus, &plus);
        if (minus) {
            n -= ws_tail(s, n);
        } else if ((kind == '%' || kind == '#') && !plus) {
            /* lstrip_blocks: spaces and tabs from the start of the line to a block tag */
            size_t l = n;
            while (l > 0 && (s[l - 1] == ' ' || s[l - 1] == '\t'))
                l--;
            if ((l > 0 && s[l - 1] == '\n') || (l == 0 && line_start))
                n = l;
        }
    }
    add_text(p, out, s, n);
    p->pos = at;
    return at < p->len;
}

static void skip_comment(parser *p) {
    const char *e = strstr(p->src + p->pos + 2, "#}");
    if (!e) {
        p->tok_start = p->pos;
        perr(p, "unterminated comment");
    }
    size_t endp = (size_t)(e - p->src);
    p->strip_next = endp > p->pos + 2 && e[-1] == '-';
    p->trim_next = 1;
    p->pos = endp + 2;
}

static int in_list(str s, const char *const *l) {
    for (; l && *l; l++)
        if (str_eq(s, *l))
            return 1;
    return 0;
}

static void parse_if(parser *p, nvec *out) {
    node *n = mk(p, N_IF);
    n->a = parse_expr(p);
    expect_end(p);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    str which;
    parse_stmt_body(p, &n->kids, ends, &which);
    nv_push(p->ar, out, n);
    if (str_eq(which, "elif")) {
        parse_if(p, &n->kids2);
    } else if (str_eq(which, "else")) {
        expect_end(p);
        static const char *const ends2[] = {"endif", NULL};
        parse_stmt_body(p, &n->kids2, ends2, &which);
        expect_end(p);
    } else {
        expect_end(p);
    }
}

static void parse_for(parser *p, nvec *out) {
    node *n = mk(p, N_FOR);
    str names[8];
    size_t k = 0;
    int paren = is_op(p, "(");
    if (paren)
        lex(p);
    do {
        if (k && is_op(p, ","))
            lex(p);
        if (k >= 8)
            perr(p, "too many loop targets");
        names[k++] = expect_name(p);
    } while (is_op(p, ","));
    if (paren)
        expect_op(p, ")");
    n->names = ar_alloc(p->ar, k * sizeof *names);
    memcpy(n->names, names, k * sizeof *names);
    n->nnames = k;
    if (!is_kw(p, "in"))
        perr(p, "expected 'in' in a for tag");
    lex(p);
    n->a = parse_or(p); /* not parse_expr: a trailing `if` is the loop filter */
    if (is_kw(p, "if")) {
        lex(p);
        n->b = parse_expr(p);
    }
    if (is_kw(p, "recursive"))
        perr(p, "recursive loops are not supported");
    expect_end(p);
    static const char *const ends[] = {"else", "endfor", NULL};
    str which;
    parse_stmt_body(p, &n->kids, ends, &which);
    if (str_eq(which, "else")) {
        expect_end(p);
        static const char *const ends2[] = {"endfor", NULL};
        parse_stmt_body(p, &n->kids2, ends2, &which);
    }
    expect_end(p);
    nv_push(p->ar, out, n);
}

/* Statements until a block tag whose keyword is in ends (NULL: the end of the source). The
 * tag's keyword goes to *which and the parser stands after it. */
static void parse_stmt_body(parser *p, nvec *out, const char *const *ends, str *which) {
    for (;;) {
        if (!take_text(p, out)) {
            if (ends) {
                const char *const *last = ends;
                while (last[1])
                    last++;
                p->tok_start = p->len;
                perr(p, "missing {%% %s %%}", *last);
            }
            return;
        }
        char kind = p->src[p->pos + 1];
        if (kind == '#') {
            skip_comment(p);
            continue;
        }
        if (kind == '{') {
            enter_tag(p, '{');
            node *n = mk(p, N_OUT);
            n->a = parse_expr(p);
            expect_end(p);
            p->trim_next = 0;
            nv_push(p->ar, out, n);
            continue;
        }
        enter_tag(p, '%');
        if (p->tok.t != T_NAME)
            perr(p, "expected a statement name");
        str kw = p->tok.s;
        if (in_list(kw, ends)) {
            *which = kw;
            lex(p);
            return;
        }
        lex(p);
        if (str_eq(kw, "if")) {
            parse_if(p, out);
        } else if (str_eq(kw, "for")) {
            parse_for(p, out);
        } else if (str_eq(kw, "set")) {
            node *n = mk(p, N_SET);
            n->s = expect_name(p);
            if (is_op(p, ".")) {
                lex(p);
                n->s2 = expect_name(p);
            }
            if (!is_op(p, "="))
                perr(p, "block {%% set %%} is not supported; use {%% set x = ... %%}");
            lex(p);
            n->a = parse_expr(p);
            expect_end(p);
            nv_push(p->ar, out, n);
        } else if (str_eq(kw, "break") || str_eq(kw, "continue")) {
            nv_push(p->ar, out, mk(p, str_eq(kw, "break") ? N_BREAK : N_CONTINUE));
            expect_end(p);
        } else if (str_eq(kw, "generation") || str_eq(kw, "endgeneration")) {
            /* transformers' assistant-mask markers: no output of their own */
            expect_end(p);
        } else {
            perr(p, "unsupported statement '%.*s'", (int)kw.n, kw.s);
        }
    }
}

hyla_status hyla_chat_template_create(const char *source, const json_t *specials, hyla_chat_template **out) {
    *out = NULL;
    if (!source)
        return hyla_fail(HYLA_ERR_INVALID_ARG, "chat template: no source");
    if (specials && !json_is_object(specials))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "chat template: specials must be a JSON object");
    hyla_chat_template *t = calloc(1, sizeof *t);
    if (!t)
        return hyla_fail(HYLA_ERR_NOMEM, "chat template: out of memory");
    t->ar.oom = &t->jb;
    parser p;
    memset(&p, 0, sizeof p);
    p.ar = &t->ar;
    p.jb = &t->jb;
    if (setjmp(t->jb)) {
        hyla_chat_template_free(t);
        hyla_status s = strstr(hyla_last_error(), "out of memory") ? HYLA_ERR_NOMEM : HYLA_ERR_FORMAT;
        return s;
    }
    p.src = normalize_source(&t->ar, source, &p.len);
    parse_stmt_body(&p, &t->body, NULL, NULL);
    t->specials = specials ? json_deep_copy(specials) : json_object();
    if (!t->specials) {
        hyla_chat_template_free(t);
        return hyla_fail(HYLA_ERR_NOMEM, "chat template: out of memory");
    }
    *out = t;
    return HYLA_OK;
}

void hyla_chat_template_free(hyla_chat_template *t) {
    if (!t)
        return;
    ar_free(&t->ar);
    json_decref(t->specials);
    free(t);
}

const char *hyla_chat_template_special(const hyla_chat_template *t, const char *name) {
    return t ? json_string_value(json_object_get(t->specials, name)) : NULL;
}

hyla_status hyla_chat_template_load(const char *path, hyla_chat_template **out) {
    *out = NULL;
    uint8_t *buf = NULL;
    size_t len = 0;
    hyla_status st = hyla_read_file(path, &buf, &len);
    if (st != HYLA_OK)
        return st; /* the message names the path */
    char *text = realloc(buf, len + 1);
    if (!text) {
        free(buf);
        return hyla_fail(HYLA_ERR_NOMEM, "chat template %s: out of memory", path);
    }
    text[len] = 0;
    json_error_t jerr;
    /* integers as reals: tokenizer configs carry model_max_length values beyond int64 */
    json_t *cfg = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &jerr);
    size_t lead = 0;
    while (lead < len && (text[lead] == ' ' || text[lead] == '\t' || text[lead] == '\n' || text[lead] == '\r'))
        lead++;
    if (!cfg && lead < len && text[lead] == '{' && (lead + 1 >= len || (text[lead + 1] != '{' && text[lead + 1] != '%'
                                                                         && text[lead + 1] != '#'))) {
        free(text);
        return hyla_fail(HYLA_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", path, jerr.text, jerr.line);
    }
    if (!json_is_object(cfg)) { /* not a tokenizer_config.json: the template itself */
        json_decref(cfg);
        st = hyla_chat_template_create(text, NULL, out);
        free(text);
        return st == HYLA_OK ? st : hyla_fail_wrap(st, "%s", path);
    }
    free(text);
    json_t *tpl = json_object_get(cfg, "chat_template");
    const char *src = json_string_value(tpl);
    if (json_is_array(tpl)) { /* [{"name": "default", "template": "..."}, ...] */
        size_t i;
        json_t *e;
        json_array_foreach(tpl, i, e) {
            if (!strcmp(json_string_value(json_object_get(e, "name")) ?: "", "default"))
                src = json_string_value(json_object_get(e, "template"));
        }
    }
    if (!src) {
        json_decref(cfg);
        return hyla_fail(HYLA_ERR_NOT_FOUND, "%s has no chat_template", path);
    }
    json_t *specials = json_object();
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                        "sep_token", "cls_token", "mask_token"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        json_t *v = json_object_get(cfg, names[i]);
        if (json_is_object(v))
            v = json_object_get(v, "content");
        if (json_is_string(v))
            json_object_set(specials, names[i], v);
    }
    st = hyla_chat_template_create(src, specials, out);
    json_decref(specials);
    json_decref(cfg);
    return st == HYLA_OK ? st : hyla_fail_wrap(st, "%s", path);
}

/* ------------------------------------------------------------------------------------------ */
/* Render                                                                                      */

typedef struct {
    arena ar;
    jmp_buf jb;
    char *out;
    size_t n, cap;
    vdict **scopes;
    size_t nscopes, capscopes;
    int brk, cont;
    int line;
} rctx;

__attribute__((noreturn, format(printf, 2, 3))) static void rerr(rctx *c, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    hyla_fail(HYLA_ERR_INVALID_ARG, "chat template line %d: %s", c->line, msg);
    longjmp(c->jb, 1);
}

static void emit(rctx *c, const char *s, size_t n) {
    if (c->n + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 1024;
        while (cap < c->n + n + 1)
            cap *= 2;
        char *o = realloc(c->out, cap);
        if (!o) {
            hyla_fail(HYLA_ERR_NOMEM, "chat template: out of memory");
            longjmp(c->jb, 1);
        }
        c->out = o;
        c->cap = cap;
    }
    memcpy(c->out + c->n, s, n);
    c->n += n;
}

/* A growable byte string in the arena. */
typedef struct {
    rctx *c;
    char *s;
    size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *o = ar_alloc(&b->c->ar, cap);
        if (b->n)
            memcpy(o, b->s, b->n);
        b->s = o;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static vlist *new_list(rctx *c, size_t cap) {
    vlist *l = ar_alloc(&c->ar, sizeof *l);
    l->n = 0;
    l->cap = cap ? cap : 4;
    l->items = ar_alloc(&c->ar, l->cap * sizeof *l->items);
    return l;
}

static void list_push(rctx *c, vlist *l, value v) {
    if (l->n == l->cap) {
        value *o = ar_alloc(&c->ar, 2 * l->cap * sizeof *o);
        memcpy(o, l->items, l->n * sizeof *o);
        l->items = o;
        l->cap *= 2;
    }
    l->items[l->n++] = v;
}

static vdict *new_dict(rctx *c) {
    vdict *d = ar_alloc(&c->ar, sizeof *d);
    memset(d, 0, sizeof *d);
    return d;
}

static value *dict_find(vdict *d, str k) {
    for (size_t i = 0; i < d->n; i++)
        if (str_eqs(d->keys[i], k))
            return &d->vals[i];
    return NULL;
}

static void dict_set(rctx *c, vdict *d, str k, value v) {
    value *e = dict_find(d, k);
    if (e) {
        *e = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        str *nk = ar_alloc(&c->ar, cap * sizeof *nk);
        value *nv = ar_alloc(&c->ar, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->keys, d->n * sizeof *nk);
            memcpy(nv, d->vals, d->n * sizeof *nv);
        }
        d->keys = nk;
        d->vals = nv;
        d->cap = cap;
    }
    d->keys[d->n] = k;
    d->vals[d->n++] = v;
}

static void dict_setc(rctx *c, vdict *d, const char *k, value v) {
    str s = {k, strlen(k)};
    dict_set(c, d, s, v);
}

static value v_list(vlist *l) { value v = {.t = V_LIST}; v.u.l = l; return v; }
static value v_dict(vdict *d) { value v = {.t = V_DICT}; v.u.d = d; return v; }

static value from_json(rctx *c, const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        vdict *d = new_dict(c);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            size_t kn = strlen(k);
            char *kc = ar_alloc(&c->ar, kn + 1);
            memcpy(kc, k, kn + 1);
            dict_set(c, d, (str){kc, kn}, from_json(c, v));
        }
        return v_dict(d);
    }
    case JSON_ARRAY: {
        vlist *l = new_list(c, json_array_size(j));
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) list_push(c, l, from_json(c, v));
        return v_list(l);
    }
    case JSON_STRING: return v_str(json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return v_int(json_integer_value(j));
    case JSON_REAL: return v_float(json_real_value(j));
    case JSON_TRUE: return v_bool(1);
    case JSON_FALSE: return v_bool(0);
    default: return NONE;
    }
}

static const char *type_name(value v) {
    static const char *const n[] = {"undefined", "none", "bool", "int", "float", "str", "list", "dict", "method",
                                    "function"};
    return n[v.t];
}

static int truthy(value v) {
    switch (v.t) {
    case V_UNDEF: case V_NONE: return 0;
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0;
    case V_STR: return v.u.s.n > 0;
    case V_LIST: return v.u.l->n > 0;
    case V_DICT: return v.u.d->n > 0;
    default: return 1;
    }
}

static int is_num(value v) { return v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL; }
static double num(value v) { return v.t == V_FLOAT ? v.u.f : v.t == V_INT ? (double)v.u.i : v.u.b; }
static long long inum(value v) { return v.t == V_INT ? v.u.i : v.t == V_BOOL ? v.u.b : (long long)v.u.f; }

static int equal(value a, value b) {
    if (is_num(a) && is_num(b))
        return num(a) == num(b);
    if (a.t != b.t)
        return 0;
    switch (a.t) {
    case V_UNDEF: case V_NONE: return 1;
    case V_STR: return str_eqs(a.u.s, b.u.s);
    case V_LIST:
        if (a.u.l->n != b.u.l->n)
            return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!equal(a.u.l->items[i], b.u.l->items[i]))
                return 0;
        return 1;
    case V_DICT:
        if (a.u.d->n != b.u.d->n)
            return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            value *o = dict_find(b.u.d, a.u.d->keys[i]);
            if (!o || !equal(a.u.d->vals[i], *o))
                return 0;
        }
        return 1;
    default: return a.u.d == b.u.d;
    }
}

/* Python's repr of a float: the shortest form that reads back, with ".0" for integers. */
static void fmt_float(char *buf, size_t cap, double f) {
    if (isnan(f)) { snprintf(buf, cap, "nan"); return; }
    if (isinf(f)) { snprintf(buf, cap, f > 0 ? "inf" : "-inf"); return; }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, f);
        if (strtod(buf, NULL) == f)
            break;
    }
    if (!strpbrk(buf, ".eni"))
        strncat(buf, ".0", cap - strlen(buf) - 1);
}

static void json_quote(sbuf *b, str s) {
    sb_add(b, "\"", 1);
    for (size_t i = 0; i < s.n; i++) {
        unsigned char ch = (unsigned char)s.s[i];
        char esc[8];
        switch (ch) {
        case '"': sb_add(b, "\\\"", 2); break;
        case '\\': sb_add(b, "\\\\", 2); break;
        case '\n': sb_add(b, "\\n", 2); break;
        case '\r': sb_add(b, "\\r", 2); break;
        case '\t': sb_add(b, "\\t", 2); break;
        case '\b': sb_add(b, "\\b", 2); break;
        case '\f': sb_add(b, "\\f", 2); break;
        default:
            if (ch < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", ch);
                sb_add(b, esc, 6);
            } else {
                sb_add(b, (const char *)&ch, 1);
            }
        }
    }
    sb_add(b, "\"", 1);
}

static void indent_to(sbuf *b, int indent, int level) {
    sb_add(b, "\n", 1);
    for (int i = 0; i < indent * level; i++)
        sb_add(b, " ", 1);
}

/* json.dumps(v, ensure_ascii=False, indent=indent (< 0: none)). */
/* Before item i of a list or dict at this level: the separator, then the newline and indent
 * when indenting (Python's json.dumps layout for both). */
static void json_item_start(sbuf *b, size_t i, int indent, int level) {
    if (i)
        sb_str(b, indent >= 0 ? "," : ", ");
    if (indent >= 0)
        indent_to(b, indent, level + 1);
}

static void to_json(rctx *c, sbuf *b, value v, int indent, int level) {
    char num_buf[64];
    switch (v.t) {
    case V_UNDEF: case V_NONE: sb_str(b, "null"); break;
    case V_BOOL: sb_str(b, v.u.b ? "true" : "false"); break;
    case V_INT: snprintf(num_buf, sizeof num_buf, "%lld", v.u.i); sb_str(b, num_buf); break;
    case V_FLOAT:
        fmt_float(num_buf, sizeof num_buf, v.u.f);
        sb_str(b, !strcmp(num_buf, "nan") ? "NaN" : !strcmp(num_buf, "inf") ? "Infinity"
                  : !strcmp(num_buf, "-inf") ? "-Infinity" : num_buf);
        break;
    case V_STR: json_quote(b, v.u.s); break;
    case V_LIST:
        if (!v.u.l->n) { sb_str(b, "[]"); break; }
        sb_str(b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            json_item_start(b, i, indent, level);
            to_json(c, b, v.u.l->items[i], indent, level + 1);
        }
        if (indent >= 0)
            indent_to(b, indent, level);
        sb_str(b, "]");
        break;
    case V_DICT:
        if (!v.u.d->n) { sb_str(b, "{}"); break; }
        sb_str(b, "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            json_item_start(b, i, indent, level);
            json_quote(b, v.u.d->keys[i]);
            sb_str(b, ": ");
            to_json(c, b, v.u.d->vals[i], indent, level + 1);
        }
        if (indent >= 0)
            indent_to(b, indent, level);
        sb_str(b, "}");
        break;
    default: rerr(c, "tojson: cannot serialise a %s", type_name(v));
    }
}

static void py_repr(rctx *c, sbuf *b, value v);

/* str(v) as Python prints it; undefined prints as "". */
static void to_text(rctx *c, sbuf *b, value v) {
    char num_buf[64];
    switch (v.t) {
    case V_UNDEF: break;
    case V_NONE: sb_str(b, "None"); break;
    case V_BOOL: sb_str(b, v.u.b ? "True" : "False"); break;
    case V_INT: snprintf(num_buf, sizeof num_buf, "%lld", v.u.i); sb_str(b, num_buf); break;
    case V_FLOAT: fmt_float(num_buf, sizeof num_buf, v.u.f); sb_str(b, num_buf); break;
    case V_STR: sb_add(b, v.u.s.s, v.u.s.n); break;
    default: py_repr(c, b, v); break;
    }
}

static void py_repr(rctx *c, sbuf *b, value v) {
    switch (v.t) {
    case V_STR: {
        int dq = memchr(v.u.s.s, '\'', v.u.s.n) && !memchr(v.u.s.s, '"', v.u.s.n);
        sb_add(b, dq ? "\"" : "'", 1);
        for (size_t i = 0; i < v.u.s.n; i++) {
            char ch = v.u.s.s[i];
            if (ch == '\\') sb_str(b, "\\\\");
            else if (ch == '\n') sb_str(b, "\\n");
            else if (ch == '\t') sb_str(b, "\\t");
            else if (ch == '\r') sb_str(b, "\\r");
            else if (ch == '\'' && !dq) sb_str(b, "\\'");
            else sb_add(b, &ch, 1);
        }
        sb_add(b, dq ? "\"" : "'", 1);
        break;
    }
    case V_LIST:
        sb_str(b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                sb_str(b, ", ");
            py_repr(c, b, v.u.l->items[i]);
        }
        sb_str(b, "]");
        break;
    case V_DICT:
        sb_str(b, "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                sb_str(b, ", ");
            py_repr(c, b, v_str(v.u.d->keys[i].s, v.u.d->keys[i].n));
            sb_str(b, ": ");
            py_repr(c, b, v.u.d->vals[i]);
        }
        sb_str(b, "}");
        break;
    case V_METHOD: case V_FUNC: sb_str(b, "<function>"); break;
    default: to_text(c, b, v); break;
    }
}

static str text_of(rctx *c, value v) {
    if (v.t == V_STR)
        return v.u.s;
    sbuf b = {.c = c};
    to_text(c, &b, v);
    return (str){b.s ? b.s : "", b.n};
}

/* The items of l as text with sep between: str.join and the join filter give the same string. */
static value join_text(rctx *c, const vlist *l, str sep) {
    sbuf o = {.c = c};
    for (size_t i = 0; i < l->n; i++) {
        if (i)
            sb_add(&o, sep.s, sep.n);
        str t = text_of(c, l->items[i]);
        sb_add(&o, t.s, t.n);
    }
    return v_str(o.s ? o.s : "", o.n);
}

/* Code-point offsets of s: offs[i] = byte offset of code point i, offs[n] = s.n. */
static size_t *cp_offsets(rctx *c, str s, size_t *ncp) {
    size_t *offs = ar_alloc(&c->ar, (s.n + 1) * sizeof *offs);
    size_t k = 0;
    for (size_t i = 0; i < s.n;) {
        size_t l;
        cp_at(s.s, s.n, i, &l);
        offs[k++] = i;
        i += l;
    }
    offs[k] = s.n;
    *ncp = k;
    return offs;
}

/* Python's slice indices for a sequence of length n. */
static size_t slice_idx(long long n, value start, value stop, value step, long long *idx) {
    long long st = step.t == V_NONE || step.t == V_UNDEF ? 1 : inum(step);
    long long lo, hi;
    if (st > 0) {
        lo = start.t == V_NONE || start.t == V_UNDEF ? 0 : inum(start);
        hi = stop.t == V_NONE || stop.t == V_UNDEF ? n : inum(stop);
        if (lo < 0) lo += n;
        if (hi < 0) hi += n;
        if (lo < 0) lo = 0;
        if (hi > n) hi = n;
        size_t k = 0;
        for (long long i = lo; i < hi; i += st)
            idx[k++] = i;
        return k;
    }
    lo = start.t == V_NONE || start.t == V_UNDEF ? n - 1 : inum(start);
    hi = stop.t == V_NONE || stop.t == V_UNDEF ? -1 : inum(stop);
    if (start.t != V_NONE && start.t != V_UNDEF && lo < 0) lo += n;
    if (stop.t != V_NONE && stop.t != V_UNDEF && hi < 0) hi += n;
    if (lo > n - 1) lo = n - 1;
    if (hi < -1) hi = -1;
    size_t k = 0;
    for (long long i = lo; i > hi; i += st)
        idx[k++] = i;
    return k;
}

static value getitem(rctx *c, value obj, value key) {
    if (obj.t == V_DICT) {
        if (key.t != V_STR)
            return UNDEF;
        value *v = dict_find(obj.u.d, key.u.s);
        return v ? *v : UNDEF;
    }
    if (obj.t == V_LIST || obj.t == V_STR) {
        if (!is_num(key) || key.t == V_FLOAT)
            return UNDEF;
        long long i = inum(key);
        if (obj.t == V_LIST) {
            long long n = (long long)obj.u.l->n;
            if (i < 0) i += n;
            return i >= 0 && i < n ? obj.u.l->items[i] : UNDEF;
        }
        size_t ncp;
        size_t *offs = cp_offsets(c, obj.u.s, &ncp);
        if (i < 0) i += (long long)ncp;
        if (i < 0 || i >= (long long)ncp)
            return UNDEF;
        return v_str(obj.u.s.s + offs[i], offs[i + 1] - offs[i]);
    }
    return UNDEF;
}

static value getattr(rctx *c, value obj, str name) {
    if (obj.t == V_DICT) {
        value *v = dict_find(obj.u.d, name);
        if (v)
            return *v;
    }
    static const char *const str_methods[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split",
                                              "upper", "lower", "replace", "join", "find", NULL};
    static const char *const dict_methods[] = {"get", "items", "keys", "values", NULL};
    if ((obj.t == V_STR && in_list(name, str_methods)) || (obj.t == V_DICT && in_list(name, dict_methods))) {
        value m = {.t = V_METHOD};
        m.u.m.self = ar_alloc(&c->ar, sizeof(value));
        *m.u.m.self = obj;
        char *nm = ar_alloc(&c->ar, name.n + 1);
        memcpy(nm, name.s, name.n);
        nm[name.n] = 0;
        m.u.m.name = nm;
        return m;
    }
    return UNDEF;
}

static int in_chars(uint32_t cp, const uint32_t *set, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (set[i] == cp)
            return 1;
    return 0;
}

/* str.strip / lstrip / rstrip (which: 3, 1, 2) with chars (NULL: whitespace). */
static value py_strip(rctx *c, str s, const str *chars, int which) {
    size_t ncp, nset = 0;
    size_t *offs = cp_offsets(c, s, &ncp);
    uint32_t *set = NULL;
    if (chars) {
        set = ar_alloc(&c->ar, (chars->n + 1) * sizeof *set);
        for (size_t i = 0; i < chars->n;) {
            size_t l;
            set[nset++] = cp_at(chars->s, chars->n, i, &l);
            i += l;
        }
    }
    size_t lo = 0, hi = ncp, l;
    while ((which & 1) && lo < hi) {
        uint32_t cp = cp_at(s.s, s.n, offs[lo], &l);
        if (chars ? !in_chars(cp, set, nset) : !cp_space(cp))
            break;
        lo++;
    }
    while ((which & 2) && hi > lo) {
        uint32_t cp = cp_at(s.s, s.n, offs[hi - 1], &l);
        if (chars ? !in_chars(cp, set, nset) : !cp_space(cp))
            break;
        hi--;
    }
    return v_str(s.s + offs[lo], offs[hi] - offs[lo]);
}

static const char *memfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (!nn)
        return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (!memcmp(h + i, n, nn))
            return h + i;
    return NULL;
}

static value py_split(rctx *c, str s, const str *sep, long long maxsplit) {
    vlist *l = new_list(c, 4);
    if (sep) {
        if (!sep->n)
            rerr(c, "split: empty separator");
        const char *p = s.s, *end = s.s + s.n;
        for (;;) {
            const char *f = maxsplit == 0 ? NULL : memfind(p, (size_t)(end - p), sep->s, sep->n);
            if (!f) {
                list_push(c, l, v_str(p, (size_t)(end - p)));
                break;
            }
            list_push(c, l, v_str(p, (size_t)(f - p)));
            p = f + sep->n;
            if (maxsplit > 0)
                maxsplit--;
        }
        return v_list(l);
    }
    size_t i = 0, len;
    for (;;) {
        while (i < s.n && cp_space(cp_at(s.s, s.n, i, &len)))
            i += len;
        if (i >= s.n)
            break;
        size_t st = i;
        if (maxsplit == 0) {
            size_t e = s.n - ws_tail(s.s + st, s.n - st);
            list_push(c, l, v_str(s.s + st, e - st));
            break;
        }
        while (i < s.n && !cp_space(cp_at(s.s, s.n, i, &len)))
            i += len;
        list_push(c, l, v_str(s.s + st, i - st));
        if (maxsplit > 0)
            maxsplit--;
    }
    return v_list(l);
}

static value ascii_case(rctx *c, str s, int upper) {
    char *o = ar_alloc(&c->ar, s.n + 1);
    for (size_t i = 0; i < s.n; i++) {
        char ch = s.s[i];
        if (upper && ch >= 'a' && ch <= 'z') ch = (char)(ch - 32);
        if (!upper && ch >= 'A' && ch <= 'Z') ch = (char)(ch + 32);
        o[i] = ch;
    }
    return v_str(o, s.n);
}

static value eval(rctx *c, const node *n);

static value arg(rctx *c, const node *n, size_t i, const char *kw, value dflt) {
    if (i < n->kids.n)
        return eval(c, n->kids.v[i]);
    for (size_t k = 0; kw && k < n->kids2.n; k++)
        if (str_eq(n->kw[k], kw))
            return eval(c, n->kids2.v[k]);
    return dflt;
}

static str need_str(rctx *c, value v, const char *what) {
    if (v.t != V_STR)
        rerr(c, "%s wants a string, got %s", what, type_name(v));
    return v.u.s;
}

static value call_method(rctx *c, value self, const char *m, const node *n) {
    if (self.t == V_STR) {
        str s = self.u.s;
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            value a = arg(c, n, 0, NULL, UNDEF);
            vlist one = {&a, 1, 1};
            vlist *opts = a.t == V_LIST ? a.u.l : &one;
            for (size_t i = 0; i < opts->n; i++) {
                str p = need_str(c, opts->items[i], m);
                if (p.n <= s.n && !memcmp(m[0] == 's' ? s.s : s.s + s.n - p.n, p.s, p.n))
                    return v_bool(1);
            }
            return v_bool(0);
        }
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
            value a = arg(c, n, 0, NULL, NONE);
            str chars = a.t == V_STR ? a.u.s : (str){0};
            return py_strip(c, s, a.t == V_STR ? &chars : NULL, m[0] == 's' ? 3 : m[0] == 'l' ? 1 : 2);
        }
        if (!strcmp(m, "split")) {
            value a = arg(c, n, 0, "sep", NONE), mx = arg(c, n, 1, "maxsplit", v_int(-1));
            str sep = a.t == V_STR ? a.u.s : (str){0};
            return py_split(c, s, a.t == V_STR ? &sep : NULL, inum(mx));
        }
        if (!strcmp(m, "upper") || !strcmp(m, "lower"))
            return ascii_case(c, s, m[0] == 'u');
        if (!strcmp(m, "replace")) {
            str a = need_str(c, arg(c, n, 0, NULL, UNDEF), "replace"), b = need_str(c, arg(c, n, 1, NULL, UNDEF), "replace");
            long long cnt = inum(arg(c, n, 2, "count", v_int(-1)));
            if (!a.n)
                rerr(c, "replace: empty pattern");
            sbuf o = {.c = c};
            const char *p = s.s, *end = s.s + s.n;
            for (;;) {
                const char *f = cnt == 0 ? NULL : memfind(p, (size_t)(end - p), a.s, a.n);
                if (!f)
                    break;
                sb_add(&o, p, (size_t)(f - p));
                sb_add(&o, b.s, b.n);
                p = f + a.n;
                if (cnt > 0)
                    cnt--;
            }
            sb_add(&o, p, (size_t)(end - p));
            return v_str(o.s ? o.s : "", o.n);
        }
        if (!strcmp(m, "join")) {
            value it = arg(c, n, 0, NULL, UNDEF);
            if (it.t != V_LIST)
                rerr(c, "join wants a list");
            return join_text(c, it.u.l, s);
        }
        if (!strcmp(m, "find")) {
            str a = need_str(c, arg(c, n, 0, NULL, UNDEF), "find");
            const char *f = memfind(s.s, s.n, a.s, a.n);
            if (!f)
                return v_int(-1);
            size_t ncp;
            cp_offsets(c, (str){s.s, (size_t)(f - s.s)}, &ncp);
            return v_int((long long)ncp);
        }
    } else if (self.t == V_DICT) {
        vdict *d = self.u.d;
        if (!strcmp(m, "get")) {
            value k = arg(c, n, 0, NULL, UNDEF);
            value *v = k.t == V_STR ? dict_find(d, k.u.s) : NULL;
            return v ? *v : arg(c, n, 1, NULL, NONE);
        }
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            vlist *l = new_list(c, d->n);
            for (size_t i = 0; i < d->n; i++) {
                value k = v_str(d->keys[i].s, d->keys[i].n);
                if (m[0] == 'k') {
                    list_push(c, l, k);
                } else if (m[0] == 'v') {
                    list_push(c, l, d->vals[i]);
                } else {
                    vlist *pair = new_list(c, 2);
                    list_push(c, pair, k);
                    list_push(c, pair, d->vals[i]);
                    list_push(c, l, v_list(pair));
                }
            }
            return v_list(l);
        }
    }
    rerr(c, "%s has no method '%s'", type_name(self), m);
}

static value call(rctx *c, const node *n) {
    if (n->a->kind == E_NAME) {
        str f = n->a->s;
        if (str_eq(f, "namespace")) {
            vdict *d = new_dict(c);
            if (n->kids.n == 1) {
                value init = eval(c, n->kids.v[0]);
                if (init.t == V_DICT)
                    for (size_t i = 0; i < init.u.d->n; i++)
                        dict_set(c, d, init.u.d->keys[i], init.u.d->vals[i]);
            }
            for (size_t i = 0; i < n->kids2.n; i++)
                dict_set(c, d, n->kw[i], eval(c, n->kids2.v[i]));
            return v_dict(d);
        }
        if (str_eq(f, "raise_exception")) {
            str m = text_of(c, arg(c, n, 0, NULL, v_str("", 0)));
            rerr(c, "%.*s", (int)m.n, m.s);
        }
        if (str_eq(f, "range")) {
            long long a = inum(arg(c, n, 0, NULL, v_int(0))), b = 0, st = 1;
            if (n->kids.n >= 2) { b = inum(arg(c, n, 1, NULL, v_int(0))); } else { b = a; a = 0; }
            if (n->kids.n >= 3) st = inum(arg(c, n, 2, NULL, v_int(1)));
            if (!st)
                rerr(c, "range: step 0");
            vlist *l = new_list(c, 4);
            for (long long i = a; st > 0 ? i < b : i > b; i += st) {
                if (l->n > 100000)
                    rerr(c, "range: too long");
                list_push(c, l, v_int(i));
            }
            return v_list(l);
        }
    }
    value f = eval(c, n->a);
    if (f.t == V_METHOD)
        return call_method(c, *f.u.m.self, f.u.m.name, n);
    rerr(c, "%s is not callable", type_name(f));
}

static long long length_of(rctx *c, value v) {
    if (v.t == V_STR) {
        size_t ncp;
        cp_offsets(c, v.u.s, &ncp);
        return (long long)ncp;
    }
    if (v.t == V_LIST) return (long long)v.u.l->n;
    if (v.t == V_DICT) return (long long)v.u.d->n;
    rerr(c, "length of a %s", type_name(v));
}

static value filter(rctx *c, const node *n) {
    value v = eval(c, n->a);
    str f = n->s;
    if (str_eq(f, "trim")) {
        value ch = arg(c, n, 0, "chars", NONE);
        str chars = ch.t == V_STR ? ch.u.s : (str){0};
        return py_strip(c, text_of(c, v), ch.t == V_STR ? &chars : NULL, 3);
    }
    if (str_eq(f, "length") || str_eq(f, "count"))
        return v_int(length_of(c, v));
    if (str_eq(f, "tojson")) {
        value ind = arg(c, n, 0, "indent", NONE);
        sbuf b = {.c = c};
        to_json(c, &b, v, ind.t == V_INT ? (int)ind.u.i : -1, 0);
        return v_str(b.s ? b.s : "", b.n);
    }
    if (str_eq(f, "string")) {
        str s = text_of(c, v);
        return v_str(s.s, s.n);
    }
    if (str_eq(f, "upper") || str_eq(f, "lower"))
        return ascii_case(c, text_of(c, v), f.s[0] == 'u');
    if (str_eq(f, "first") || str_eq(f, "last")) {
        if (v.t == V_LIST)
            return v.u.l->n ? v.u.l->items[f.s[0] == 'f' ? 0 : v.u.l->n - 1] : UNDEF;
        return getitem(c, v, v_int(f.s[0] == 'f' ? 0 : -1));
    }
    if (str_eq(f, "join")) {
        value sep = arg(c, n, 0, "d", v_str("", 0));
        if (v.t != V_LIST)
            rerr(c, "join of a %s", type_name(v));
        return join_text(c, v.u.l, text_of(c, sep));
    }
    if (str_eq(f, "default") || str_eq(f, "d")) {
        value dv = arg(c, n, 0, "default_value", v_str("", 0));
        int boolean = truthy(arg(c, n, 1, "boolean", v_bool(0)));
        return (v.t == V_UNDEF || (boolean && !truthy(v))) ? dv : v;
    }
    if (str_eq(f, "reverse") || str_eq(f, "list")) {
        if (v.t == V_LIST) {
            vlist *l = new_list(c, v.u.l->n);
            for (size_t i = 0; i < v.u.l->n; i++)
                list_push(c, l, v.u.l->items[f.s[0] == 'r' ? v.u.l->n - 1 - i : i]);
            return v_list(l);
        }
        if (v.t == V_STR && f.s[0] == 'r') {
            size_t ncp;
            size_t *offs = cp_offsets(c, v.u.s, &ncp);
            char *o = ar_alloc(&c->ar, v.u.s.n + 1);
            size_t k = 0;
            for (size_t i = ncp; i > 0; i--) {
                memcpy(o + k, v.u.s.s + offs[i - 1], offs[i] - offs[i - 1]);
                k += offs[i] - offs[i - 1];
            }
            return v_str(o, k);
        }
        rerr(c, "%.*s of a %s", (int)f.n, f.s, type_name(v));
    }
    if (str_eq(f, "int"))
        return v.t == V_STR ? v_int(strtoll(v.u.s.s, NULL, 10)) : v_int(inum(v));
    if (str_eq(f, "abs"))
        return v.t == V_FLOAT ? v_float(fabs(v.u.f)) : v_int(llabs(inum(v)));
    if (str_eq(f, "items")) {
        if (v.t != V_DICT)
            rerr(c, "items of a %s", type_name(v));
        return call_method(c, v, "items", n);
    }
    rerr(c, "unknown filter '%.*s'", (int)f.n, f.s);
}

static int test(rctx *c, const node *n) {
    value v = eval(c, n->a);
    str t = n->s;
    if (str_eq(t, "defined")) return v.t != V_UNDEF;
    if (str_eq(t, "undefined")) return v.t == V_UNDEF;
    if (str_eq(t, "none")) return v.t == V_NONE;
    if (str_eq(t, "string")) return v.t == V_STR;
    if (str_eq(t, "number")) return v.t == V_INT || v.t == V_FLOAT;
    if (str_eq(t, "integer")) return v.t == V_INT;
    if (str_eq(t, "float")) return v.t == V_FLOAT;
    if (str_eq(t, "boolean")) return v.t == V_BOOL;
    if (str_eq(t, "true")) return v.t == V_BOOL && v.u.b;
    if (str_eq(t, "false")) return v.t == V_BOOL && !v.u.b;
    if (str_eq(t, "mapping")) return v.t == V_DICT;
    if (str_eq(t, "sequence")) return v.t == V_LIST || v.t == V_STR || v.t == V_DICT;
    if (str_eq(t, "iterable")) return v.t == V_LIST || v.t == V_STR || v.t == V_DICT;
    if (str_eq(t, "callable")) return v.t == V_METHOD || v.t == V_FUNC;
    if (str_eq(t, "even") || str_eq(t, "odd")) return (int)(llabs(inum(v)) % 2) == (t.s[0] == 'o');
    if (str_eq(t, "eq") || str_eq(t, "equalto") || str_eq(t, "sameas")) return equal(v, arg(c, n, 0, NULL, UNDEF));
    if (str_eq(t, "ne")) return !equal(v, arg(c, n, 0, NULL, UNDEF));
    rerr(c, "unknown test '%.*s'", (int)t.n, t.s);
}

static int contains(rctx *c, value hay, value needle) {
    if (hay.t == V_STR) {
        str s = need_str(c, needle, "'in' on a string");
        return memfind(hay.u.s.s, hay.u.s.n, s.s, s.n) != NULL;
    }
    if (hay.t == V_LIST) {
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (equal(hay.u.l->items[i], needle))
                return 1;
        return 0;
    }
    if (hay.t == V_DICT)
        return needle.t == V_STR && dict_find(hay.u.d, needle.u.s) != NULL;
    rerr(c, "'in' on a %s", type_name(hay));
}

static int compare(rctx *c, value a, value b) {
    if (is_num(a) && is_num(b)) {
        double x = num(a), y = num(b);
        return x < y ? -1 : x > y;
    }
    if (a.t == V_STR && b.t == V_STR) {
        size_t m = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int r = m ? memcmp(a.u.s.s, b.u.s.s, m) : 0;
        return r ? r : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    rerr(c, "cannot order %s and %s", type_name(a), type_name(b));
}

static value binop(rctx *c, const node *n) {
    if (n->op == OP_AND) {
        value a = eval(c, n->a);
        return truthy(a) ? eval(c, n->b) : a;
    }
    if (n->op == OP_OR) {
        value a = eval(c, n->a);
        return truthy(a) ? a : eval(c, n->b);
    }
    value a = eval(c, n->a), b = eval(c, n->b);
    switch (n->op) {
    case OP_EQ: return v_bool(equal(a, b));
    case OP_NE: return v_bool(!equal(a, b));
    case OP_LT: return v_bool(compare(c, a, b) < 0);
    case OP_GT: return v_bool(compare(c, a, b) > 0);
    case OP_LE: return v_bool(compare(c, a, b) <= 0);
    case OP_GE: return v_bool(compare(c, a, b) >= 0);
    case OP_IN: return v_bool(contains(c, b, a));
    case OP_NOTIN: return v_bool(!contains(c, b, a));
    case OP_CAT: {
        str x = text_of(c, a), y = text_of(c, b);
        char *o = ar_alloc(&c->ar, x.n + y.n + 1);
        memcpy(o, x.s, x.n);
        memcpy(o + x.n, y.s, y.n);
        return v_str(o, x.n + y.n);
    }
    default: break;
    }
    if (n->op == OP_ADD && a.t == V_STR && b.t == V_STR) {
        char *o = ar_alloc(&c->ar, a.u.s.n + b.u.s.n + 1);
        memcpy(o, a.u.s.s, a.u.s.n);
        memcpy(o + a.u.s.n, b.u.s.s, b.u.s.n);
        return v_str(o, a.u.s.n + b.u.s.n);
    }
    if (n->op == OP_ADD && a.t == V_LIST && b.t == V_LIST) {
        vlist *l = new_list(c, a.u.l->n + b.u.l->n);
        for (size_t i = 0; i < a.u.l->n; i++) list_push(c, l, a.u.l->items[i]);
        for (size_t i = 0; i < b.u.l->n; i++) list_push(c, l, b.u.l->items[i]);
        return v_list(l);
    }
    if (n->op == OP_MUL && a.t == V_STR && (b.t == V_INT)) {
        sbuf o = {.c = c};
        for (long long i = 0; i < b.u.i; i++)
            sb_add(&o, a.u.s.s, a.u.s.n);
        return v_str(o.s ? o.s : "", o.n);
    }
    if (!is_num(a) || !is_num(b))
        rerr(c, "unsupported operand types %s and %s", type_name(a), type_name(b));
    int fl = a.t == V_FLOAT || b.t == V_FLOAT;
    long long x = inum(a), y = inum(b);
    switch (n->op) {
    case OP_ADD: return fl ? v_float(num(a) + num(b)) : v_int(x + y);
    case OP_SUB: return fl ? v_float(num(a) - num(b)) : v_int(x - y);
    case OP_MUL: return fl ? v_float(num(a) * num(b)) : v_int(x * y);
    case OP_DIV:
        if (num(b) == 0) rerr(c, "division by zero");
        return v_float(num(a) / num(b));
    case OP_FLOORDIV:
    case OP_MOD:
        if (num(b) == 0) rerr(c, "division by zero");
        if (fl) {
            double q = floor(num(a) / num(b));
            return n->op == OP_FLOORDIV ? v_float(q) : v_float(num(a) - q * num(b));
        } else {
            long long q = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0))) q--;
            return n->op == OP_FLOORDIV ? v_int(q) : v_int(x - q * y);
        }
    case OP_POW: return fl || y < 0 ? v_float(pow(num(a), num(b))) : v_int((long long)llround(pow((double)x, (double)y)));
    default: rerr(c, "bad operator");
    }
}

static value lookup(rctx *c, str name) {
    for (size_t i = c->nscopes; i > 0; i--) {
        value *v = dict_find(c->scopes[i - 1], name);
        if (v)
            return *v;
    }
    return UNDEF;
}

static value eval(rctx *c, const node *n) {
    c->line = n->line;
    switch (n->kind) {
    case E_LIT: return n->lit;
    case E_NAME: return lookup(c, n->s);
    case E_ATTR: return getattr(c, eval(c, n->a), n->s);
    case E_ITEM: {
        value obj = eval(c, n->a), key = eval(c, n->b);
        value v = getitem(c, obj, key);
        if (v.t == V_UNDEF && key.t == V_STR && obj.t != V_DICT)
            return getattr(c, obj, key.u.s);
        return v;
    }
    case E_SLICE: {
        value obj = eval(c, n->a);
        value idx[3];
        for (int i = 0; i < 3; i++)
            idx[i] = n->kids.v[i] ? eval(c, n->kids.v[i]) : NONE;
        if (idx[2].t != V_NONE && inum(idx[2]) == 0)
            rerr(c, "slice step cannot be zero");
        if (obj.t == V_LIST) {
            long long *ix = ar_alloc(&c->ar, (obj.u.l->n + 1) * sizeof *ix);
            size_t k = slice_idx((long long)obj.u.l->n, idx[0], idx[1], idx[2], ix);
            vlist *l = new_list(c, k);
            for (size_t i = 0; i < k; i++)
                list_push(c, l, obj.u.l->items[ix[i]]);
            return v_list(l);
        }
        if (obj.t == V_STR) {
            size_t ncp;
            size_t *offs = cp_offsets(c, obj.u.s, &ncp);
            long long *ix = ar_alloc(&c->ar, (ncp + 1) * sizeof *ix);
            size_t k = slice_idx((long long)ncp, idx[0], idx[1], idx[2], ix);
            sbuf o = {.c = c};
            for (size_t i = 0; i < k; i++)
                sb_add(&o, obj.u.s.s + offs[ix[i]], offs[ix[i] + 1] - offs[ix[i]]);
            return v_str(o.s ? o.s : "", o.n);
        }
        rerr(c, "cannot slice a %s", type_name(obj));
    }
    case E_CALL: return call(c, n);
    case E_FILTER: return filter(c, n);
    case E_TEST: { int r = test(c, n); return v_bool(n->op ? !r : r); }
    case E_BIN: return binop(c, n);
    case E_NOT: return v_bool(!truthy(eval(c, n->a)));
    case E_NEG: {
        value v = eval(c, n->a);
        if (!is_num(v))
            rerr(c, "cannot negate a %s", type_name(v));
        return v.t == V_FLOAT ? v_float(-v.u.f) : v_int(-inum(v));
    }
    case E_COND:
        if (truthy(eval(c, n->b)))
            return eval(c, n->a);
        return n->c ? eval(c, n->c) : UNDEF;
    case E_LIST: {
        vlist *l = new_list(c, n->kids.n);
        for (size_t i = 0; i < n->kids.n; i++)
            list_push(c, l, eval(c, n->kids.v[i]));
        return v_list(l);
    }
    case E_DICT: {
        vdict *d = new_dict(c);
        for (size_t i = 0; i < n->kids.n; i++) {
            value k = eval(c, n->kids.v[i]);
            str ks = text_of(c, k);
            dict_set(c, d, ks, eval(c, n->kids2.v[i]));
        }
        return v_dict(d);
    }
    default: rerr(c, "internal: node %d is not an expression", n->kind);
    }
}

static void push_scope(rctx *c) {
    if (c->nscopes == c->capscopes) {
        size_t cap = c->capscopes ? c->capscopes * 2 : 8;
        vdict **s = ar_alloc(&c->ar, cap * sizeof *s);
        if (c->nscopes)
            memcpy(s, c->scopes, c->nscopes * sizeof *s);
        c->scopes = s;
        c->capscopes = cap;
    }
    c->scopes[c->nscopes++] = new_dict(c);
}

static void exec_body(rctx *c, const nvec *body);

static void exec_for(rctx *c, const node *n) {
    value it = eval(c, n->a);
    vlist *items;
    if (it.t == V_LIST) {
        items = it.u.l;
    } else if (it.t == V_DICT) {
        items = new_list(c, it.u.d->n);
        for (size_t i = 0; i < it.u.d->n; i++)
            list_push(c, items, v_str(it.u.d->keys[i].s, it.u.d->keys[i].n));
    } else if (it.t == V_STR) {
        items = new_list(c, 4);
        size_t ncp;
        size_t *offs = cp_offsets(c, it.u.s, &ncp);
        for (size_t i = 0; i < ncp; i++)
            list_push(c, items, v_str(it.u.s.s + offs[i], offs[i + 1] - offs[i]));
    } else if (it.t == V_UNDEF || it.t == V_NONE) {
        if (it.t == V_NONE)
            rerr(c, "cannot iterate over none");
        items = new_list(c, 1);
    } else {
        rerr(c, "cannot iterate over a %s", type_name(it));
    }
    push_scope(c);
    vdict *scope = c->scopes[c->nscopes - 1];
    if (n->b) { /* the loop filter runs first; loop.* counts what passes */
        vlist *kept = new_list(c, items->n);
        for (size_t i = 0; i < items->n; i++) {
            value x = items->items[i];
            if (n->nnames == 1) {
                dict_set(c, scope, n->names[0], x);
            } else {
                for (size_t k = 0; k < n->nnames; k++)
                    dict_set(c, scope, n->names[k], getitem(c, x, v_int((long long)k)));
            }
            if (truthy(eval(c, n->b)))
                list_push(c, kept, x);
        }
        items = kept;
    }
    size_t len = items->n;
    for (size_t i = 0; i < len; i++) {
        value x = items->items[i];
        if (n->nnames == 1) {
            dict_set(c, scope, n->names[0], x);
        } else {
            if (x.t != V_LIST || x.u.l->n != n->nnames)
                rerr(c, "cannot unpack a %s into %zu names", type_name(x), n->nnames);
            for (size_t k = 0; k < n->nnames; k++)
                dict_set(c, scope, n->names[k], x.u.l->items[k]);
        }
        vdict *loop = new_dict(c);
        dict_setc(c, loop, "index0", v_int((long long)i));
        dict_setc(c, loop, "index", v_int((long long)i + 1));
        dict_setc(c, loop, "revindex0", v_int((long long)(len - 1 - i)));
        dict_setc(c, loop, "revindex", v_int((long long)(len - i)));
        dict_setc(c, loop, "first", v_bool(i == 0));
        dict_setc(c, loop, "last", v_bool(i + 1 == len));
        dict_setc(c, loop, "length", v_int((long long)len));
        dict_setc(c, loop, "previtem", i > 0 ? items->items[i - 1] : UNDEF);
        dict_setc(c, loop, "nextitem", i + 1 < len ? items->items[i + 1] : UNDEF);
        dict_setc(c, scope, "loop", v_dict(loop));
        exec_body(c, &n->kids);
        c->cont = 0;
        if (c->brk) {
            c->brk = 0;
            break;
        }
    }
    c->nscopes--;
    if (len == 0)
        exec_body(c, &n->kids2);
}

static void exec_body(rctx *c, const nvec *body) {
    for (size_t i = 0; i < body->n && !c->brk && !c->cont; i++) {
        const node *n = body->v[i];
        c->line = n->line;
        switch (n->kind) {
        case N_TEXT: emit(c, n->s.s, n->s.n); break;
        case N_OUT: {
            value v = eval(c, n->a);
            if (v.t == V_STR) {
                emit(c, v.u.s.s, v.u.s.n);
            } else {
                str s = text_of(c, v);
                emit(c, s.s, s.n);
            }
            break;
        }
        case N_IF: exec_body(c, truthy(eval(c, n->a)) ? &n->kids : &n->kids2); break;
        case N_FOR: exec_for(c, n); break;
        case N_SET: {
            value v = eval(c, n->a);
            if (n->s2.n) {
                value ns = lookup(c, n->s);
                if (ns.t != V_DICT)
                    rerr(c, "cannot set an attribute of %.*s (a %s)", (int)n->s.n, n->s.s, type_name(ns));
                dict_set(c, ns.u.d, n->s2, v);
            } else {
                dict_set(c, c->scopes[c->nscopes - 1], n->s, v);
            }
            break;
        }
        case N_BREAK: c->brk = 1; break;
        case N_CONTINUE: c->cont = 1; break;
        default: rerr(c, "internal: node %d is not a statement", n->kind);
        }
    }
}

hyla_status hyla_chat_template_render(const hyla_chat_template *t, const json_t *messages, int add_generation_prompt,
                                      const json_t *extra, char **out) {
    *out = NULL;
    if (!json_is_array(messages))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "chat template: messages must be a JSON array");
    if (extra && !json_is_object(extra))
        return hyla_fail(HYLA_ERR_INVALID_ARG, "chat template: extra variables must be a JSON object");
    rctx c;
    memset(&c, 0, sizeof c);
    c.ar.oom = &c.jb;
    if (setjmp(c.jb)) {
        free(c.out);
        ar_free(&c.ar);
        return strstr(hyla_last_error(), "out of memory") ? HYLA_ERR_NOMEM : HYLA_ERR_INVALID_ARG;
    }
    push_scope(&c);
    vdict *g = c.scopes[0];
    const char *k;
    json_t *v;
    json_object_foreach(t->specials, k, v) dict_setc(&c, g, k, from_json(&c, v));
    if (extra)
        json_object_foreach((json_t *)extra, k, v) dict_setc(&c, g, k, from_json(&c, v));
    dict_setc(&c, g, "messages", from_json(&c, messages));
    dict_setc(&c, g, "add_generation_prompt", v_bool(add_generation_prompt));
    if (!dict_find(g, (str){"tools", 5}))
        dict_setc(&c, g, "tools", NONE);
    if (!dict_find(g, (str){"documents", 9}))
        dict_setc(&c, g, "documents", NONE);
    push_scope(&c); /* the template's own top-level sets */
    exec_body(&c, &t->body);
    emit(&c, "", 0);
    c.out[c.n] = 0;
    ar_free(&c.ar);
    *out = c.out;
    return HYLA_OK;
}
