/* One pass over a trace_view.json array: its events into Arrow-layout columns, by table.
 *
 * Why native: the tables need a sort, name lookups and a few args per event, and DuckDB does
 * these over a materialised copy of every event, under a memory cap that makes it spill
 * (docs/benchmarks/ingest.md). This scanner reads the bytes once and builds the columns the
 * tables need, already typed: text as Arrow string views (which polars adopts without a copy),
 * ids and times as int64. polars does the rest (trace_native.py).
 *
 * Scope: a well-formed JSON array of objects, fed in blocks. Anything else (truncation, a
 * malformed event, invalid UTF-8, a pid that is not an integer) raises ValueError with the byte
 * offset, and the caller falls back to the DuckDB reader, which owns the salvage of damaged
 * files. The parse loop touches no Python object, so it runs without the GIL and several
 * scanners share the cores.
 *
 * Five tables come out, each row a few fixed-width values (text as 16-byte views):
 * - slices: the X/i/I events: ph, name, pid, tid, cat, ts (exact ns from the decimal digits,
 *   never through a double), dur_ns, and args_at and args_len: where the args lie in the file
 *   (copied, they would be half of a scan's memory), which args_text() turns into their JSON
 *   text (minified) a row group at a time;
 * - flat: for the slices with any of the args keys the caller names: the slice's row and one
 *   column per group of keys (the first key of a group present wins; "int" and "id" groups are
 *   null when the value is not an integer, "id" ones also on the uint32 "none" sentinel). Few
 *   slices have any, so this costs little where dense columns would cost 16 bytes a row each;
 * - counters: the C events: pid, tid, name, ts;
 * - samples: one row per member of a counter's args: its counter's row, the member's key, and
 *   its value as a double (null when not a number);
 * - others: every other event: ph, name, pid, tid, cat, id, ts, and args for metadata (M) only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#ifdef __linux__
#include <sys/mman.h>
#endif

#define MAX_KEYS 64
#define MAX_GROUPS 16
#define MAX_COLUMNS 32

/* ------------------------------------------------------------------ growable buffers */

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

/* Column memory comes straight from the kernel on Linux: growing by mremap never copies, pages
 * never written are never resident, and freeing returns them (malloc keeps large freed blocks in
 * per-thread arenas and copies on growth, which doubled the scan's peak RSS). */
