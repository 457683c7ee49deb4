/* The OTLP JSON Lines reader's line scanner in C (tracekit/analysis/_otlp_typed.py, ``scan``).
 *
 * msgspec decodes a line into a tree of typed structs (a struct per attribute and per value,
 * a string per key), which _otlp_typed then turns into Span objects and frees: building and
 * freeing that tree is about half of what reading a span costs. This scanner goes from the
 * line's bytes straight to the Span objects, with the attribute dicts, ids and times the
 * struct path makes, and nothing in between.
 *
 * It is exact by declining: it takes only the shapes tracekit and the OTel SDKs write, and
 * returns None for anything else, and the struct path (then the generic reader) reads that
 * line as before. So it never decides an odd case; it declines:
 *
 * - any string with a backslash escape or a control character; a number too long for the
 *   exact conversions below, or with an exponent anywhere but in a doubleValue;
 * - a span with events, ids that are not canonical (lowercase hex of the right length, not
 *   all zeros), times outside 0 < start <= end, or a parent id equal to its own id;
 * - an attribute value with no field or more than one, a kvlistValue or bytesValue, an
 *   array item that is not a single double, string, int or bool; a value longer than the
 *   reader's limits, more attributes or array items than them;
 * - a null where the struct path would refuse one or read it as a default, a duplicate
 *   member, a ``resource`` after the spans it names, ``instrumentationLibrarySpans``;
 * - anything that is not JSON, or is nested deeper than MAX_DEPTH in a skipped member.
 *
 * What it takes, it converts as the struct path does: values by the same rules (double,
 * string, decimal int text or 64-bit int, bool, arrays of those), keys, names and short texts
 * as shared strings (tracekit.analysis._records: the ``shared`` dict and its ``share`` adder),
 * kinds through the same table, ``service.name`` from the resource. Unknown members are
 * checked as JSON and skipped, as msgspec skips them. The tests run both paths on every case
 * and compare every field and every value's type.
 *
 * Two bounded caches keyed by bytes avoid making a string only to find it in a dict: one for
 * short ASCII texts (keys, names, values; each a shared string), one for ids (a trace's id
 * and a parent's id repeat on each of its spans). A slot holds one string; a collision
 * replaces it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { FAILED = -1, DECLINE = 0, OK = 1 };

#define MAX_DEPTH 64
#define NUMBER_CHARS 40 /* longest number token converted */

static PyObject *span_type, *shared, *share, *kinds, *unspecified, *empty_text;
static Py_ssize_t share_max_chars, max_value_chars, max_attributes, max_array_items;
static PyObject **texts, **ids; /* the caches: ``slots`` each, a power of two */
static Py_ssize_t slots;

typedef struct {
    const char *p, *end;
} Cursor;

typedef struct {
    const char *s;
    Py_ssize_t n;
    int ascii;
} Text;

/* --- tokens ---------------------------------------------------------------------------- */

static inline void
skip_space(Cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t'))
        c->p++;
}

static inline int
peek(Cursor *c, char ch)
{
    skip_space(c);
    return c->p < c->end && *c->p == ch;
}

static inline int
eat(Cursor *c, char ch)
{
    if (peek(c, ch)) {
        c->p++;
        return 1;
    }
    return 0;
}

static inline int
eat_word(Cursor *c, const char *word, Py_ssize_t n)
{
    if (c->end - c->p >= n && memcmp(c->p, word, n) == 0) {
        c->p += n;
        return 1;
    }
    return 0;
}

#define EAT_WORD(c, w) eat_word((c), (w), sizeof(w) - 1)
#define IS(t, w) ((t).n == sizeof(w) - 1 && memcmp((t).s, (w), sizeof(w) - 1) == 0)

/* What a byte means inside a string: 0 plain ASCII, else one of these. */
enum { QUOTE = 1, ESCAPE = 2, HIGH = 3 };
static unsigned char text_class[256];

static void
init_text_class(void)
{
    for (int ch = 0; ch < 256; ch++)
        text_class[ch] = ch < 0x20 || ch == '\\' ? ESCAPE : ch == '"' ? QUOTE : ch >= 0x80 ? HIGH : 0;
}

/* A string without escapes (the cursor at its quote): OK, or DECLINE on an escape or a
 * control character. The line is a bytes object, which ends with a NUL (a control
 * character): the inner loop needs no bounds check. */
