/* One pass over a trace_view.json array: every event into Arrow-layout column buffers.
 *
 * Why native: DuckDB decodes the file fast, but every table is then a query over a materialised
 * copy of all events, sorted under a memory cap that makes it spill (docs/benchmarks/ingest.md).
 * This scanner reads the bytes once, keeps only what the tables need, and hands Python
 * ready-made Arrow buffers; polars does the rest (trace_native.py).
 *
 * Scope: a well-formed JSON array of objects, fed in blocks. Anything else (truncation, a
 * malformed event, invalid UTF-8) raises ValueError with the byte offset, and the caller falls
 * back to the DuckDB reader, which owns the salvage of damaged files. The parse loop touches no
 * Python object, so it runs without the GIL and several scanners can share the cores.
 *
 * Per event: `ph`, `name`, `pid`, `tid`, `cat`, `id` as text (strings unescaped, numbers as
 * written), `ts` as exact int64 ns from its decimal digits (never through a double), `dur` as a
 * double, `args` as minified JSON text, and the members of `args` whose keys the caller names,
 * as text. For events whose `ph` is "C", one counter row per member of `args` (event row, key,
 * value as a double or null).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEYS 64

/* ------------------------------------------------------------------ growable buffers */

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->p, (size_t)cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (buf_grow(b, n) < 0) return -1;
    memcpy(b->p + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

static void buf_free(Buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* Arrow layouts: a validity bitmap, then int32 offsets + bytes, or fixed-width values. */
typedef struct {
    Buf valid, offsets, data;
    Py_ssize_t nulls;
} Column;

static int valid_push(Column *c, Py_ssize_t row, int ok) {
    if (row % 8 == 0) {
        if (buf_grow(&c->valid, 1) < 0) return -1;
        c->valid.p[c->valid.len++] = 0;
    }
    if (ok)
        c->valid.p[row / 8] |= (char)(1 << (row % 8));
    else
        c->nulls++;
    return 0;
}

static int offset_push(Column *c) {
    if (c->data.len > INT32_MAX) return -1; /* the caller's blocks keep a batch far below */
    int32_t off = (int32_t)c->data.len;
    return buf_put(&c->offsets, &off, sizeof off);
}

static void column_reset(Column *c) {
    c->valid.len = c->offsets.len = c->data.len = 0;
    c->nulls = 0;
}

static void column_free(Column *c) {
    buf_free(&c->valid);
    buf_free(&c->offsets);
    buf_free(&c->data);
}

/* ------------------------------------------------------------------ JSON values */

enum { ABSENT = 0, STRING, NUMBER, LITERAL, JNULL, COMPOUND };

typedef struct {
    const char *s; /* a string's content (without quotes), else the value's text */
    Py_ssize_t n;
    int kind;
    int escaped; /* a string holding backslash escapes */
} Span;

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

/* Parse status: a pointer past the value, NULL at the end of the block (incomplete), or
 * BAD on malformed JSON. */
static const char BAD_MARK;
#define BAD (&BAD_MARK)

/* The first byte at or after p that ends a run of plain string bytes: a quote, a backslash or
 * a control character (end if none). Eight bytes a step: strings (call stacks) are most of a
 * trace. */
static const char *string_stop(const char *p, const char *end) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    while (end - p >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint64_t quote = w ^ (ones * '"'), backslash = w ^ (ones * '\\');
        uint64_t hits = ((quote - ones) & ~quote) | ((backslash - ones) & ~backslash) |
                        (w - ones * 0x20);
        if ((hits & ~w & highs) != 0) break;
        p += 8;
    }
    while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) p++;
    return p;
}

/* p at the opening quote. */
static const char *scan_string(const char *p, const char *end, Span *out) {
    const char *q = p + 1;
    int escaped = 0;
    for (;;) {
        const char *hit = string_stop(q, end);
        if (hit >= end) return NULL;
        if (*hit == '"') {
            if (out) {
                out->s = p + 1;
                out->n = hit - (p + 1);
                out->kind = STRING;
                out->escaped = escaped;
            }
            return hit + 1;
        }
        if (*hit == '\\') {
            escaped = 1;
            if (hit + 1 >= end) return NULL;
            q = hit + 2;
            continue;
        }
        return BAD; /* a raw control character */
    }
}