static char *mem_resize(char *p, Py_ssize_t old_cap, Py_ssize_t cap) {
#ifdef __linux__
    void *q = p ? mremap(p, (size_t)old_cap, (size_t)cap, MREMAP_MAYMOVE)
                : mmap(NULL, (size_t)cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return q == MAP_FAILED ? NULL : q;
#else
    (void)old_cap;
    return realloc(p, (size_t)cap);
#endif
}

static void mem_free(char *p, Py_ssize_t cap) {
#ifdef __linux__
    if (p) munmap(p, (size_t)cap);
#else
    (void)cap;
    free(p);
#endif
}

/* a == b over n bytes. Keys and names are short: a loop the compiler inlines beats a call to
 * memcmp, which was a twentieth of a scan (every event's keys, every interned name). */
static inline int same_bytes(const char *a, const char *b, Py_ssize_t n) {
    if (n > 32) return memcmp(a, b, (size_t)n) == 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

static int buf_grow(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 1 << 16;
    while (cap < b->len + extra) cap *= 2;
    char *p = mem_resize(b->p, b->cap, cap);
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
    mem_free(b->p, b->cap);
    b->p = NULL;
    b->len = b->cap = 0;
}


/* ------------------------------------------------------------------ columns */

enum { TEXT, INT64, FLOAT64, DICT, INT32 };

/* The distinct strings of an interned (DICT) column, and the hash table that finds them. */
typedef struct {
    Buf views, data;   /* the strings, as a text column's buffers */
    Py_ssize_t n;      /* how many */
    uint32_t *slots;   /* open addressing: code + 1, or 0 when empty */
    Py_ssize_t n_slots;
    uint64_t *hashes;  /* per code */
    Buf scratch;       /* the decoded value being looked up */
} Dict;

/* An Arrow column being built: validity bitmap, then 16-byte views + one data buffer (text),
 * fixed-width values, or int32 codes into a Dict (names, categories: few distinct values,
 * 4 bytes a row instead of 16 and their bytes once). */
typedef struct {
    const char *name;
    int type;
    Buf valid, values, data;
    Py_ssize_t nulls;
    Dict *dict;
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

static int int_push(Column *c, Py_ssize_t row, int ok, int64_t value) {
    if (valid_push(c, row, ok) < 0) return -1;
    if (!ok) value = 0;
    if (c->type == INT32) { /* the caller checked the range */
        int32_t narrow = (int32_t)value;
        return buf_put(&c->values, &narrow, sizeof narrow);
    }
    return buf_put(&c->values, &value, sizeof value);
}

static int float_push(Column *c, Py_ssize_t row, int ok, double value) {
    if (valid_push(c, row, ok) < 0) return -1;
    if (!ok) value = 0;
    return buf_put(&c->values, &value, sizeof value);
}

static void dict_clear(Dict *d) {
    buf_free(&d->views);
    buf_free(&d->data);
    buf_free(&d->scratch);
    free(d->slots);
    free(d->hashes);
    memset(d, 0, sizeof *d);
}

static void column_free(Column *c) {
    buf_free(&c->valid);
    buf_free(&c->values);
    buf_free(&c->data);
    if (c->dict) dict_clear(c->dict);
    free(c->dict);
    c->dict = NULL;
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
 * a control character (end if none). Sixteen bytes a step where SSE2 is (every x86-64), eight
 * elsewhere: strings (call stacks) are most of a trace. */
static const char *string_stop(const char *p, const char *end) {
#if defined(__SSE2__)
    const __m128i quote16 = _mm_set1_epi8('"'), backslash16 = _mm_set1_epi8('\\'),
                  control16 = _mm_set1_epi8(0x1F);
    while (end - p >= 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)p);
        __m128i stops = _mm_or_si128(_mm_cmpeq_epi8(x, quote16), _mm_cmpeq_epi8(x, backslash16));
        /* max(x, 0x1F) == 0x1F: the byte is below 0x20, unsigned */
        stops = _mm_or_si128(stops, _mm_cmpeq_epi8(_mm_max_epu8(x, control16), control16));
        int mask = _mm_movemask_epi8(stops);
        if (mask) return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#endif
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
            /* an escape JSON has not (a key "c\at") is a malformed event, as DuckDB reads it */
            if (!strchr("\"\\/bfnrtu", hit[1]) || hit[1] == '\0') return BAD;
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

/* Set when a text column's data outgrows the 2 GiB a view can address (the caller then falls
 * back to the DuckDB reader). */
#define TOO_LARGE -2

/* A value as text: strings decoded, anything else as written (compound values minified). */
static int put_text(Buf *b, const Span *v) {
    return v->kind == STRING && v->escaped ? put_unescaped(b, v->s, v->n)
           : v->kind == COMPOUND           ? put_minified(b, v->s, v->n)
                                           : buf_put(b, v->s, v->n);
}

/* The view of the bytes data[start:], appended to views; 12 bytes or less go inline (and
 * leave data). */
static int view_write(char *view, Buf *data, Py_ssize_t start);

static int view_push(Buf *views, Buf *data, Py_ssize_t start) {
    if (buf_grow(views, 16) < 0) return -1;
    char *view = views->p + views->len;
    memset(view, 0, 16);
    views->len += 16;
    return view_write(view, data, start);
}

/* The 16-byte view (zeroed) of data[start:]. */
static int view_write(char *view, Buf *data, Py_ssize_t start) {
    Py_ssize_t len = data->len - start;
    if (data->len > INT32_MAX) return TOO_LARGE;
    int32_t len32 = (int32_t)len, zero = 0, offset = (int32_t)start;
    memcpy(view, &len32, 4);
    if (len <= 12) {
        memcpy(view + 4, data->p + start, (size_t)len);
        data->len = start;
    } else {
        memcpy(view + 4, data->p + start, 4);
        memcpy(view + 8, &zero, 4);
        memcpy(view + 12, &offset, 4);
    }
    return 0;
}

static int dict_push(Column *c, Py_ssize_t row, const Span *v);

/* A value into a text column (or its code into an interned one). */
static int text_push(Column *c, Py_ssize_t row, const Span *v) {
    if (c->type == DICT) return dict_push(c, row, v);
    int ok = v->kind != ABSENT && v->kind != JNULL;
    if (valid_push(c, row, ok) < 0) return -1;
    if (!ok) {
        if (buf_grow(&c->values, 16) < 0) return -1;
        memset(c->values.p + c->values.len, 0, 16);
        c->values.len += 16;
        return 0;
    }
    Py_ssize_t start = c->data.len;
    if (put_text(&c->data, v) < 0) return -1;
    return view_push(&c->values, &c->data, start);
}

static uint64_t hash_bytes(const char *s, Py_ssize_t n) { /* FNV-1a */
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static const char *dict_bytes(const Dict *d, Py_ssize_t code, Py_ssize_t *len) {
    const char *view = d->views.p + code * 16;
    int32_t len32, offset;
    memcpy(&len32, view, 4);
    *len = len32;
    if (len32 <= 12) return view + 4;
    memcpy(&offset, view + 12, 4);
    return d->data.p + offset;
}

static int dict_rehash(Dict *d) {
    Py_ssize_t n_slots = d->n_slots ? d->n_slots * 2 : 1024;
    uint32_t *slots = calloc((size_t)n_slots, sizeof *slots);
    uint64_t *hashes = realloc(d->hashes, sizeof *hashes * (size_t)(n_slots / 2));
    if (!slots || !hashes) {
        free(slots);
        if (hashes) d->hashes = hashes;
        return -1;
    }
    d->hashes = hashes;
    for (Py_ssize_t code = 0; code < d->n; code++) {
        Py_ssize_t i = (Py_ssize_t)(hashes[code] & (uint64_t)(n_slots - 1));
        while (slots[i]) i = (i + 1) & (n_slots - 1);
        slots[i] = (uint32_t)code + 1;
    }
    free(d->slots);
    d->slots = slots;
    d->n_slots = n_slots;
    return 0;
}

/* The code of a value in an interned column, adding it when new. */
static int dict_push(Column *c, Py_ssize_t row, const Span *v) {
    int ok = v->kind != ABSENT && v->kind != JNULL;
    int32_t code = 0;
    if (valid_push(c, row, ok) < 0) return -1;
    if (ok) {
        Dict *d = c->dict;
        const char *text = v->s; /* the value's bytes as they are, unless they need decoding */
        Py_ssize_t n = v->n;
        if ((v->kind == STRING && v->escaped) || v->kind == COMPOUND) {
            d->scratch.len = 0;
            if (put_text(&d->scratch, v) < 0) return -1;
            text = d->scratch.p;
            n = d->scratch.len;
        }
        if ((d->n + 1) * 2 > d->n_slots && dict_rehash(d) < 0) return -1;
        uint64_t h = hash_bytes(text, n);
        Py_ssize_t i = (Py_ssize_t)(h & (uint64_t)(d->n_slots - 1));
        for (;; i = (i + 1) & (d->n_slots - 1)) {
            if (!d->slots[i]) { /* new: add it */
                if (d->n >= INT32_MAX) return TOO_LARGE;
                Py_ssize_t start = d->data.len;
                if (buf_put(&d->data, text, n) < 0) return -1;
                int rc = view_push(&d->views, &d->data, start);
                if (rc < 0) return rc;
                d->hashes[d->n] = h;
                d->slots[i] = (uint32_t)d->n + 1;
                code = (int32_t)d->n++;
                break;
            }
            Py_ssize_t candidate = d->slots[i] - 1, len;
            if (d->hashes[candidate] != h) continue;
            const char *bytes = dict_bytes(d, candidate, &len);
            if (len == n && same_bytes(bytes, text, len)) {
                code = (int32_t)candidate;
                break;
            }
        }
    }
    return buf_put(&c->values, &code, sizeof code);
}

/* ------------------------------------------------------------------ numbers */

/* A number's text with an exponent ("1.736408883704643e15", "2.5E-1") as exact ns of the µs
 * it says: its digits with the point moved, past the ns rounded half away from zero, as
 * timeutil's conversions (polars: Python's decimals; DuckDB: a DECIMAL cast). Returns 0 when it
 * is no such number (hex, "1_000", nan, inf) or its ns are past int64. */
static int exponent_us_to_ns(const char *s, Py_ssize_t n, int64_t *out) {
    const char *p = s, *end = s + n;
    int negative = 0;
    if (p < end && (*p == '+' || *p == '-')) negative = *p++ == '-';
    char digits[64]; /* the significant digits, leading zeros dropped */
    int nd = 0, point = 0, mantissa = 0; /* point: digits before the point, of those kept */
    int in_fraction = 0;
    for (; p < end && ((*p >= '0' && *p <= '9') || (*p == '.' && !in_fraction)); p++) {
        if (*p == '.') {
            in_fraction = 1;
            continue;
        }
        mantissa++;
        if (nd == 0 && *p == '0') {
            point -= in_fraction; /* a zero after the point moves the first digit right */
            continue;
        }
        if (nd == (int)sizeof digits) return 0;
        digits[nd++] = *p;
        point += !in_fraction;
    }
    if (!mantissa || p == end || (*p != 'e' && *p != 'E')) return 0;
    p++;
    int exp_negative = 0, exp_digits = 0;
    long exponent = 0;
    if (p < end && (*p == '+' || *p == '-')) exp_negative = *p++ == '-';
    for (; p < end && *p >= '0' && *p <= '9'; p++, exp_digits++)
        if (exponent < 100000) exponent = exponent * 10 + (*p - '0');
    if (!exp_digits || p != end) return 0;
    *out = 0;
    if (nd == 0) return 1; /* zero, whatever its exponent */
    long whole = point + (exp_negative ? -exponent : exponent) + 3; /* digits left of the ns point */
    if (whole > 19) return 0;
    uint64_t ns = 0;
    for (long i = 0; i < whole; i++) ns = ns * 10 + (uint64_t)(i < nd ? digits[i] - '0' : 0);
    if (whole >= 0 && whole < nd && digits[whole] >= '5') ns++;
    if (ns > (uint64_t)INT64_MAX) return 0;
    *out = negative ? -(int64_t)ns : (int64_t)ns;
    return 1;
}

/* µs text -> exact ns, as timeutil.us_expr_to_ns: digits past the ns rounded half up; tabs, spaces,
 * quotes and line ends around it ignored; an exponent moves the point. Returns 0 when not a
 * number. */
static int us_to_ns(const char *s, Py_ssize_t n, int64_t *out) {
    static const char junk[] = "\t \"'\r\n"; /* timeutil._JUNK */
    while (n > 0 && *s && strchr(junk, *s)) s++, n--;
    while (n > 0 && s[n - 1] && strchr(junk, s[n - 1])) n--;
    if (n <= 0 || n > 60) return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i] == 'e' || s[i] == 'E') return exponent_us_to_ns(s, n, out);
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
 * -1 when it is something else (or does not fit). */
static int to_int(const Span *v, int64_t *out) {
    if (v->kind == ABSENT || v->kind == JNULL) return 0;
    if ((v->kind != NUMBER && v->kind != STRING) || v->escaped || v->n == 0 || v->n > 20)
        return -1;
    const char *p = v->s, *end = v->s + v->n;
    int negative = *p == '-';
    if (negative && ++p == end) return -1;
    uint64_t value = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9' || value > (UINT64_MAX - 9) / 10) return -1;
        value = value * 10 + (uint64_t)(*p - '0');
    }
    if (value > (uint64_t)INT64_MAX) return -1;
    *out = negative ? -(int64_t)value : (int64_t)value;
    return 1;
}

static int to_float(const Span *v, double *out) {
    return (v->kind == NUMBER || (v->kind == STRING && !v->escaped)) && to_double(v->s, v->n, out);
}

/* ------------------------------------------------------------------ UTF-8 */

/* Returns the offset of the first invalid byte, or -1. ASCII runs are checked 32 bytes a step
 * (a trace is nearly all ASCII: this check was a twentieth of a scan at 8 a step). */
static Py_ssize_t utf8_invalid_at(const unsigned char *s, Py_ssize_t n) {
    const uint64_t highs = 0x8080808080808080ULL;
    Py_ssize_t i = 0;
    while (i < n) {
        if (i + 32 <= n) {
            uint64_t w[4];
            memcpy(w, s + i, 32);
            if (!((w[0] | w[1] | w[2] | w[3]) & highs)) {
                i += 32;
                continue;
            }
        }
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & highs)) {
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

enum { F_PH, F_NAME, F_PID, F_TID, F_CAT, F_ID, F_TS, F_DUR, F_ARGS, N_FIELDS };
static const char *FIELD_NAMES[N_FIELDS] = {"ph", "name", "pid", "tid", "cat",
                                             "id", "ts", "dur", "args"};
static Py_ssize_t FIELD_LENS[N_FIELDS];

/* The columns of each table; flat then has one column per group of args keys. */
enum { T_SLICES, T_FLAT, T_COUNTERS, T_SAMPLES, T_OTHERS, N_TABLES };
static const char *TABLE_NAMES[N_TABLES] = {"slices", "flat", "counters", "samples", "others"};
enum { S_PH, S_NAME, S_PID, S_TID, S_CAT, S_TS, S_DUR, S_ARGS_AT, S_ARGS_LEN, S_COLUMNS };
enum { FLAT_ROW, FLAT_GROUPS };
enum { K_PID, K_TID, K_NAME, K_TS, K_COLUMNS };
enum { C_EVENT, C_SERIES, C_VALUE, C_COLUMNS };
enum { O_PH, O_NAME, O_PID, O_TID, O_CAT, O_ID, O_TS, O_ARGS, O_COLUMNS };
enum { GROUP_TEXT, GROUP_INT, GROUP_ID }; /* an id: an int whose "none" sentinel becomes null */

typedef struct {
    Py_ssize_t rows;   /* in the current batch */
    Py_ssize_t before; /* handed over by earlier takes: a row's number is before + row */
    int n_columns;
    Column columns[MAX_COLUMNS];
} Table;

static int table_add(Table *t, const char *name, int type) {
    Column *c = &t->columns[t->n_columns++];
    memset(c, 0, sizeof *c);
    c->name = name;
    c->type = type;
    if (type == DICT && !(c->dict = calloc(1, sizeof(Dict)))) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

enum { BEFORE_ARRAY, IN_ARRAY, AFTER_EVENT, AFTER_ARRAY };

typedef struct {
    PyObject_HEAD
    int state;
    Table tables[N_TABLES];
    int n_groups;
    char *group_names[MAX_GROUPS];
    int group_kinds[MAX_GROUPS];
    int n_keys;
    char *keys[MAX_KEYS];
    Py_ssize_t key_lens[MAX_KEYS];
    int key_group[MAX_KEYS], key_rank[MAX_KEYS]; /* its group, and its place in it */
    uint64_t key_len_mask; /* bit n set: some key is n bytes long (a cheap first filter) */
    Buf scratch;           /* an escaped ts, decoded */
    Span *members;         /* key and value spans of the current event's args */
    Py_ssize_t n_members, cap_members;
    const char *block;     /* the block being scanned, which starts at byte base of the file */
    long long base;
    char error[200];
} Scanner;

typedef struct {
    Span fields[N_FIELDS];
    Span groups[MAX_GROUPS];
    int ranks[MAX_GROUPS];
} Event;

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

static void reset_args(Scanner *sc, Event *ev) {
    sc->n_members = 0;
    for (int g = 0; g < sc->n_groups; g++) {
        ev->groups[g].kind = ABSENT;
        ev->ranks[g] = MAX_KEYS;
    }
}

/* The members of the object at p ('{'): for each, ``member`` parses the value at its first
 * byte and returns the byte past it (NULL when the block ends first, BAD when malformed).
 * Returns the byte past the closing brace, NULL or BAD. */
typedef const char *(*Member)(Scanner *sc, void *ctx, const Span *key, const char *value,
                              const char *end);

static const char *scan_object(Scanner *sc, const char *p, const char *end, Member member,
                               void *ctx) {
    const char *q = skip_ws(p + 1, end);
    if (q >= end) return NULL;
    if (*q == '}') return q + 1;
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
        q = member(sc, ctx, &key, q, end);
        if (q == NULL || q == BAD) return q;
        q = skip_ws(q, end);
        if (q >= end) return NULL;
        if (*q == '}') return q + 1;
        if (*q != ',') return BAD;
        q = skip_ws(q + 1, end);
        if (q >= end) return NULL;
    }
}

/* A member of args: kept for counter samples, and as its group's value when its key is the
 * group's best so far. */
static const char *args_member(Scanner *sc, void *ctx, const Span *key, const char *p,
                               const char *end) {
    Event *ev = ctx;
    Span value;
    const char *q = scan_value(p, end, &value);
    if (q == NULL || q == BAD) return q;
    if (!key->escaped && key->n < 64 && (sc->key_len_mask >> key->n) & 1) {
        for (int k = 0; k < sc->n_keys; k++) {
            if (sc->key_lens[k] == key->n && same_bytes(sc->keys[k], key->s, key->n)) {
                int g = sc->key_group[k];
                if (sc->key_rank[k] < ev->ranks[g] && value.kind != JNULL) {
                    ev->groups[g] = value;
                    ev->ranks[g] = sc->key_rank[k];
                }
                break;
            }
        }
    }
    if (member_push(sc, *key, value) < 0) {
        snprintf(sc->error, sizeof sc->error, "out of memory");
        return BAD;
    }
    return q;
}

/* Parse the args object at p: its text, its members, and the best key of each group. */
static const char *scan_args(Scanner *sc, const char *p, const char *end, Event *ev) {
    reset_args(sc, ev); /* a repeated args key: the last one counts */
    const char *q = scan_object(sc, p, end, args_member, ev);
    if (q == NULL || q == BAD) return q;
    ev->fields[F_ARGS].s = p;
    ev->fields[F_ARGS].n = q - p;
    ev->fields[F_ARGS].kind = COMPOUND;
    ev->fields[F_ARGS].escaped = 0;
    return q;
}

static int field_of(const Span *key) {
    if (key->escaped || key->n > 4) return -1;
    for (int f = 0; f < N_FIELDS; f++) {
        if (FIELD_LENS[f] == key->n && same_bytes(FIELD_NAMES[f], key->s, key->n))
            return f;
    }
    return -1;
}

/* Errors of commit_event besides out of memory: the message is in sc->error. */
#define REFUSED -3

static int pid_tid(Scanner *sc, const Event *ev, int64_t *ids, int *ok) {
    for (int i = 0; i < 2; i++) {
        ok[i] = to_int(&ev->fields[F_PID + i], &ids[i]);
        if (ok[i] < 0) {
            snprintf(sc->error, sizeof sc->error, "a %s that is not an integer",
                     FIELD_NAMES[F_PID + i]);
            return REFUSED;
        }
    }
    return 0;
}

#define TRY(expr)                     \
    do {                              \
        int rc_ = (expr);             \
        if (rc_ < 0) return rc_;      \
    } while (0)

/* The members of the groups, when the event has any: one sparse row keyed by the slice's row. */
static int commit_flat(Scanner *sc, const Event *ev, int64_t slice_row) {
    int any = 0;
    for (int g = 0; g < sc->n_groups; g++) any |= ev->groups[g].kind != ABSENT;
    if (!any) return 0;
    Table *t = &sc->tables[T_FLAT];
    Column *c = t->columns;
    Py_ssize_t row = t->rows;
    if (slice_row > INT32_MAX) return TOO_LARGE;
    TRY(int_push(&c[FLAT_ROW], row, 1, slice_row));
    for (int g = 0; g < sc->n_groups; g++) {
        Column *gc = &c[FLAT_GROUPS + g];
        if (sc->group_kinds[g] == GROUP_TEXT) {
            TRY(text_push(gc, row, &ev->groups[g]));
            continue;
        }
        int64_t value = 0;
        int is_int = to_int(&ev->groups[g], &value) == 1;
        if (sc->group_kinds[g] == GROUP_ID && value == 4294967295LL) is_int = 0;
        TRY(int_push(gc, row, is_int, value));
    }
    t->rows++;
    return 0;
}

/* Where a value lies in the file: its whole text, quotes included (offset -1 when absent or
 * null; never a null, so the columns go to numpy without a copy). */
static int range_push(Scanner *sc, Column *at, Column *len, Py_ssize_t row, const Span *v) {
    int ok = v->kind != ABSENT && v->kind != JNULL;
    const char *start = v->kind == STRING ? v->s - 1 : v->s;
    Py_ssize_t n = v->kind == STRING ? v->n + 2 : v->n;
    if (n > INT32_MAX) return TOO_LARGE;
    TRY(int_push(at, row, 1, ok ? sc->base + (start - sc->block) : -1));
    return int_push(len, row, 1, ok ? n : 0);
}

/* A slice's dur as ns, as timeutil.duckdb_duration_us_to_ns: 0 when absent or null, a number
 * (or a string of one, escapes decoded) converted as a ts is (exactly); 1 when it is one of
 * those, 0 (null) for anything else (the derivation drops the event, with a note), -1 on a bad
 * escape. */
static int dur_to_ns(Scanner *sc, const Span *v, int64_t *out) {
    *out = 0;
    if (v->kind == ABSENT || v->kind == JNULL) return 1;
    if (v->kind != NUMBER && v->kind != STRING) return 0;
    const char *s = v->s;
    Py_ssize_t n = v->n;
    if (v->kind == STRING && v->escaped) {
        sc->scratch.len = 0;
        if (put_unescaped(&sc->scratch, s, n) < 0) {
            snprintf(sc->error, sizeof sc->error, "a bad escape in a dur");
            return -1;
        }
        s = sc->scratch.p;
        n = sc->scratch.len;
    }
    while (n > 0 && (*s == ' ' || *s == '\t')) s++, n--;
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
    return n > 0 && us_to_ns(s, n, out);
}

static int commit_slice(Scanner *sc, const Event *ev, const int64_t *ids, const int *ok,
                        int ts_ok, int64_t ts) {
    Table *t = &sc->tables[T_SLICES];
    Column *c = t->columns;
    Py_ssize_t row = t->rows;
    int64_t dur_ns = 0;
    int dur_ok = dur_to_ns(sc, &ev->fields[F_DUR], &dur_ns);
    if (dur_ok < 0) return REFUSED;
    TRY(text_push(&c[S_PH], row, &ev->fields[F_PH]));
    TRY(text_push(&c[S_NAME], row, &ev->fields[F_NAME]));
    TRY(int_push(&c[S_PID], row, ok[0], ids[0]));
    TRY(int_push(&c[S_TID], row, ok[1], ids[1]));
    TRY(text_push(&c[S_CAT], row, &ev->fields[F_CAT]));
    TRY(int_push(&c[S_TS], row, ts_ok, ts));
    TRY(int_push(&c[S_DUR], row, dur_ok, dur_ns)); /* null: no duration the derivation keeps */
    TRY(range_push(sc, &c[S_ARGS_AT], &c[S_ARGS_LEN], row, &ev->fields[F_ARGS]));
    TRY(commit_flat(sc, ev, t->before + row));
    t->rows++;
    return 0;
}

/* A counter event: its identity, and one sample per member of its args. */
static int commit_counter(Scanner *sc, const Event *ev, const int64_t *ids, const int *ok,
                          int ts_ok, int64_t ts) {
    Table *t = &sc->tables[T_COUNTERS], *st = &sc->tables[T_SAMPLES];
    Column *c = t->columns, *sc_ = st->columns;
    Py_ssize_t row = t->rows;
    TRY(int_push(&c[K_PID], row, ok[0], ids[0]));
    TRY(int_push(&c[K_TID], row, ok[1], ids[1]));
    TRY(text_push(&c[K_NAME], row, &ev->fields[F_NAME]));
    TRY(int_push(&c[K_TS], row, ts_ok, ts));
    int64_t event = t->before + row;
    if (event > INT32_MAX) return TOO_LARGE;
    for (Py_ssize_t m = 0; m + 1 < sc->n_members; m += 2) {
        double value = 0;
        int is_number = to_float(&sc->members[m + 1], &value);
        TRY(int_push(&sc_[C_EVENT], st->rows, 1, event));
        TRY(text_push(&sc_[C_SERIES], st->rows, &sc->members[m]));
        TRY(float_push(&sc_[C_VALUE], st->rows, is_number, value));
        st->rows++;
    }
    t->rows++;
    return 0;
}

static int commit_other(Scanner *sc, const Event *ev, const int64_t *ids, const int *ok,
                        int ts_ok, int64_t ts) {
    Table *t = &sc->tables[T_OTHERS];
    Column *c = t->columns;
    Py_ssize_t row = t->rows;
    const Span *ph = &ev->fields[F_PH];
    Span none = {0};
    TRY(text_push(&c[O_PH], row, ph));
    TRY(text_push(&c[O_NAME], row, &ev->fields[F_NAME]));
    TRY(int_push(&c[O_PID], row, ok[0], ids[0]));
    TRY(int_push(&c[O_TID], row, ok[1], ids[1]));
    TRY(text_push(&c[O_CAT], row, &ev->fields[F_CAT]));
    TRY(text_push(&c[O_ID], row, &ev->fields[F_ID]));
    TRY(int_push(&c[O_TS], row, ts_ok, ts));
    /* Only metadata args are read (for the names). */
    int meta = ph->kind == STRING && ph->n == 1 && ph->s[0] == 'M';
    TRY(text_push(&c[O_ARGS], row, meta ? &ev->fields[F_ARGS] : &none));
    t->rows++;
    return 0;
}

static int commit_event(Scanner *sc, const Event *ev) {
    int64_t ids[2] = {0, 0}, ts = 0;
    int ok[2];
    TRY(pid_tid(sc, ev, ids, ok));
    Span t = ev->fields[F_TS];
    if (t.kind == STRING && t.escaped) { /* a tab written as an escape, say: decoded first */
        sc->scratch.len = 0;
        if (put_unescaped(&sc->scratch, t.s, t.n) < 0) {
            snprintf(sc->error, sizeof sc->error, "a bad escape in a ts");
            return REFUSED;
        }
        t.s = sc->scratch.p;
        t.n = sc->scratch.len;
    }
    int ts_ok = (t.kind == STRING || t.kind == NUMBER) && us_to_ns(t.s, t.n, &ts);
    const Span *ph = &ev->fields[F_PH];
    char kind = ph->kind == STRING && ph->n == 1 ? ph->s[0] : 0;
    if (kind == 'X' || kind == 'i' || kind == 'I') return commit_slice(sc, ev, ids, ok, ts_ok, ts);
    if (kind == 'C') return commit_counter(sc, ev, ids, ok, ts_ok, ts);
    return commit_other(sc, ev, ids, ok, ts_ok, ts);
}

/* A member of an event: the fields the tables read, args walked member by member. */
static const char *event_member(Scanner *sc, void *ctx, const Span *key, const char *p,
                                const char *end) {
    Event *ev = ctx;
    int f = field_of(key);
    if (f == F_ARGS && *p == '{') return scan_args(sc, p, end, ev);
    if (f == F_ARGS) reset_args(sc, ev); /* args that are not an object: no members */
    return scan_value(p, end, f >= 0 ? &ev->fields[f] : NULL);
}

/* One event object at p. */
static const char *scan_event(Scanner *sc, const char *p, const char *end) {
    Event ev;
    memset(ev.fields, 0, sizeof ev.fields);
    reset_args(sc, &ev);
    if (*p != '{') return BAD;
    const char *q = scan_object(sc, p, end, event_member, &ev);
    if (q == NULL || q == BAD) return q;
    int rc = commit_event(sc, &ev);
    if (rc < 0) {
        if (rc == -1) snprintf(sc->error, sizeof sc->error, "out of memory");
        if (rc == TOO_LARGE)
            snprintf(sc->error, sizeof sc->error,
                     "more than 2 GiB of text in one column, or 2**31 rows in one table");
        return BAD;
    }
    return q;
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
                if (end - q >= 3 && memcmp(q, "\xEF\xBB\xBF", 3) == 0) {
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

static void table_free(Table *t) {
    for (int i = 0; i < t->n_columns; i++) column_free(&t->columns[i]);
}

static void scanner_dealloc(Scanner *sc) {
    for (int i = 0; i < N_TABLES; i++) table_free(&sc->tables[i]);
    for (int k = 0; k < sc->n_keys; k++) free(sc->keys[k]);
    for (int g = 0; g < sc->n_groups; g++) free(sc->group_names[g]);
    free(sc->members);
    buf_free(&sc->scratch);
    Py_TYPE(sc)->tp_free((PyObject *)sc);
}

static char *copy_str(PyObject *obj, Py_ssize_t *len) {
    const char *s = PyUnicode_AsUTF8AndSize(obj, len);
    if (!s) return NULL;
    char *out = malloc((size_t)*len + 1);
    if (!out) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(out, s, (size_t)*len + 1);
    return out;
}

/* groups: a sequence of (column name, "text" | "int" | "id", keys in order of preference). */
static int add_groups(Scanner *sc, PyObject *groups) {
    PyObject *seq = PySequence_Fast(groups, "groups must be a sequence");
    if (!seq) return -1;
    int rc = -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > MAX_GROUPS || FLAT_GROUPS + n > MAX_COLUMNS) {
        PyErr_Format(PyExc_ValueError, "at most %d groups", MAX_GROUPS);
        goto done;
    }
    for (Py_ssize_t g = 0; g < n; g++) {
        PyObject *name, *kind, *keys;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, g), "UUO", &name, &kind, &keys))
            goto done;
        Py_ssize_t len;
        const char *k = PyUnicode_AsUTF8(kind);
        if (!k) goto done;
        int type = strcmp(k, "text") == 0 ? GROUP_TEXT
                   : strcmp(k, "int") == 0 ? GROUP_INT
                   : strcmp(k, "id") == 0  ? GROUP_ID
                                           : -1;
        if (type < 0) {
            PyErr_Format(PyExc_ValueError, "group kind %R: expected text, int or id", kind);
            goto done;
        }
        if (!(sc->group_names[g] = copy_str(name, &len))) goto done;
        sc->group_kinds[g] = type;
        sc->n_groups = (int)g + 1;
        PyObject *kseq = PySequence_Fast(keys, "group keys must be a sequence of str");
        if (!kseq) goto done;
        for (Py_ssize_t r = 0; r < PySequence_Fast_GET_SIZE(kseq); r++) {
            if (sc->n_keys >= MAX_KEYS) {
                PyErr_Format(PyExc_ValueError, "at most %d keys", MAX_KEYS);
                Py_DECREF(kseq);
                goto done;
            }
            char *key = copy_str(PySequence_Fast_GET_ITEM(kseq, r), &len);
            if (!key || len >= 64) {
                if (key) PyErr_Format(PyExc_ValueError, "key %s is longer than 63 bytes", key);
                free(key);
                Py_DECREF(kseq);
                goto done;
            }
            sc->keys[sc->n_keys] = key;
            sc->key_lens[sc->n_keys] = len;
            sc->key_group[sc->n_keys] = (int)g;
            sc->key_rank[sc->n_keys++] = (int)r;
            sc->key_len_mask |= (uint64_t)1 << len;
        }
        Py_DECREF(kseq);
    }
    rc = 0;
done:
    Py_DECREF(seq);
    return rc;
}

static int scanner_init(Scanner *sc, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"groups", NULL};
    PyObject *groups;
    if (sc->n_keys || sc->n_groups || sc->tables[T_SLICES].n_columns) {
        PyErr_SetString(PyExc_RuntimeError, "a Scanner is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &groups)) return -1;
    if (add_groups(sc, groups) < 0) return -1;
    /* Names, categories, phases and series repeat: interned. Args and ids do not. */
    Table *t = sc->tables;
    const char *slice_names[] = {"ph",    "name",   "pid",     "tid",     "cat",
                                 "ts",    "dur_ns", "args_at", "args_len"};
    const int slice_types[] = {DICT, DICT, INT64, INT64, DICT, INT64, INT64, INT64, INT32};
    int rc = 0;
    for (int i = 0; i < S_COLUMNS; i++) rc |= table_add(&t[T_SLICES], slice_names[i], slice_types[i]);
    rc |= table_add(&t[T_FLAT], "row", INT32);
    for (int g = 0; g < sc->n_groups; g++)
        rc |= table_add(&t[T_FLAT], sc->group_names[g],
                        sc->group_kinds[g] == GROUP_TEXT ? TEXT : INT64);
    const char *counter_names[] = {"pid", "tid", "name", "ts"};
    const int counter_types[] = {INT64, INT64, DICT, INT64};
    for (int i = 0; i < K_COLUMNS; i++)
        rc |= table_add(&t[T_COUNTERS], counter_names[i], counter_types[i]);
    rc |= table_add(&t[T_SAMPLES], "event", INT32);
    rc |= table_add(&t[T_SAMPLES], "series", DICT);
    rc |= table_add(&t[T_SAMPLES], "value", FLOAT64);
    const char *other_names[] = {"ph", "name", "pid", "tid", "cat", "id", "ts", "args"};
    const int other_types[] = {TEXT, TEXT, INT64, INT64, TEXT, TEXT, INT64, TEXT};
    for (int i = 0; i < O_COLUMNS; i++)
        rc |= table_add(&t[T_OTHERS], other_names[i], other_types[i]);
    if (rc) return -1;
    return 0;
}

static PyObject *scanner_feed(Scanner *sc, PyObject *args) {
    Py_buffer view;
    int final = 0;
    long long base = 0;
    if (!PyArg_ParseTuple(args, "y*|pL", &view, &final, &base)) return NULL;
    const char *data = view.buf;
    sc->block = data;
    sc->base = base;
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
    Buf buf;
} Owned;

static void owned_dealloc(Owned *o) {
    buf_free(&o->buf);
    Py_TYPE(o)->tp_free((PyObject *)o);
}

static int owned_getbuffer(Owned *o, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)o, o->buf.p ? o->buf.p : "", o->buf.len, 1, flags);
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
    o->buf = *b;
    b->p = NULL;
    b->len = b->cap = 0;
    return (PyObject *)o;
}

static const char *TYPE_NAMES[] = {"text", "int64", "float64", "dict", "int32"};

/* An interned column's strings (n, views, data); the column starts a new dictionary. */
static PyObject *dict_take(Dict *d) {
    PyObject *out = Py_BuildValue("(nNN)", d->n, hand_over(&d->views), hand_over(&d->data));
    free(d->slots);
    free(d->hashes);
    buf_free(&d->scratch);
    memset(d, 0, sizeof *d);
    return out;
}

/* {column: (type, rows, nulls, validity, values or views, data or None)}; the table starts
 * over empty. */
static PyObject *table_take(Table *t) {
    PyObject *out = PyDict_New();
    if (!out) return NULL;
    for (int i = 0; i < t->n_columns; i++) {
        Column *c = &t->columns[i];
        PyObject *extra = c->type == TEXT   ? hand_over(&c->data)
                          : c->type == DICT ? dict_take(c->dict)
                                            : Py_NewRef(Py_None);
        PyObject *col = Py_BuildValue("(snnNNN)", TYPE_NAMES[c->type], t->rows, c->nulls,
                                      hand_over(&c->valid), hand_over(&c->values), extra);
        if (!col || PyDict_SetItemString(out, c->name, col) < 0) {
            Py_XDECREF(col);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(col);
        c->nulls = 0;
    }
    t->rows = 0;
    return out;
}

static PyObject *scanner_take(Scanner *sc, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyDict_New();
    if (!out) return NULL;
    for (int i = 0; i < N_TABLES; i++) {
        Py_ssize_t rows = sc->tables[i].rows;
        PyObject *table = table_take(&sc->tables[i]);
        if (!table || PyDict_SetItemString(out, TABLE_NAMES[i], table) < 0) {
            Py_XDECREF(table);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(table);
        sc->tables[i].before += rows;
    }
    return out;
}

static PyMethodDef scanner_methods[] = {
    {"feed", (PyCFunction)scanner_feed, METH_VARARGS,
     "feed(block, final=False, base=0) -> bytes consumed: parse the complete events of a\n"
     "block, which starts at byte base of the file (for args_at).\n\n"
     "Bytes not consumed (an event cut by the block's end) must lead the next block. Raises\n"
     "ValueError, with the offset in the block, on input this scanner does not read."},
    {"take", (PyCFunction)scanner_take, METH_NOARGS,
     "take() -> {table: {column: (type, rows, nulls, validity, values, extra)}}: the rows\n"
     "parsed since the last take, as Arrow buffers. values are 16-byte views (text), int32\n"
     "codes (dict) or fixed-width values; extra is the text's data, a dict's (n, views, data)\n"
     "or None."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "traceanalyzer.parse._trace_scan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(groups): parse trace_view.json blocks into Arrow columns (a slice's\n"
              "args located in the file: args_at, args_len; read them with args_text).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)scanner_init,
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_methods = scanner_methods,
};

/* args_text(fd, at, lengths, order): the args of some slices as a text column, read from the
 * file the scanner located them in (args_at, args_len: int64 and int32 buffers, at < 0 for
 * none), as JSON text (DuckDB's reader gives the same): an object or array minified, any
 * other value as written.
 * ``order``: the rows by offset (int64). Ranges that lie close together are read with one
 * pread, so a row group costs a few reads of the file, and no more memory than its text. A
 * range the file no longer holds (it changed since) raises ValueError. */
#define RUN_GAP (4 << 10)   /* bytes between two ranges read in one go */
#define RUN_MAX (8 << 20)   /* most bytes read in one go (a longer range is read alone) */
#define CHANGED -3

static int read_at(int fd, Buf *window, int64_t begin, int64_t end) {
    window->len = 0;
    if (buf_grow(window, (Py_ssize_t)(end - begin)) < 0) return -1;
    while (window->len < end - begin) {
        ssize_t got = pread(fd, window->p + window->len, (size_t)(end - begin - window->len),
                            (off_t)(begin + window->len));
        if (got <= 0) return CHANGED;
        window->len += got;
    }
    return 0;
}

static int located_text(int fd, const int64_t *at, const int32_t *lengths, const int64_t *order,
                        Py_ssize_t rows, Buf *valid, Buf *views, Buf *data, Py_ssize_t *nulls) {
    Buf window = {NULL, 0, 0};
    int rc = 0;
    if (buf_grow(valid, (rows + 7) / 8 + 1) < 0 || buf_grow(views, rows * 16 + 1) < 0) return -1;
    memset(valid->p, 0, (size_t)((rows + 7) / 8));
    valid->len = (rows + 7) / 8;
    memset(views->p, 0, (size_t)(rows * 16));
    views->len = rows * 16;
    for (Py_ssize_t i = 0; i < rows && rc == 0;) {
        int64_t row = order[i];
        if (row < 0 || row >= rows || (at[row] >= 0 && lengths[row] < 0)) {
            rc = CHANGED; /* not a row, or a negative length: the caller's columns are wrong */
            break;
        }
        if (at[row] < 0) {
            (*nulls)++;
            i++;
            continue;
        }
        int64_t begin = at[row], end = at[row] + lengths[row];
        Py_ssize_t j = i + 1;
        for (; j < rows; j++) {
            int64_t next = order[j];
            if (next < 0 || next >= rows || lengths[next] < 0 || at[next] < begin) {
                rc = CHANGED; /* not in offset order */
                break;
            }
            int64_t next_end = at[next] + lengths[next];
            if (at[next] - end > RUN_GAP || next_end - begin > RUN_MAX) break;
            if (next_end > end) end = next_end;
        }
        if (rc == 0) rc = read_at(fd, &window, begin, end);
        for (Py_ssize_t k = i; k < j && rc == 0; k++) {
            int64_t r = order[k];
            const char *p = window.p + (at[r] - begin);
            Py_ssize_t n = lengths[r];
            /* JSON text: an object or array minified, any other value as written */
            Span v = {p, n, n && (p[0] == '{' || p[0] == '[') ? COMPOUND : NUMBER, 0};
            Py_ssize_t start = data->len;
            rc = put_text(data, &v);
            if (rc == 0) rc = view_write(views->p + r * 16, data, start);
            valid->p[r / 8] |= (char)(1 << (r % 8));
        }
        i = j;
    }
    buf_free(&window);
    return rc;
}

static PyObject *args_text(PyObject *Py_UNUSED(module), PyObject *args) {
    int fd;
    Py_buffer at, lengths, order;
    if (!PyArg_ParseTuple(args, "iy*y*y*", &fd, &at, &lengths, &order)) return NULL;
    Py_ssize_t rows = at.len / (Py_ssize_t)sizeof(int64_t), nulls = 0;
    Buf valid = {NULL, 0, 0}, views = {NULL, 0, 0}, data = {NULL, 0, 0};
    int rc = CHANGED;
    if (lengths.len == rows * (Py_ssize_t)sizeof(int32_t) &&
        order.len == rows * (Py_ssize_t)sizeof(int64_t)) {
        Py_BEGIN_ALLOW_THREADS
        rc = located_text(fd, at.buf, lengths.buf, order.buf, rows, &valid, &views, &data, &nulls);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&at);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&order);
    if (rc < 0) {
        buf_free(&valid);
        buf_free(&views);
        buf_free(&data);
        if (rc == -1) return PyErr_NoMemory();
        PyErr_SetString(PyExc_ValueError,
                        rc == TOO_LARGE ? "more than 2 GiB of args in one row group"
                                        : "an args range the file does not hold (did it change?)");
        return NULL;
    }
    return Py_BuildValue("(nnNNN)", rows, nulls, hand_over(&valid), hand_over(&views),
                         hand_over(&data));
}

static PyMethodDef module_methods[] = {
    {"args_text", args_text, METH_VARARGS,
     "args_text(fd, args_at, args_len, order) -> (rows, nulls, validity, views, data): the\n"
     "args the scanner located (its slices' args_at, args_len), read from the file; order:\n"
     "the rows by args_at (int64)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_trace_scan",
    .m_doc = "Native trace_view.json scanner (see trace_native.py).",
    .m_size = -1,
    .m_methods = module_methods,
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