static int
scan_text(Cursor *c, Text *t)
{
    if (!peek(c, '"'))
        return DECLINE;
    const unsigned char *s = (const unsigned char *)c->p + 1, *p = s;
    int ascii = 1;
    for (;;) {
        while (!text_class[*p])
            p++;
        if (text_class[*p] == QUOTE)
            break;
        if (text_class[*p] == ESCAPE)
            return DECLINE; /* or the NUL at the end */
        ascii = 0;
        p++;
    }
    t->s = (const char *)s;
    t->n = p - s;
    t->ascii = ascii;
    c->p = (const char *)p + 1;
    return OK;
}

/* A JSON number (with an exponent only where ``exponent`` allows): its length, or 0.
 * ``*integral``: no fraction, no exponent. */
static Py_ssize_t
scan_number(Cursor *c, int *integral, int exponent)
{
    skip_space(c);
    const char *p = c->p, *end = c->end;
    if (p < end && *p == '-')
        p++;
    if (p >= end || *p < '0' || *p > '9')
        return 0;
    if (*p == '0')
        p++;
    else
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    *integral = 1;
    if (p < end && *p == '.') {
        *integral = 0;
        const char *digits = ++p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == digits)
            return 0;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        if (!exponent)
            return 0;
        *integral = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        const char *digits = p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == digits)
            return 0;
    }
    Py_ssize_t n = p - c->p;
    if (n > NUMBER_CHARS)
        return 0;
    return n;
}