static int is_number_char(char c) {
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

/* Any value; compound values are skipped with their nesting tracked. */
static const char *scan_value(const char *p, const char *end, Span *out) {
    if (p >= end) return NULL;
    char c = *p;
    if (c == '"') return scan_string(p, end, out);
    if (c == '{' || c == '[') {
        int depth = 0;
        const char *q = p;
        while (q < end) {
            char d = *q;
            if (d == '"') {
                q = scan_string(q, end, NULL);
                if (q == NULL || q == BAD) return q;
                continue;
            }
            if (d == '{' || d == '[') depth++;
            else if (d == '}' || d == ']') {
                if (--depth == 0) {
                    if (out) {
                        out->s = p;
                        out->n = q + 1 - p;
                        out->kind = COMPOUND;
                        out->escaped = 0;
                    }
                    return q + 1;
                }
            }
            q++;
        }
        return NULL;
    }
    const char *q = p;
    int kind;
    if (c == '-' || (c >= '0' && c <= '9')) {
        while (q < end && is_number_char(*q)) q++;
        kind = NUMBER;
    } else if (c == 't' || c == 'f' || c == 'n') {
        const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
        Py_ssize_t len = (Py_ssize_t)strlen(word);
        if (end - p < len) return NULL;
        if (memcmp(p, word, (size_t)len) != 0) return BAD;
        q = p + len;
        kind = c == 'n' ? JNULL : LITERAL;
    } else {
        return BAD;
    }
    if (q >= end) return NULL; /* a number may go on in the next block */
    if (out) {
        out->s = p;
        out->n = q - p;
        out->kind = kind;
        out->escaped = 0;
    }
    return q;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* A string's content with its escapes decoded, as UTF-8. Returns -1 on a bad escape. */
static int put_unescaped(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_grow(b, n) < 0) return -1; /* decoding never lengthens */
    char *o = b->p + b->len;
    const char *end = s + n;
    while (s < end) {
        if (*s != '\\') {
            *o++ = *s++;
            continue;
        }
        if (s + 1 >= end) return -1;
        char e = s[1];
        s += 2;
        switch (e) {
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; break;
            case '/': *o++ = '/'; break;
            case 'b': *o++ = '\b'; break;
            case 'f': *o++ = '\f'; break;
            case 'n': *o++ = '\n'; break;
            case 'r': *o++ = '\r'; break;
            case 't': *o++ = '\t'; break;
            case 'u': {
                unsigned cp;
                if (end - s < 4 || hex4(s, &cp) < 0) return -1;
                s += 4;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned lo;
                    if (end - s < 6 || s[0] != '\\' || s[1] != 'u' || hex4(s + 2, &lo) < 0 ||
                        lo < 0xDC00 || lo > 0xDFFF)
                        return -1;
                    s += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    return -1;
                }
                /* \uXXXX is 6 bytes for at most 3 of UTF-8; a pair is 12 for 4. */
                if (cp < 0x80) {
                    *o++ = (char)cp;
                } else if (cp < 0x800) {
                    *o++ = (char)(0xC0 | (cp >> 6));
                    *o++ = (char)(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                    *o++ = (char)(0xE0 | (cp >> 12));
                    *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                    *o++ = (char)(0x80 | (cp & 0x3F));
                } else {
                    *o++ = (char)(0xF0 | (cp >> 18));
                    *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
                    *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
                    *o++ = (char)(0x80 | (cp & 0x3F));
                }
                break;
            }
            default:
                return -1;
        }
    }
    b->len = o - b->p;
    return 0;
}

/* JSON text without insignificant whitespace (the form DuckDB's reader writes too). The text
 * was scanned already, so its strings are known to be closed. */
static int put_minified(Buf *b, const char *s, Py_ssize_t n) {
    if (buf_grow(b, n) < 0) return -1;
    char *o = b->p + b->len;
    const char *end = s + n;
    while (s < end) {
        char c = *s++;
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
        *o++ = c;
        if (c != '"') continue;
        for (;;) { /* copy the string through its closing quote */
            const char *stop = string_stop(s, end);
            memcpy(o, s, (size_t)(stop - s));
            o += stop - s;
            s = stop;
            if (s >= end) break;
            *o++ = *s++;
            if (s[-1] == '"') break;
            if (s[-1] == '\\' && s < end) *o++ = *s++;
        }
    }
    b->len = o - b->p;
    return 0;
}

/* A value as text: strings decoded, anything else as written (compound values minified). */
static int text_push(Column *c, Py_ssize_t row, const Span *v) {
    if (c->offsets.len == 0 && offset_push(c) < 0) return -1; /* a batch's first offset: 0 */
    int ok = v->kind != ABSENT && v->kind != JNULL;
    if (valid_push(c, row, ok) < 0) return -1;
    if (ok) {
        int rc = v->kind == STRING && v->escaped ? put_unescaped(&c->data, v->s, v->n)
                 : v->kind == COMPOUND           ? put_minified(&c->data, v->s, v->n)
                                                 : buf_put(&c->data, v->s, v->n);
        if (rc < 0) return -1;
    }
    return offset_push(c);
}

/* ------------------------------------------------------------------ numbers */

/* µs text -> exact ns, as timeutil.us_to_ns: digits past the ns rounded half up; tabs, spaces
 * and quotes around it ignored; exponents through a double. Returns 0 when not a number. */
static int us_to_ns(const char *s, Py_ssize_t n, int64_t *out) {
    while (n > 0 && (*s == '\t' || *s == ' ' || *s == '"')) s++, n--;
    while (n > 0 && (s[n - 1] == '\t' || s[n - 1] == ' ' || s[n - 1] == '"')) n--;
    if (n <= 0 || n > 60) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] == 'e' || s[i] == 'E') {
            char tmp[64];
            memcpy(tmp, s, (size_t)n);
            tmp[n] = 0;
            char *stop;
            double v = strtod(tmp, &stop);
            if (stop != tmp + n || v != v || v * 1000 > 9.2e18 || v * 1000 < -9.2e18) return 0;
            double r = v * 1000;
            *out = (int64_t)(r < 0 ? r - 0.5 : r + 0.5);
            return 1;
        }
    }
    int negative = 0;
    if (*s == '-' || *s == '+') negative = *s == '-', s++, n--;
    const char *end = s + n;
    uint64_t whole = 0;
    int digits = 0;
    while (s < end && *s >= '0' && *s <= '9') {
        if (whole > (UINT64_MAX - 9) / 10) return 0;
        whole = whole * 10 + (uint64_t)(*s++ - '0');
        digits++;
    }
    int frac4 = 0, fdigits = 0;
    if (s < end && *s == '.') {
        s++;
        while (s < end && *s >= '0' && *s <= '9') {
            if (fdigits < 4) frac4 = frac4 * 10 + (*s - '0');
            fdigits++;
            s++;
        }
    }
    if (s != end || (digits == 0 && fdigits == 0)) return 0;
    for (int i = fdigits; i < 4; i++) frac4 *= 10;
    if (whole > (uint64_t)(INT64_MAX / 1000) - 1) return 0;
    int64_t ns = (int64_t)whole * 1000 + (frac4 + 5) / 10;
    *out = negative ? -ns : ns;
    return 1;
}

/* A number's text (or a string holding one) as a double. Returns 0 when it is not one. */
static int to_double(const char *s, Py_ssize_t n, double *out) {
    char tmp[64];
    while (n > 0 && (*s == ' ' || *s == '\t')) s++, n--;
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
    if (n <= 0 || n >= (Py_ssize_t)sizeof tmp) return 0;
    memcpy(tmp, s, (size_t)n);
    tmp[n] = 0;
    char *stop;
    *out = strtod(tmp, &stop);
    return stop == tmp + n;
}

/* An integer's text (or a string of one) as int64: 1 when it is one, 0 when absent or null,
 * -1 when it is something else. */
static int to_int(const Span *v, int64_t *out) {
    if (v->kind == ABSENT || v->kind == JNULL) return 0;
    if ((v->kind != NUMBER && v->kind != STRING) || v->escaped || v->n == 0 || v->n > 19)
        return -1;
    const char *p = v->s, *end = v->s + v->n;
    int negative = *p == '-';
    if (negative && ++p == end) return -1;
    int64_t value = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9') return -1;
        value = value * 10 + (*p - '0');
    }
    *out = negative ? -value : value;
    return 1;
}

static int double_push(Column *c, Py_ssize_t row, const Span *v) {
    double d = 0;
    int ok = (v->kind == NUMBER || (v->kind == STRING && !v->escaped)) && to_double(v->s, v->n, &d);
    if (valid_push(c, row, ok) < 0) return -1;
    return buf_put(&c->data, &d, sizeof d);
}