/* Decimal digits (an optional '-' when ``sign``) as a 64-bit value: 1, or 0 if not one. */
static int
decimal(const char *s, Py_ssize_t n, int sign, unsigned long long *magnitude, int *negative)
{
    *negative = 0;
    if (sign && n > 0 && *s == '-') {
        *negative = 1;
        s++;
        n--;
    }
    if (n < 1 || n > 20)
        return 0;
    unsigned long long v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (d > 9 || v > (ULLONG_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    *magnitude = v;
    return 1;
}

/* A signed 64-bit integer (msgspec's int range for JSON numbers, and what the struct path's
 * int() of a text gives on canonical digits): OK with a new int, DECLINE, or FAILED. */
static int
int64_of(const char *s, Py_ssize_t n, PyObject **out)
{
    unsigned long long v;
    int negative;
    if (!decimal(s, n, 1, &v, &negative))
        return DECLINE;
    if (negative ? v > (unsigned long long)LLONG_MAX + 1 : v > (unsigned long long)LLONG_MAX)
        return DECLINE;
    long long x = negative ? (long long)(0 - v) : (long long)v;
    return (*out = PyLong_FromLongLong(x)) ? OK : FAILED;
}

/* The value of a skipped member, checked as JSON. */
static int
skip_value(Cursor *c, int depth)
{
    if (depth > MAX_DEPTH)
        return DECLINE;
    skip_space(c);
    if (c->p >= c->end)
        return DECLINE;
    Text t;
    int integral, r;
    switch (*c->p) {
    case '"':
        return scan_text(c, &t);
    case '{':
        c->p++;
        if (eat(c, '}'))
            return OK;
        do {
            if ((r = scan_text(c, &t)) != OK)
                return r;
            if (!eat(c, ':'))
                return DECLINE;
            if ((r = skip_value(c, depth + 1)) != OK)
                return r;
        } while (eat(c, ','));
        return eat(c, '}') ? OK : DECLINE;
    case '[':
        c->p++;
        if (eat(c, ']'))
            return OK;
        do {
            if ((r = skip_value(c, depth + 1)) != OK)
                return r;
        } while (eat(c, ','));
        return eat(c, ']') ? OK : DECLINE;
    case 't':
        return EAT_WORD(c, "true") ? OK : DECLINE;
    case 'f':
        return EAT_WORD(c, "false") ? OK : DECLINE;
    case 'n':
        return EAT_WORD(c, "null") ? OK : DECLINE;
    default: {
        Py_ssize_t n = scan_number(c, &integral, 0);
        if (n == 0)
            return DECLINE;
        c->p += n;
        return OK;
    }
    }
}

/* Members of an object: ``first`` starts at 1 with the cursor at '{'. OK with the next key
 * (and its ':' eaten), DECLINE on bad JSON; ``*done`` once the closing '}' is eaten. */
static int
next_member(Cursor *c, int *first, Text *key, int *done)
{
    *done = 0;
    if (*first) {
        *first = 0;
        if (!eat(c, '{'))
            return DECLINE;
        if (eat(c, '}')) {
            *done = 1;
            return OK;
        }
    }
    else if (!eat(c, ',')) {
        if (eat(c, '}')) {
            *done = 1;
            return OK;
        }
        return DECLINE;
    }
    if (scan_text(c, key) != OK || !eat(c, ':'))
        return DECLINE;
    return OK;
}

/* Items of an array, likewise: OK with the cursor at the next item, or ``*done``. */
static int
next_item(Cursor *c, int *first, int *done)
{
    *done = 0;
    if (*first) {
        *first = 0;
        if (!eat(c, '['))
            return DECLINE;
        if (eat(c, ']'))
            *done = 1;
        return OK;
    }
    if (eat(c, ','))
        return OK;
    if (eat(c, ']')) {
        *done = 1;
        return OK;
    }
    return DECLINE;
}

/* --- strings ----------------------------------------------------------------------------- */

/* A cache slot's hash: the length and the first and last eight bytes (ids are random hex,
 * texts differ at their ends; a collision only costs a miss). */
static inline uint32_t
hash_bytes(const char *s, Py_ssize_t n)
{
    uint64_t head = 0, tail = 0;
    if (n >= 8) {
        memcpy(&head, s, 8);
        memcpy(&tail, s + n - 8, 8);
    }
    else {
        for (Py_ssize_t i = 0; i < n; i++)
            head = (head << 8) | (unsigned char)s[i];
    }
    uint64_t h = head * 0x9E3779B97F4A7C15ull ^ tail * 0xC2B2AE3D27D4EB4Full ^ (uint64_t)n;
    return (uint32_t)(h >> 29) ^ (uint32_t)h;
}

static PyObject *
ascii_text(const char *s, Py_ssize_t n)
{
    PyObject *text = PyUnicode_New(n, 127);
    if (text != NULL)
        memcpy(PyUnicode_DATA(text), s, n);
    return text;
}

/* The shared string equal to ``text`` (stolen): a new reference, or NULL with an exception. */
static PyObject *
shared_text(PyObject *text)
{
    PyObject *hit = PyDict_GetItemWithError(shared, text); /* borrowed */
    if (hit != NULL) {
        Py_INCREF(hit);
        Py_DECREF(text);
        return hit;
    }
    if (PyErr_Occurred()) {
        Py_DECREF(text);
        return NULL;
    }
    PyObject *out = PyObject_CallOneArg(share, text);
    Py_DECREF(text);
    return out;
}

/* ASCII bytes through ``cache``: a new reference, or NULL with an exception. */
static PyObject *
cached(PyObject **cache, const char *s, Py_ssize_t n, int sharing)
{
    PyObject **slot = &cache[hash_bytes(s, n) & (slots - 1)];
    PyObject *hit = *slot;
    if (hit != NULL && PyUnicode_GET_LENGTH(hit) == n && memcmp(PyUnicode_DATA(hit), s, n) == 0)
        return Py_NewRef(hit);
    PyObject *text = ascii_text(s, n);
    if (text != NULL && sharing)
        text = shared_text(text);
    if (text != NULL)
        Py_XSETREF(*slot, Py_NewRef(text));
    return text;
}

/* A text as the struct path makes it: shared when short, limited to ``limit`` characters
 * (-1: none). OK with a new reference, DECLINE, or FAILED. */
static int
text_of(const Text *t, Py_ssize_t limit, PyObject **out)
{
    if (t->ascii) {
        if (limit >= 0 && t->n > limit)
            return DECLINE;
        *out = t->n <= share_max_chars ? cached(texts, t->s, t->n, 1) : ascii_text(t->s, t->n);
        return *out ? OK : FAILED;
    }
    PyObject *text = PyUnicode_DecodeUTF8(t->s, t->n, "strict");
    if (text == NULL) { /* the caller checked the line's UTF-8: not expected */
        PyErr_Clear();
        return DECLINE;
    }
    Py_ssize_t chars = PyUnicode_GET_LENGTH(text);
    if (limit >= 0 && chars > limit) {
        Py_DECREF(text);
        return DECLINE;
    }
    *out = chars <= share_max_chars ? shared_text(text) : text;
    return *out ? OK : FAILED;
}

/* A canonical id: ``width`` lowercase hex digits, not all zeros. */
static int
canonical_id(const Text *t, Py_ssize_t width)
{
    if (t->n != width)
        return 0;
    int nonzero = 0;
    for (Py_ssize_t i = 0; i < width; i++) {
        char ch = t->s[i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
            return 0;
        nonzero |= ch != '0';
    }
    return nonzero;
}

/* --- values ------------------------------------------------------------------------------ */

/* A doubleValue: a number as a float. msgspec and float() both round correctly; an integral
 * token goes through the exact integer range only (and never "-0"). */
static int
double_of(Cursor *c, PyObject **out)
{
    int integral;
    Py_ssize_t n = scan_number(c, &integral, 1);
    if (n == 0 || (integral && (n > 15 || (n == 2 && c->p[0] == '-'))))
        return DECLINE;
    char digits[NUMBER_CHARS + 1];
    memcpy(digits, c->p, n);
    digits[n] = '\0';
    char *stop;
    double x = PyOS_string_to_double(digits, &stop, NULL);
    if (x == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return DECLINE;
    }
    if (stop != digits + n || !isfinite(x))
        return DECLINE;
    c->p += n;
    return (*out = PyFloat_FromDouble(x)) ? OK : FAILED;
}

/* An intValue: decimal text or a JSON integer, within 64 bits. */
static int
int_of(Cursor *c, PyObject **out)
{
    Text t;
    if (peek(c, '"')) {
        if (scan_text(c, &t) != OK)
            return DECLINE;
        return int64_of(t.s, t.n, out);
    }
    int integral;
    Py_ssize_t n = scan_number(c, &integral, 0);
    if (n == 0 || !integral)
        return DECLINE;
    int r = int64_of(c->p, n, out);
    if (r == OK)
        c->p += n;
    return r;
}

static int
bool_of(Cursor *c, PyObject **out)
{
    skip_space(c);
    if (EAT_WORD(c, "true"))
        *out = Py_NewRef(Py_True);
    else if (EAT_WORD(c, "false"))
        *out = Py_NewRef(Py_False);
    else
        return DECLINE;
    return OK;
}

/* A value object with exactly one of the fields below (an array item: no arrayValue). */
static int
value_of(Cursor *c, int array_allowed, PyObject **out);

/* An arrayValue object: its ``values`` as a list (none or null: empty). */
static int
array_of(Cursor *c, PyObject **out)
{
    PyObject *items = NULL;
    int first = 1, done, r;
    Text key;
    while ((r = next_member(c, &first, &key, &done)) == OK && !done) {
        if (!IS(key, "values")) {
            r = skip_value(c, 0);
        }
        else if (items != NULL) {
            r = DECLINE; /* a duplicate */
        }
        else if ((items = PyList_New(0)) == NULL) {
            r = FAILED;
        }
        else if (skip_space(c), EAT_WORD(c, "null")) {
            r = OK;
        }
        else {
            int item_first = 1, item_done;
            while ((r = next_item(c, &item_first, &item_done)) == OK && !item_done) {
                PyObject *x;
                if (PyList_GET_SIZE(items) >= max_array_items)
                    r = DECLINE;
                else if ((r = value_of(c, 0, &x)) == OK) {
                    r = PyList_Append(items, x) < 0 ? FAILED : OK;
                    Py_DECREF(x);
                }
                if (r != OK)
                    break;
            }
        }
        if (r != OK)
            break;
    }
    if (r != OK) {
        Py_XDECREF(items);
        return r;
    }
    *out = items != NULL ? items : PyList_New(0);
    return *out ? OK : FAILED;
}

static int
value_of(Cursor *c, int array_allowed, PyObject **out)
{
    PyObject *x = NULL;
    int first = 1, done, r;
    Text key;
    while ((r = next_member(c, &first, &key, &done)) == OK && !done) {
        if (x != NULL)
            r = DECLINE; /* a second field: the struct path's order of precedence decides */
        else if (IS(key, "doubleValue"))
            r = double_of(c, &x);
        else if (IS(key, "stringValue")) {
            Text t;
            r = scan_text(c, &t);
            if (r == OK)
                r = text_of(&t, max_value_chars, &x);
        }
        else if (IS(key, "intValue"))
            r = int_of(c, &x);
        else if (IS(key, "boolValue"))
            r = bool_of(c, &x);
        else if (array_allowed && IS(key, "arrayValue"))
            r = array_of(c, &x);
        else
            r = DECLINE; /* kvlistValue, bytesValue, or a member the structs forbid */
        if (r != OK)
            break;
    }
    if (r == OK && x == NULL)
        r = DECLINE; /* an empty value: the struct path leaves the attribute out */
    if (r != OK) {
        Py_XDECREF(x);
        return r;
    }
    *out = x;
    return OK;
}

/* Put the ``*held`` pairs into ``*dict`` (made presized for them when there is none yet),
 * releasing them whatever happens. */
#define PAIRS 32
static int
put_pairs(PyObject **dict, PyObject **pairs, Py_ssize_t *held)
{
    int r = OK;
    if (*dict == NULL && (*dict = _PyDict_NewPresized(*held)) == NULL)
        r = FAILED;
    for (Py_ssize_t i = 0; i < *held; i++) {
        if (r == OK && PyDict_SetItem(*dict, pairs[2 * i], pairs[2 * i + 1]) < 0)
            r = FAILED;
        Py_DECREF(pairs[2 * i]);
        Py_DECREF(pairs[2 * i + 1]);
    }
    *held = 0;
    return r;
}

/* An attribute list (null: none) into a new dict. The pairs wait in a buffer so that the
 * dict is made at its final size (growing it key by key would resize it twice). */
static int
attributes_of(Cursor *c, PyObject **out)
{
    PyObject *dict = NULL, *pairs[2 * PAIRS];
    Py_ssize_t count = 0, held = 0;
    int first = 1, done, r = OK;
    skip_space(c);
    if (!EAT_WORD(c, "null")) {
        while ((r = next_item(c, &first, &done)) == OK && !done) {
            PyObject *key = NULL, *value = NULL;
            int member_first = 1, member_done;
            Text name;
            if (++count > max_attributes)
                r = DECLINE;
            while (r == OK && (r = next_member(c, &member_first, &name, &member_done)) == OK
                   && !member_done) {
                if (IS(name, "key")) {
                    Text t;
                    r = key != NULL ? DECLINE : scan_text(c, &t);
                    if (r == OK)
                        r = text_of(&t, -1, &key);
                }
                else if (IS(name, "value"))
                    r = value != NULL ? DECLINE : value_of(c, 1, &value);
                else
                    r = skip_value(c, 0);
            }
            if (r == OK && (key == NULL || value == NULL))
                r = DECLINE;
            if (r != OK) {
                Py_XDECREF(key);
                Py_XDECREF(value);
                break;
            }
            pairs[2 * held] = key;
            pairs[2 * held + 1] = value;
            if (++held == PAIRS && (r = put_pairs(&dict, pairs, &held)) != OK)
                break;
        }
    }
    int put = put_pairs(&dict, pairs, &held); /* the last duplicate key wins, as in order */
    if (r == OK)
        r = put;
    if (r != OK) {
        Py_XDECREF(dict);
        return r;
    }
    *out = dict;
    return OK;
}

/* --- spans ------------------------------------------------------------------------------- */

/* A time: decimal text of at most 2**64 - 1, or a JSON integer within 64 bits. */
static int
time_of(Cursor *c, unsigned long long *out)
{
    Text t;
    int negative, integral;
    if (peek(c, '"')) {
        if (scan_text(c, &t) != OK || !decimal(t.s, t.n, 0, out, &negative))
            return DECLINE;
        return OK;
    }
    Py_ssize_t n = scan_number(c, &integral, 0);
    if (n == 0 || !integral || !decimal(c->p, n, 1, out, &negative) || negative
            || *out > (unsigned long long)LLONG_MAX)
        return DECLINE;
    c->p += n;
    return OK;
}

/* A span's kind: an int or a name through the kinds table, null or unknown: unspecified. */
static int
kind_of(Cursor *c, PyObject **out)
{
    PyObject *raw = NULL;
    Text t;
    int r;
    skip_space(c);
    if (EAT_WORD(c, "null")) {
        *out = Py_NewRef(unspecified);
        return OK;
    }
    if (peek(c, '"')) {
        if ((r = scan_text(c, &t)) != OK || (r = text_of(&t, -1, &raw)) != OK)
            return r;
    }
    else if ((r = int_of(c, &raw)) != OK)
        return r;
    PyObject *name = PyDict_GetItemWithError(kinds, raw); /* borrowed */
    Py_DECREF(raw);
    if (name == NULL && PyErr_Occurred())
        return FAILED;
    *out = Py_NewRef(name != NULL ? name : unspecified);
    return OK;
}

/* A status object (null: none): whether its code is ERROR (2 or its name). */
static int
error_of(Cursor *c, int *error)
{
    *error = 0;
    skip_space(c);
    if (EAT_WORD(c, "null"))
        return OK;
    int first = 1, done, r, seen = 0;
    Text key;
    while ((r = next_member(c, &first, &key, &done)) == OK && !done) {
        if (!IS(key, "code")) {
            r = skip_value(c, 0);
        }
        else if (seen++) {
            r = DECLINE;
        }
        else if (skip_space(c), EAT_WORD(c, "null")) {
            r = OK;
        }
        else if (peek(c, '"')) {
            Text t;
            r = scan_text(c, &t);
            *error = r == OK && IS(t, "STATUS_CODE_ERROR");
        }
        else {
            int integral;
            Py_ssize_t n = scan_number(c, &integral, 0);
            unsigned long long v;
            int negative;
            if (n == 0 || !integral || !decimal(c->p, n, 1, &v, &negative)
                    || v > (unsigned long long)LLONG_MAX)
                r = DECLINE;
            else {
                *error = !negative && v == 2;
                c->p += n;
            }
        }
        if (r != OK)
            return r;
    }
    return r;
}

enum {
    TRACE_ID = 1, SPAN_ID = 2, PARENT_ID = 4, NAME = 8, KIND = 16, START = 32, END = 64,
    ATTRIBUTES = 128, STATUS = 256,
};

/* One span object into a new Span. */
static int
span_of(Cursor *c, PyObject *service, PyObject **out)
{
    PyObject *trace = NULL, *span = NULL, *parent = NULL, *name = NULL, *kind = NULL;
    PyObject *attributes = NULL;
    unsigned long long start = 0, end = 0;
    int error = 0, seen = 0, first = 1, done, r;
    Text key, t;
    while ((r = next_member(c, &first, &key, &done)) == OK && !done) {
        int field;
        if (IS(key, "traceId"))
            field = TRACE_ID;
        else if (IS(key, "spanId"))
            field = SPAN_ID;
        else if (IS(key, "parentSpanId"))
            field = PARENT_ID;
        else if (IS(key, "name"))
            field = NAME;
        else if (IS(key, "kind"))
            field = KIND;
        else if (IS(key, "startTimeUnixNano"))
            field = START;
        else if (IS(key, "endTimeUnixNano"))
            field = END;
        else if (IS(key, "attributes"))
            field = ATTRIBUTES;
        else if (IS(key, "status"))
            field = STATUS;
        else if (IS(key, "events")) {
            r = DECLINE; /* rare in tracekit's spans: the struct path converts them */
            break;
        }
        else {
            if ((r = skip_value(c, 0)) != OK)
                break;
            continue;
        }
        if (seen & field) {
            r = DECLINE;
            break;
        }
        seen |= field;
        switch (field) {
        case TRACE_ID:
        case SPAN_ID:
            if ((r = scan_text(c, &t)) != OK)
                break;
            if (!canonical_id(&t, field == TRACE_ID ? 32 : 16))
                r = DECLINE;
            else if ((*(field == TRACE_ID ? &trace : &span) = cached(ids, t.s, t.n, 0)) == NULL)
                r = FAILED;
            break;
        case PARENT_ID:
            skip_space(c);
            if (EAT_WORD(c, "null"))
                break;
            if ((r = scan_text(c, &t)) != OK || t.n == 0)
                break; /* "": no parent */
            if (t.n == 16 && memcmp(t.s, "0000000000000000", 16) == 0)
                break; /* all zeros: no parent */
            if (!canonical_id(&t, 16))
                r = DECLINE;
            else if ((parent = cached(ids, t.s, t.n, 0)) == NULL)
                r = FAILED;
            break;
        case NAME:
            if ((r = scan_text(c, &t)) == OK)
                r = text_of(&t, -1, &name);
            break;
        case KIND:
            r = kind_of(c, &kind);
            break;
        case START:
            r = time_of(c, &start);
            break;
        case END:
            r = time_of(c, &end);
            break;
        case ATTRIBUTES:
            r = attributes_of(c, &attributes);
            break;
        case STATUS:
            r = error_of(c, &error);
            break;
        }
        if (r != OK)
            break;
    }
    if (r == OK && ((seen & (TRACE_ID | SPAN_ID | START | END)) != (TRACE_ID | SPAN_ID | START | END)
                    || start == 0 || start > end))
        r = DECLINE;
    if (r == OK && parent != NULL
            && memcmp(PyUnicode_DATA(parent), PyUnicode_DATA(span), 16) == 0)
        r = DECLINE; /* its own parent */
    if (r == OK) {
        PyObject *events = PyList_New(0);
        PyObject *start_ns = PyLong_FromUnsignedLongLong(start);
        PyObject *end_ns = PyLong_FromUnsignedLongLong(end);
        if (attributes == NULL)
            attributes = PyDict_New();
        if (events && start_ns && end_ns && attributes) {
            PyObject *args[11] = {
                trace, span, parent != NULL ? parent : Py_None,
                name != NULL ? name : empty_text,
                kind != NULL ? kind : unspecified, /* absent: 0, unspecified */
                start_ns, end_ns, service, attributes, error ? Py_True : Py_False, events,
            };
            *out = PyObject_Vectorcall(span_type, args, 11, NULL);
        }
        else
            *out = NULL;
        if (*out == NULL)
            r = FAILED;
        Py_XDECREF(events);
        Py_XDECREF(start_ns);
        Py_XDECREF(end_ns);
    }
    Py_XDECREF(trace);
    Py_XDECREF(span);
    Py_XDECREF(parent);
    Py_XDECREF(name);
    Py_XDECREF(kind);
    Py_XDECREF(attributes);
    return r;
}

/* A scope object: its spans appended to ``spans``. */
static int
scope_of(Cursor *c, PyObject *service, PyObject *spans)
{
    int first = 1, done, r, seen = 0;
    Text key;
    while ((r = next_member(c, &first, &key, &done)) == OK && !done) {
        if (!IS(key, "spans")) {
            r = skip_value(c, 0);
        }
        else if (seen++) {
            r = DECLINE;
        }
        else if (skip_space(c), EAT_WORD(c, "null")) {
            r = OK;
        }
        else {
            int item_first = 1, item_done;
            while ((r = next_item(c, &item_first, &item_done)) == OK && !item_done) {
                PyObject *span;
                if ((r = span_of(c, service, &span)) != OK)
                    break;
                r = PyList_Append(spans, span) < 0 ? FAILED : OK;
                Py_DECREF(span);
                if (r != OK)
                    break;
            }
        }
        if (r != OK)
            return r;
    }
    return r;
}

/* A resource object: its service.name (none: ""). */
static int
service_of(Cursor *c, PyObject **out)
{
    PyObject *attributes = NULL;
    int first = 1, done, r;
    Text key;
    skip_space(c);
    if (EAT_WORD(c, "null")) {
        *out = Py_NewRef(empty_text);
        return OK;
    }
    while ((r = next_member(c, &first, &key, &done)) == OK && !done) {
        if (!IS(key, "attributes"))
            r = skip_value(c, 0);
        else if (attributes != NULL)
            r = DECLINE;
        else
            r = attributes_of(c, &attributes);
        if (r != OK)
            break;
    }
    PyObject *name = NULL;
    if (r == OK && attributes != NULL) {
        name = PyDict_GetItemString(attributes, "service.name"); /* borrowed */
        if (name != NULL && !PyUnicode_CheckExact(name))
            r = DECLINE; /* the struct path converts it with str() */
    }
    if (r == OK)
        *out = Py_NewRef(name != NULL ? name : empty_text);
    Py_XDECREF(attributes);
    return r;
}

/* A resourceSpans object: the spans of its scopes, with its service. */
static int
resource_spans_of(Cursor *c, PyObject *spans)
{
    PyObject *service = NULL;
    int first = 1, done, r, scopes_seen = 0;
    Text key;
    while ((r = next_member(c, &first, &key, &done)) == OK && !done) {
        if (IS(key, "resource")) {
            /* after the scopes (their spans were made without it) or a duplicate */
            r = scopes_seen || service != NULL ? DECLINE : service_of(c, &service);
        }
        else if (IS(key, "scopeSpans")) {
            if (scopes_seen++) {
                r = DECLINE;
            }
            else if (skip_space(c), EAT_WORD(c, "null")) {
                r = OK;
            }
            else {
                if (service == NULL)
                    service = Py_NewRef(empty_text);
                int item_first = 1, item_done;
                while ((r = next_item(c, &item_first, &item_done)) == OK && !item_done)
                    if ((r = scope_of(c, service, spans)) != OK)
                        break;
            }
        }
        else if (IS(key, "instrumentationLibrarySpans")) {
            r = DECLINE;
        }
        else {
            r = skip_value(c, 0);
        }
        if (r != OK)
            break;
    }
    Py_XDECREF(service);
    return r;
}

PyDoc_STRVAR(scan_doc,
"scan(line) -> list[Span] | None\n\n"
"The spans of one OTLP JSON line (a TracesData), or None when the struct path must read it\n"
"(see the module comment).");

static PyObject *
scan(PyObject *module, PyObject *line)
{
    if (span_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (!PyBytes_CheckExact(line))
        Py_RETURN_NONE;
    Cursor c = {PyBytes_AS_STRING(line), PyBytes_AS_STRING(line) + PyBytes_GET_SIZE(line)};
    PyObject *spans = PyList_New(0);
    if (spans == NULL)
        return NULL;
    int first = 1, done, r, seen = 0;
    Text key;
    while ((r = next_member(&c, &first, &key, &done)) == OK && !done) {
        if (!IS(key, "resourceSpans")) {
            r = skip_value(&c, 0);
        }
        else if (seen++ || (skip_space(&c), c.p < c.end && *c.p == 'n')) {
            r = DECLINE; /* a duplicate, or null */
        }
        else {
            int item_first = 1, item_done;
            while ((r = next_item(&c, &item_first, &item_done)) == OK && !item_done)
                if ((r = resource_spans_of(&c, spans)) != OK)
                    break;
        }
        if (r != OK)
            break;
    }
    skip_space(&c);
    if (r == OK && (!seen || c.p != c.end))
        r = DECLINE; /* no resourceSpans (an envelope, another format), or trailing bytes */
    if (r != OK) {
        Py_DECREF(spans);
        if (r == FAILED)
            return NULL;
        Py_RETURN_NONE;
    }
    return spans;
}

PyDoc_STRVAR(configure_doc,
"configure(span_type, shared, share, kinds, share_max_chars, max_value_chars, max_attributes,\n"
"          max_array_items, cache_slots) -> None\n\n"
"Set the Span type, the shared-string table and its Python adder, the kinds table, the\n"
"reader's limits, and the slots of each cache (a power of two); empties the caches.");

static void
clear_caches(void)
{
    for (Py_ssize_t i = 0; i < slots; i++) {
        Py_CLEAR(texts[i]);
        Py_CLEAR(ids[i]);
    }
    PyMem_Free(texts);
    PyMem_Free(ids);
    texts = ids = NULL;
    slots = 0;
}

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "configure() takes 9 arguments");
        return NULL;
    }
    if (!PyType_Check(args[0]) || !PyDict_CheckExact(args[1]) || !PyCallable_Check(args[2])
            || !PyDict_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "configure(): expected a type, a dict, a callable, a dict");
        return NULL;
    }
    Py_ssize_t limits[5];
    for (int i = 0; i < 5; i++) {
        limits[i] = PyLong_AsSsize_t(args[4 + i]);
        if (limits[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    if (limits[4] < 1 || limits[4] > (1 << 20) || (limits[4] & (limits[4] - 1))) {
        PyErr_SetString(PyExc_ValueError, "configure(): cache_slots must be a power of two");
        return NULL;
    }
    PyObject *unknown = PyUnicode_InternFromString("unspecified");
    PyObject *empty = PyUnicode_New(0, 127);
    if (unknown == NULL || empty == NULL) {
        Py_XDECREF(unknown);
        Py_XDECREF(empty);
        return NULL;
    }
    clear_caches();
    texts = PyMem_Calloc(limits[4], sizeof(PyObject *));
    ids = PyMem_Calloc(limits[4], sizeof(PyObject *));
    if (texts == NULL || ids == NULL) {
        PyMem_Free(texts);
        PyMem_Free(ids);
        texts = ids = NULL;
        Py_DECREF(unknown);
        Py_DECREF(empty);
        return PyErr_NoMemory();
    }
    slots = limits[4];
    Py_XSETREF(span_type, Py_NewRef(args[0]));
    Py_XSETREF(shared, Py_NewRef(args[1]));
    Py_XSETREF(share, Py_NewRef(args[2]));
    Py_XSETREF(kinds, Py_NewRef(args[3]));
    Py_XSETREF(unspecified, unknown);
    Py_XSETREF(empty_text, empty);
    share_max_chars = limits[0];
    max_value_chars = limits[1];
    max_attributes = limits[2];
    max_array_items = limits[3];
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, configure_doc},
    {"scan", scan, METH_O, scan_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_otlp_scan",
    "The OTLP reader's line scanner in C (see tracekit/analysis/_otlp_scan.c).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__otlp_scan(void)
{
    init_text_class();
    return PyModule_Create(&module);
}