/* ------------------------------------------------------------------ UTF-8 */

/* Returns the offset of the first invalid byte, or -1. ASCII runs are checked 8 bytes a step. */
static Py_ssize_t utf8_invalid_at(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07;
        else return i;
        if (i + len > n) return i; /* maybe torn by the block's end: the caller decides */
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return i;
        i += len;
    }
    return -1;
}

/* ------------------------------------------------------------------ the scanner */

enum { FIELD_PH, FIELD_NAME, FIELD_PID, FIELD_TID, FIELD_CAT, FIELD_ID, FIELD_TS, FIELD_DUR,
       FIELD_ARGS, N_FIELDS };
static const char *FIELD_NAMES[N_FIELDS] = {"ph", "name", "pid", "tid", "cat",
                                             "id", "ts", "dur", "args"};

enum { BEFORE_ARRAY, IN_ARRAY, AFTER_EVENT, AFTER_ARRAY };

typedef struct {
    PyObject_HEAD
    int state;
    Py_ssize_t rows;          /* events in the current batch */
    Py_ssize_t total_rows;    /* events before the current batch */
    Column fields[N_FIELDS];  /* ts: int64, dur: double, the rest text */
    int n_keys;
    char *keys[MAX_KEYS];
    Py_ssize_t key_lens[MAX_KEYS];
    uint64_t key_len_mask; /* bit n set: some key is n bytes long (a cheap first filter) */
    /* args members with those keys, one row each: (event row, key index, value text) */
    Py_ssize_t keyed_rows;
    Column keyed_event, keyed_key, keyed_value;
    Py_ssize_t counter_rows;
    Column counter_event, counter_series, counter_value;
    /* members of the current event's args: key and value spans, for counter rows */
    Span *members;
    Py_ssize_t n_members, cap_members;
    char error[200];
} Scanner;

static int member_push(Scanner *sc, Span key, Span value) {
    if (sc->n_members + 2 > sc->cap_members) {
        Py_ssize_t cap = sc->cap_members ? sc->cap_members * 2 : 64;
        Span *m = realloc(sc->members, sizeof(Span) * (size_t)cap);
        if (!m) return -1;
        sc->members = m;
        sc->cap_members = cap;
    }
    sc->members[sc->n_members++] = key;
    sc->members[sc->n_members++] = value;
    return 0;
}

/* Parse the args object at p: its text and the members the caller asked for. */
static const char *scan_args(Scanner *sc, const char *p, const char *end, Span *args,
                             Span *keyed) {
    const char *q = skip_ws(p + 1, end);
    if (q >= end) return NULL;
    if (*q == '}') goto close;
    for (;;) {
        Span key, value;
        if (*q != '"') return BAD;
        q = scan_string(q, end, &key);
        if (q == NULL || q == BAD) return q;
        q = skip_ws(q, end);
        if (q >= end) return NULL;
        if (*q != ':') return BAD;
        q = skip_ws(q + 1, end);
        q = scan_value(q, end, &value);
        if (q == NULL || q == BAD) return q;
        if (!key.escaped && key.n < 64 && (sc->key_len_mask >> key.n) & 1) {
            for (int k = 0; k < sc->n_keys; k++) {
                if (sc->key_lens[k] == key.n && memcmp(sc->keys[k], key.s, (size_t)key.n) == 0) {
                    keyed[k] = value;
                    break;
                }
            }
        }
        if (member_push(sc, key, value) < 0) return BAD;
        q = skip_ws(q, end);
        if (q >= end) return NULL;
        if (*q == ',') {
            q = skip_ws(q + 1, end);
            if (q >= end) return NULL;
            continue;
        }
        if (*q == '}') break;
        return BAD;
    }
close:
    args->s = p;
    args->n = q + 1 - p;
    args->kind = COMPOUND;
    args->escaped = 0;
    return q + 1;
}

static Py_ssize_t FIELD_LENS[N_FIELDS];

static int field_of(const Span *key) {
    if (key->escaped || key->n > 4) return -1;
    for (int f = 0; f < N_FIELDS; f++) {
        if (FIELD_LENS[f] == key->n && memcmp(FIELD_NAMES[f], key->s, (size_t)key->n) == 0)
            return f;
    }
    return -1;
}

/* Append one parsed event to the columns. */
static int commit_event(Scanner *sc, Span *fields, Span *keyed) {
    Py_ssize_t row = sc->rows;
    for (int f = 0; f < N_FIELDS; f++) {
        Column *c = &sc->fields[f];
        const Span *v = &fields[f];
        if (f == FIELD_TS) {
            int64_t ns = 0;
            int ok = (v->kind == STRING || v->kind == NUMBER) && !v->escaped &&
                     us_to_ns(v->s, v->n, &ns);
            if (valid_push(c, row, ok) < 0 || buf_put(&c->data, &ns, sizeof ns) < 0) return -1;
        } else if (f == FIELD_DUR) {
            if (double_push(c, row, v) < 0) return -1;
        } else if (f == FIELD_PID || f == FIELD_TID) {
            int64_t id = 0;
            int ok = to_int(v, &id);
            if (ok < 0) {
                snprintf(sc->error, sizeof sc->error, "a %s that is not an integer",
                         FIELD_NAMES[f]);
                return -2;
            }
            if (valid_push(c, row, ok) < 0 || buf_put(&c->data, &id, sizeof id) < 0) return -1;
        } else if (text_push(c, row, v) < 0) {
            return -1;
        }
    }
    int64_t event = sc->total_rows + row;
    for (int32_t k = 0; k < sc->n_keys; k++) {
        if (keyed[k].kind == ABSENT || keyed[k].kind == JNULL) continue;
        Py_ssize_t krow = sc->keyed_rows++;
        if (valid_push(&sc->keyed_event, krow, 1) < 0 ||
            buf_put(&sc->keyed_event.data, &event, sizeof event) < 0 ||
            valid_push(&sc->keyed_key, krow, 1) < 0 ||
            buf_put(&sc->keyed_key.data, &k, sizeof k) < 0 ||
            text_push(&sc->keyed_value, krow, &keyed[k]) < 0)
            return -1;
    }
    const Span *ph = &fields[FIELD_PH];
    if (ph->kind == STRING && ph->n == 1 && ph->s[0] == 'C') {
        for (Py_ssize_t m = 0; m + 1 < sc->n_members; m += 2) {
            Py_ssize_t crow = sc->counter_rows++;
            if (valid_push(&sc->counter_event, crow, 1) < 0 ||
                buf_put(&sc->counter_event.data, &event, sizeof event) < 0 ||
                text_push(&sc->counter_series, crow, &sc->members[m]) < 0 ||
                double_push(&sc->counter_value, crow, &sc->members[m + 1]) < 0)
                return -1;
        }
    }
    sc->rows++;
    return 0;
}

/* One event object at p. */
static const char *scan_event(Scanner *sc, const char *p, const char *end) {
    Span fields[N_FIELDS];
    Span keyed[MAX_KEYS];
    memset(fields, 0, sizeof fields);
    memset(keyed, 0, sizeof(Span) * (size_t)sc->n_keys);
    sc->n_members = 0;
    if (*p != '{') return BAD;
    const char *q = skip_ws(p + 1, end);
    if (q >= end) return NULL;
    if (*q != '}') {
        for (;;) {
            Span key;
            if (*q != '"') return BAD;
            q = scan_string(q, end, &key);
            if (q == NULL || q == BAD) return q;
            q = skip_ws(q, end);
            if (q >= end) return NULL;
            if (*q != ':') return BAD;
            q = skip_ws(q + 1, end);
            if (q >= end) return NULL;
            int f = field_of(&key);
            if (f == FIELD_ARGS && *q == '{') {
                sc->n_members = 0; /* a repeated key: the last one counts */
                memset(keyed, 0, sizeof(Span) * (size_t)sc->n_keys);
                q = scan_args(sc, q, end, &fields[f], keyed);
            } else {
                q = scan_value(q, end, f >= 0 ? &fields[f] : NULL);
            }
            if (q == NULL || q == BAD) return q;
            q = skip_ws(q, end);
            if (q >= end) return NULL;
            if (*q == ',') {
                q = skip_ws(q + 1, end);
                if (q >= end) return NULL;
                continue;
            }
            if (*q == '}') break;
            return BAD;
        }
    }
    int rc = commit_event(sc, fields, keyed);
    if (rc < 0) {
        if (rc == -1) snprintf(sc->error, sizeof sc->error, "out of memory");
        return BAD;
    }
    return q + 1;
}

/* Events from data[0:n] until the block ends inside one. Returns the bytes consumed, or -1
 * with sc->error and *where set. */
static Py_ssize_t scan_block(Scanner *sc, const char *data, Py_ssize_t n, Py_ssize_t *where) {
    const char *p = data, *end = data + n;
    for (;;) {
        const char *q = skip_ws(p, end);
        if (q >= end) return q - data;
        *where = q - data;
        switch (sc->state) {
            case BEFORE_ARRAY:
                if (sc->total_rows == 0 && sc->rows == 0 && end - q >= 3 &&
                    memcmp(q, "\xEF\xBB\xBF", 3) == 0) {
                    p = q + 3; /* a byte order mark */
                    continue;
                }
                if (*q != '[') {
                    snprintf(sc->error, sizeof sc->error, "not a JSON array");
                    return -1;
                }
                sc->state = IN_ARRAY;
                p = q + 1;
                {
                    const char *r = skip_ws(p, end);
                    if (r < end && *r == ']') sc->state = AFTER_ARRAY, p = r + 1;
                }
                continue;
            case IN_ARRAY: {
                if (*q != '{') {
                    snprintf(sc->error, sizeof sc->error, "expected an event object");
                    return -1;
                }
                const char *r = scan_event(sc, q, end);
                if (r == NULL) return q - data; /* the event goes on in the next block */
                if (r == BAD) {
                    if (!sc->error[0]) snprintf(sc->error, sizeof sc->error, "malformed event");
                    return -1;
                }
                sc->state = AFTER_EVENT;
                p = r;
                continue;
            }
            case AFTER_EVENT:
                if (*q == ',') sc->state = IN_ARRAY;
                else if (*q == ']') sc->state = AFTER_ARRAY;
                else {
                    snprintf(sc->error, sizeof sc->error, "expected ',' or ']' after an event");
                    return -1;
                }
                p = q + 1;
                continue;
            default:
                snprintf(sc->error, sizeof sc->error, "data after the closing bracket");
                return -1;
        }
    }
}

/* ------------------------------------------------------------------ Python API */

static void scanner_dealloc(Scanner *sc) {
    for (int f = 0; f < N_FIELDS; f++) column_free(&sc->fields[f]);
    for (int k = 0; k < sc->n_keys; k++) free(sc->keys[k]);
    column_free(&sc->keyed_event);
    column_free(&sc->keyed_key);
    column_free(&sc->keyed_value);
    column_free(&sc->counter_event);
    column_free(&sc->counter_series);
    column_free(&sc->counter_value);
    free(sc->members);
    Py_TYPE(sc)->tp_free((PyObject *)sc);
}

static int scanner_init(Scanner *sc, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"arg_keys", NULL};
    PyObject *keys;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &keys)) return -1;
    PyObject *seq = PySequence_Fast(keys, "arg_keys must be a sequence of str");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_KEYS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "at most %d arg_keys", MAX_KEYS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(seq, i), &len);
        if (!s) {
            Py_DECREF(seq);
            return -1;
        }
        sc->keys[sc->n_keys] = malloc((size_t)len + 1);
        if (!sc->keys[sc->n_keys]) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(sc->keys[sc->n_keys], s, (size_t)len + 1);
        if (len >= 64) {
            PyErr_Format(PyExc_ValueError, "arg key %R is longer than 63 bytes",
                         PySequence_Fast_GET_ITEM(seq, i));
            Py_DECREF(seq);
            return -1;
        }
        sc->key_len_mask |= (uint64_t)1 << len;
        sc->key_lens[sc->n_keys++] = len;
    }
    Py_DECREF(seq);
    return 0;
}

static PyObject *scanner_feed(Scanner *sc, PyObject *args) {
    Py_buffer view;
    int final = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &view, &final)) return NULL;
    const char *data = view.buf;
    Py_ssize_t n = view.len, where = 0, consumed = -1, bad_utf8;
    sc->error[0] = 0;
    Py_BEGIN_ALLOW_THREADS
    bad_utf8 = utf8_invalid_at((const unsigned char *)data, n);
    /* A multi-byte character torn at the end of a block is completed by the next one. */
    if (bad_utf8 >= 0 && !final && n - bad_utf8 < 4) {
        n = bad_utf8;
        bad_utf8 = -1;
    }
    if (bad_utf8 < 0) consumed = scan_block(sc, data, n, &where);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (bad_utf8 >= 0) {
        PyErr_Format(PyExc_ValueError, "invalid UTF-8 at byte %zd", bad_utf8);
        return NULL;
    }
    if (consumed < 0) {
        PyErr_Format(PyExc_ValueError, "%s at byte %zd", sc->error, where);
        return NULL;
    }
    if (final && (sc->state != AFTER_ARRAY || consumed < n)) {
        PyErr_Format(PyExc_ValueError, "%s at byte %zd",
                     sc->state == BEFORE_ARRAY ? "no JSON array" : "truncated", consumed);
        return NULL;
    }
    return PyLong_FromSsize_t(consumed);
}

/* A buffer handed over to Python without a copy: pyarrow wraps it through the buffer protocol
 * and frees it with the last array that uses it. */
typedef struct {
    PyObject_HEAD
    char *p;
    Py_ssize_t len;
} Owned;

static void owned_dealloc(Owned *o) {
    free(o->p);
    Py_TYPE(o)->tp_free((PyObject *)o);
}

static int owned_getbuffer(Owned *o, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)o, o->p, o->len, 1, flags);
}

static PyBufferProcs owned_as_buffer = {.bf_getbuffer = (getbufferproc)owned_getbuffer};

static PyTypeObject OwnedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "traceanalyzer.parse._trace_scan.Owned",
    .tp_basicsize = sizeof(Owned),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Column bytes handed over by the scanner.",
    .tp_dealloc = (destructor)owned_dealloc,
    .tp_as_buffer = &owned_as_buffer,
};

/* Moves the buffer's memory into an Owned object (the buffer starts over empty). */
static PyObject *hand_over(Buf *b) {
    Owned *o = PyObject_New(Owned, &OwnedType);
    if (!o) return NULL;
    o->p = realloc(b->p, (size_t)(b->len ? b->len : 1)); /* give back the growth slack */
    if (!o->p) o->p = b->p;
    o->len = b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return (PyObject *)o;
}

/* (rows, nulls, validity, offsets or None, data) for pyarrow.Array.from_buffers. */
static PyObject *column_take(Column *c, Py_ssize_t rows, int text) {
    PyObject *out = Py_BuildValue("(nnNNN)", rows, c->nulls, hand_over(&c->valid),
                                  text ? hand_over(&c->offsets) : Py_NewRef(Py_None),
                                  hand_over(&c->data));
    column_reset(c);
    return out;
}

static int take_into(PyObject *dict, const char *name, Column *c, Py_ssize_t rows, int text) {
    if (text && c->offsets.len == 0 && offset_push(c) < 0) return -1; /* no rows: one offset */
    PyObject *col = column_take(c, rows, text);
    if (!col) return -1;
    int rc = PyDict_SetItemString(dict, name, col);
    Py_DECREF(col);
    return rc;
}

static PyObject *scanner_take(Scanner *sc, PyObject *Py_UNUSED(ignored)) {
    PyObject *events = PyDict_New(), *counters = PyDict_New(), *keyed = PyDict_New();
    if (!events || !counters || !keyed) goto fail;
    for (int f = 0; f < N_FIELDS; f++)
        if (take_into(events, FIELD_NAMES[f], &sc->fields[f], sc->rows,
                      f != FIELD_TS && f != FIELD_DUR && f != FIELD_PID && f != FIELD_TID) < 0)
            goto fail;
    if (take_into(keyed, "event", &sc->keyed_event, sc->keyed_rows, 0) < 0 ||
        take_into(keyed, "key", &sc->keyed_key, sc->keyed_rows, 0) < 0 ||
        take_into(keyed, "value", &sc->keyed_value, sc->keyed_rows, 1) < 0)
        goto fail;
    if (take_into(counters, "event", &sc->counter_event, sc->counter_rows, 0) < 0 ||
        take_into(counters, "series", &sc->counter_series, sc->counter_rows, 1) < 0 ||
        take_into(counters, "value", &sc->counter_value, sc->counter_rows, 0) < 0)
        goto fail;
    sc->total_rows += sc->rows;
    sc->rows = sc->counter_rows = sc->keyed_rows = 0;
    return Py_BuildValue("(NNN)", events, keyed, counters);
fail:
    Py_XDECREF(events);
    Py_XDECREF(keyed);
    Py_XDECREF(counters);
    return PyErr_Occurred() ? NULL : PyErr_NoMemory();
}

static PyMethodDef scanner_methods[] = {
    {"feed", (PyCFunction)scanner_feed, METH_VARARGS,
     "feed(block, final=False) -> bytes consumed: parse the complete events of a block.\n\n"
     "Bytes not consumed (an event cut by the block's end) must lead the next block. Raises\n"
     "ValueError, with the offset in the block, on input this scanner does not read."},
    {"take", (PyCFunction)scanner_take, METH_NOARGS,
     "take() -> (events, keyed args, counters): the rows parsed since the last take, as\n"
     "Arrow buffers (rows, nulls, validity, offsets or None, data) per column."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "traceanalyzer.parse._trace_scan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(arg_keys): parse trace_view.json blocks into Arrow column buffers.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)scanner_init,
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_methods = scanner_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_trace_scan",
    .m_doc = "Native trace_view.json scanner (see trace_native.py).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__trace_scan(void) {
    for (int f = 0; f < N_FIELDS; f++) FIELD_LENS[f] = (Py_ssize_t)strlen(FIELD_NAMES[f]);
    if (PyType_Ready(&ScannerType) < 0 || PyType_Ready(&OwnedType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Scanner", (PyObject *)&ScannerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
