/* Compiled helpers of the publish path (optional: messagebox/ids.py falls back).
 *
 * A publish makes a version-7 UUID for every message and part, writes every UUID column
 * (on DuckDB) as one buffer of 16 bytes a value, tags every property of every context
 * with its type (and writes the common context as its JSON text), and returns a frozen Routed result for every message. In Python each costs a few attribute sets, an int.to_bytes
 * call or a dict lookup per value. Here they are loops in C. The UUIDs made are
 * ordinary uuid.UUID objects, with `int` and `is_safe` set through the slots as
 * uuid.UUID's constructor sets them. ids.py's and properties.py's Python code is the
 * reference, and the tests hold the two equal.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>
#include <string.h>

static PyObject *uuid_type = NULL; /* uuid.UUID */
static PyObject *is_safe = NULL;   /* uuid.SafeUUID.unknown */
static PyObject *str_int = NULL;   /* "int" */
static PyObject *str_is_safe = NULL;
static PyObject *utc = NULL;       /* datetime.UTC */
static PyObject *encode_value = NULL; /* properties.encode_value, for other values */
static PyObject *tag_b, *tag_i, *tag_f, *tag_s, *tag_d;
static PyObject *str_message_id, *str_outcome, *str_subscriptions;
static PyObject *str_promoted, *str_written, *str_parts, *str_body_part; /* Message's */

/* 0 if `needed` (set by the setup function named) is set; else -1 with an exception. */
static int
set_up(PyObject *needed, const char *setup_name)
{
    if (needed != NULL)
        return 0;
    PyErr_Format(PyExc_RuntimeError, "messagebox._native.%s was not called", setup_name);
    return -1;
}

static PyObject *
int_from_bytes(const unsigned char *b)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyLong_FromUnsignedNativeBytes(b, 16, Py_ASNATIVEBYTES_BIG_ENDIAN);
#else
    return _PyLong_FromByteArray(b, 16, 0, 0);
#endif
}

/* The 16 big-endian bytes of a non-negative int below 2**128; -1 with an exception. */
static int
int_to_bytes(PyObject *v, unsigned char *out)
{
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "a UUID's int is %.100s, not int", Py_TYPE(v)->tp_name);
        return -1;
    }
#if PY_VERSION_HEX >= 0x030D0000
    Py_ssize_t n = PyLong_AsNativeBytes(
        v, out, 16, Py_ASNATIVEBYTES_BIG_ENDIAN | Py_ASNATIVEBYTES_UNSIGNED_BUFFER |
                        Py_ASNATIVEBYTES_REJECT_NEGATIVE);
    if (n < 0)
        return -1;
    if (n > 16) {
        PyErr_SetString(PyExc_OverflowError, "a UUID's int is over 128 bits");
        return -1;
    }
    return 0;
#else
    return _PyLong_AsByteArray((PyLongObject *)v, out, 16, 0, 0);
#endif
}

PyDoc_STRVAR(setup_doc, "setup(uuid_type, is_safe): the uuid.UUID type and SafeUUID.unknown.");

static PyObject *
setup(PyObject *self, PyObject *args)
{
    PyObject *type, *safe;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &type, &safe))
        return NULL;
    Py_INCREF(type);
    Py_XSETREF(uuid_type, type);
    Py_INCREF(safe);
    Py_XSETREF(is_safe, safe);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(setup_values_doc,
             "setup_values(utc, encode_value): datetime.UTC and properties.encode_value.");

static PyObject *
setup_values(PyObject *self, PyObject *args)
{
    PyObject *tz, *fn;
    if (!PyArg_ParseTuple(args, "OO", &tz, &fn))
        return NULL;
    Py_INCREF(tz);
    Py_XSETREF(utc, tz);
    Py_INCREF(fn);
    Py_XSETREF(encode_value, fn);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(typed_doc,
             "typed(props) -> dict: each value as [tag, value] (properties._typed): a bool,\n"
             "int, float or str (exact types) tagged b, i, f, s; a datetime in UTC d; any\n"
             "other through encode_value.");

static PyObject *
typed(PyObject *self, PyObject *props)
{
    if (set_up(encode_value, "setup_values") < 0)
        return NULL;
    if (!PyDict_Check(props)) {
        PyErr_Format(PyExc_TypeError, "typed takes a dict, not %.100s", Py_TYPE(props)->tp_name);
        return NULL;
    }
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(props, &pos, &key, &value)) {
        PyObject *tag = NULL;
        if (PyBool_Check(value))
            tag = tag_b;
        else if (PyLong_CheckExact(value))
            tag = tag_i;
        else if (PyFloat_CheckExact(value))
            tag = tag_f;
        else if (PyUnicode_CheckExact(value))
            tag = tag_s;
        else if (PyDateTime_CheckExact(value) && PyDateTime_DATE_GET_TZINFO(value) == utc)
            tag = tag_d;
        PyObject *pair;
        if (tag != NULL) {
            pair = PyList_New(2);
            if (pair == NULL)
                goto fail;
            Py_INCREF(tag);
            PyList_SET_ITEM(pair, 0, tag);
            Py_INCREF(value);
            PyList_SET_ITEM(pair, 1, value);
        }
        else {
            pair = PyObject_CallOneArg(encode_value, value);
            if (pair == NULL)
                goto fail;
        }
        int failed = PyDict_SetItem(out, key, pair);
        Py_DECREF(pair);
        if (failed < 0)
            goto fail;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* A growing byte buffer for context_json: on the stack until it outgrows it. */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
    char stack[1024];
} Buf;

static int
buf_put(Buf *b, const char *s, Py_ssize_t n)
{
    if (b->len + n > b->cap) {
        Py_ssize_t cap = (b->len + n) * 2;
        char *grown = PyMem_Malloc(cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(grown, b->data, b->len);
        if (b->data != b->stack)
            PyMem_Free(b->data);
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return 0;
}

#define PUT(b, lit) buf_put((b), (lit), (Py_ssize_t)(sizeof(lit) - 1))

/* A str written between quotes as it is: printable ASCII without '"' or '\\' (JSON
 * needs no escape for it, and orjson writes it so); 1 if written, 0 if not plain. */
static int
put_plain_str(Buf *b, PyObject *s, int *failed)
{
    if (!PyUnicode_CheckExact(s) || !PyUnicode_IS_ASCII(s))
        return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    const char *c = (const char *)PyUnicode_1BYTE_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++)
        if (c[i] < 0x20 || c[i] == '"' || c[i] == '\\' || c[i] == 0x7f)
            return 0;
    if (PUT(b, "\"") < 0 || buf_put(b, c, n) < 0 || PUT(b, "\"") < 0) {
        *failed = 1;
        return 0;
    }
    return 1;
}

/* `width` decimal digits of 0 <= x < 10**width at d; the end of them. */
static char *
digits(char *d, int x, int width)
{
    for (int i = width - 1; i >= 0; i--) {
        d[i] = (char)('0' + x % 10);
        x /= 10;
    }
    return d + width;
}

/* One value as ["tag",value]; 1 if written, 0 if not plain (the caller falls back),
 * -1 on error. */
static int
put_value(Buf *b, PyObject *v)
{
    char num[64];
    int failed = 0;
    if (PyBool_Check(v))
        return (v == Py_True ? PUT(b, "[\"b\",true]") : PUT(b, "[\"b\",false]")) < 0 ? -1 : 1;
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow)
            return 0;
        if (x == -1 && PyErr_Occurred())
            return -1;
        /* the digits backwards from the end of num, then the tag before them */
        char *end = num + sizeof num, *d = end;
        *--d = ']';
        unsigned long long u = x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x;
        do {
            *--d = (char)('0' + u % 10);
            u /= 10;
        } while (u);
        if (x < 0)
            *--d = '-';
        return (PUT(b, "[\"i\",") < 0 || buf_put(b, d, end - d) < 0) ? -1 : 1;
    }
    if (PyFloat_CheckExact(v)) {
        /* repr's shortest digits; orjson writes the same unless repr has an exponent */
        char *r = PyOS_double_to_string(PyFloat_AS_DOUBLE(v), 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
        if (r == NULL)
            return -1;
        int plain = strpbrk(r, "eni") == NULL; /* no exponent, inf or nan */
        int ok = !plain || (PUT(b, "[\"f\",") == 0 && buf_put(b, r, strlen(r)) == 0 &&
                            PUT(b, "]") == 0);
        PyMem_Free(r);
        return ok ? plain : -1;
    }
    if (PyUnicode_CheckExact(v)) {
        if (PUT(b, "[\"s\",") < 0)
            return -1;
        if (!put_plain_str(b, v, &failed))
            return failed ? -1 : 0;
        return PUT(b, "]") < 0 ? -1 : 1;
    }
    if (PyDateTime_CheckExact(v) && PyDateTime_DATE_GET_TZINFO(v) == utc) {
        int year = PyDateTime_GET_YEAR(v), us = PyDateTime_DATE_GET_MICROSECOND(v);
        if (year < 1000)
            return 0;
        /* as isoformat(): YYYY-MM-DDTHH:MM:SS[.ffffff]+00:00 */
        char *d = num;
        memcpy(d, "[\"d\",\"", 6);
        d += 6;
        d = digits(d, year, 4);
        *d++ = '-';
        d = digits(d, PyDateTime_GET_MONTH(v), 2);
        *d++ = '-';
        d = digits(d, PyDateTime_GET_DAY(v), 2);
        *d++ = 'T';
        d = digits(d, PyDateTime_DATE_GET_HOUR(v), 2);
        *d++ = ':';
        d = digits(d, PyDateTime_DATE_GET_MINUTE(v), 2);
        *d++ = ':';
        d = digits(d, PyDateTime_DATE_GET_SECOND(v), 2);
        if (us) {
            *d++ = '.';
            d = digits(d, us, 6);
        }
        memcpy(d, "+00:00\"]", 8);
        d += 8;
        return buf_put(b, num, d - num) < 0 ? -1 : 1;
    }
    return 0;
}

/* {"k":[tag,value],...} of one dict; 1, 0 (not plain) or -1 as put_value. */
static int
put_props(Buf *b, PyObject *props)
{
    if (!PyDict_CheckExact(props))
        return 0;
    if (PUT(b, "{") < 0)
        return -1;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    int first = 1, failed = 0;
    while (PyDict_Next(props, &pos, &key, &value)) {
        if (!first && PUT(b, ",") < 0)
            return -1;
        first = 0;
        if (!put_plain_str(b, key, &failed))
            return failed ? -1 : 0;
        if (PUT(b, ":") < 0)
            return -1;
        int done = put_value(b, value);
        if (done <= 0)
            return done;
    }
    return PUT(b, "}") < 0 ? -1 : 1;
}

PyDoc_STRVAR(context_json_doc,
             "context_json(promoted, written) -> str | None: properties.encode_context's\n"
             "text, when every name and value is plain (printable ASCII text without \" or\n"
             "\\, a 64-bit int, a float whose repr has no exponent, a bool, a UTC datetime\n"
             "from year 1000); else None, and the caller encodes it in Python.");

/* context_json's text of one message's dicts: a new str, None (not plain) or NULL. */
static PyObject *
context_text(PyObject *promoted, PyObject *written)
{
    Buf b;
    b.data = b.stack;
    b.len = 0;
    b.cap = sizeof b.stack;
    PyObject *out = NULL;
    int done = PUT(&b, "{\"promoted\":") < 0 ? -1 : put_props(&b, promoted);
    if (done > 0)
        done = PUT(&b, ",\"written\":") < 0 ? -1 : put_props(&b, written);
    if (done > 0)
        done = PUT(&b, "}") < 0 ? -1 : 1;
    if (done > 0) {
        out = PyUnicode_New(b.len, 127);
        if (out != NULL)
            memcpy(PyUnicode_1BYTE_DATA(out), b.data, b.len);
    }
    else if (done == 0)
        out = Py_NewRef(Py_None);
    if (b.data != b.stack)
        PyMem_Free(b.data);
    return out;
}

static PyObject *
context_json(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "context_json takes 2 arguments");
        return NULL;
    }
    if (set_up(utc, "setup_values") < 0)
        return NULL;
    return context_text(args[0], args[1]);
}

/* Append a new reference to a list, dropping it; -1 on failure. */
static int
append_new(PyObject *list, PyObject *item)
{
    if (item == NULL)
        return -1;
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

#define N_COLUMNS 9

/* One message's columns (see message_columns): 1, 0 (not plain) or -1. */
static int
put_message(PyObject **cols, PyObject *message, Py_ssize_t i, Py_ssize_t limit)
{
    PyObject *promoted = NULL, *written = NULL, *parts = NULL, *body = NULL, *text = NULL;
    int done = -1;
    promoted = PyObject_GetAttr(message, str_promoted);
    written = promoted ? PyObject_GetAttr(message, str_written) : NULL;
    parts = written ? PyObject_GetAttr(message, str_parts) : NULL;
    body = parts ? PyObject_GetAttr(message, str_body_part) : NULL;
    if (body == NULL)
        goto end;
    if (!PyDict_CheckExact(parts)) {
        done = 0;
        goto end;
    }
    Py_ssize_t pos = 0;
    PyObject *name, *data;
    while (PyDict_Next(parts, &pos, &name, &data)) {  /* plain parts first: no append undone */
        if (!PyBytes_CheckExact(data) || PyBytes_GET_SIZE(data) > limit) {
            done = 0;
            goto end;
        }
    }
    text = context_text(promoted, written);
    if (text == NULL)
        goto end;
    if (text == Py_None) {
        done = 0;
        goto end;
    }
    if (PyList_Append(cols[0], text) < 0 ||
        append_new(cols[1], PyLong_FromSsize_t(PyDict_GET_SIZE(parts))) < 0 ||
        PyList_Append(cols[2], body) < 0)
        goto end;
    pos = 0;
    Py_ssize_t idx = 0;
    while (PyDict_Next(parts, &pos, &name, &data)) {
        if (append_new(cols[3], PyLong_FromSsize_t(i)) < 0 ||
            append_new(cols[4], PyLong_FromSsize_t(idx)) < 0 ||
            PyList_Append(cols[5], name) < 0 ||
            append_new(cols[6], PyLong_FromSsize_t(PyBytes_GET_SIZE(data))) < 0 ||
            append_new(cols[7], PyLong_FromLong(1)) < 0 || PyList_Append(cols[8], data) < 0)
            goto end;
        idx++;
    }
    done = 1;
end:
    Py_XDECREF(promoted);
    Py_XDECREF(written);
    Py_XDECREF(parts);
    Py_XDECREF(body);
    Py_XDECREF(text);
    return done;
}

PyDoc_STRVAR(message_columns_doc,
             "message_columns(messages, fragment_size) -> tuple | None: spool.message_rows'\n"
             "columns (context, n_parts, body_part; then per part: its message's position,\n"
             "idx, name, size, n_fragments, data) of a list of Messages whose contexts\n"
             "context_json writes and whose parts are all bytes of at most fragment_size;\n"
             "else None, and the caller builds them in Python.");

static PyObject *
message_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "message_columns takes a list and an int");
        return NULL;
    }
    if (set_up(utc, "setup_values") < 0)
        return NULL;
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *messages = args[0];
    PyObject *cols[N_COLUMNS] = {NULL};
    PyObject *out = NULL;
    for (int c = 0; c < N_COLUMNS; c++)
        if ((cols[c] = PyList_New(0)) == NULL)
            goto end;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(messages); i++) {
        int done = put_message(cols, PyList_GET_ITEM(messages, i), i, limit);
        if (done < 0)
            goto end;
        if (done == 0) {
            out = Py_NewRef(Py_None);
            goto end;
        }
    }
    out = PyTuple_New(N_COLUMNS);
    if (out != NULL)
        for (int c = 0; c < N_COLUMNS; c++) {
            PyTuple_SET_ITEM(out, c, cols[c]);
            cols[c] = NULL;
        }
end:
    for (int c = 0; c < N_COLUMNS; c++)
        Py_XDECREF(cols[c]);
    return out;
}

static PyObject *
make_uuid(const unsigned char *b)
{
    PyObject *value = int_from_bytes(b);
    if (value == NULL)
        return NULL;
    PyTypeObject *type = (PyTypeObject *)uuid_type;
    PyObject *made = type->tp_alloc(type, 0);
    if (made == NULL) {
        Py_DECREF(value);
        return NULL;
    }
    /* object.__setattr__: uuid.UUID's own __setattr__ refuses every set */
    if (PyObject_GenericSetAttr(made, str_int, value) < 0 ||
        PyObject_GenericSetAttr(made, str_is_safe, is_safe) < 0) {
        Py_DECREF(value);
        Py_DECREF(made);
        return NULL;
    }
    Py_DECREF(value);
    return made;
}

PyDoc_STRVAR(uuid7s_doc,
             "uuid7s(ms, random) -> list[uuid.UUID]: one version-7 UUID per 10 bytes of\n"
             "random: the 48-bit millisecond time ms, the version, 12 random bits, the\n"
             "variant, 62 random bits (ids.uuid7s's layout).");

static PyObject *
uuid7s(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "uuid7s(ms, random) takes 2 arguments");
        return NULL;
    }
    if (set_up(uuid_type, "setup") < 0)
        return NULL;
    unsigned long long ms = PyLong_AsUnsignedLongLong(args[0]);
    if (ms == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_buffer random;
    if (PyObject_GetBuffer(args[1], &random, PyBUF_SIMPLE) < 0)
        return NULL;
    if (random.len % 10) {
        PyBuffer_Release(&random);
        PyErr_SetString(PyExc_ValueError, "random must be 10 bytes per UUID");
        return NULL;
    }
    Py_ssize_t n = random.len / 10;
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        PyBuffer_Release(&random);
        return NULL;
    }
    const unsigned char *r = random.buf;
    unsigned char b[16];
    for (int i = 0; i < 6; i++)
        b[i] = (unsigned char)(ms >> (8 * (5 - i)));
    for (Py_ssize_t k = 0; k < n; k++, r += 10) {
        b[6] = (unsigned char)(0x70 | (r[0] & 0x0F)); /* version 7 */
        b[7] = r[1];
        b[8] = (unsigned char)(0x80 | (r[2] & 0x3F)); /* RFC 4122 variant */
        memcpy(b + 9, r + 3, 7);
        PyObject *made = make_uuid(b);
        if (made == NULL) {
            Py_DECREF(out);
            PyBuffer_Release(&random);
            return NULL;
        }
        PyList_SET_ITEM(out, k, made);
    }
    PyBuffer_Release(&random);
    return out;
}

PyDoc_STRVAR(uuid_bytes_doc,
             "uuid_bytes(values) -> bytes: each uuid.UUID's 16 bytes, big-endian, joined;\n"
             "TypeError if a value is not a uuid.UUID (text, None).");

static PyObject *
uuid_bytes(PyObject *self, PyObject *values)
{
    if (set_up(uuid_type, "setup") < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(values, "uuid_bytes takes a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyBytes_FromStringAndSize(NULL, 16 * n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *buf = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        int is = PyObject_TypeCheck(v, (PyTypeObject *)uuid_type);
        if (!is) {
            PyErr_Format(PyExc_TypeError, "value %zd is %.100s, not a UUID", i,
                         Py_TYPE(v)->tp_name);
            goto fail;
        }
        PyObject *number = PyObject_GenericGetAttr(v, str_int);
        if (number == NULL)
            goto fail;
        int failed = int_to_bytes(number, buf + 16 * i);
        Py_DECREF(number);
        if (failed < 0)
            goto fail;
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}

PyDoc_STRVAR(routed_doc,
             "routed(cls, ids, counts, subs, routed, unmatched) -> list: per message, a\n"
             "cls (models.Routed) of its id, with `routed` and its next counts[i] subs (a\n"
             "tuple) when it has any, else `unmatched` and (); set through the slots, as\n"
             "the frozen dataclass's __init__ sets them (router._Writes.routed_all).");

static int
set_routed(PyObject *made, PyObject *id, PyObject *outcome, PyObject *subs)
{
    return PyObject_GenericSetAttr(made, str_message_id, id) < 0 ||
                   PyObject_GenericSetAttr(made, str_outcome, outcome) < 0 ||
                   PyObject_GenericSetAttr(made, str_subscriptions, subs) < 0
               ? -1
               : 0;
}

static PyObject *
routed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "routed takes 6 arguments");
        return NULL;
    }
    PyObject *cls = args[0], *ids = args[1], *counts = args[2], *subs = args[3];
    PyObject *ok = args[4], *unmatched = args[5];
    if (!PyType_Check(cls) || !PyList_Check(counts) || !PyTuple_Check(subs)) {
        PyErr_SetString(PyExc_TypeError, "routed(type, ids, list, tuple, outcome, outcome)");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(ids, "routed takes a sequence of ids");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (PyList_GET_SIZE(counts) != n) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "routed: one count per id");
        return NULL;
    }
    PyObject *empty = PyTuple_New(0);
    PyObject *out = PyList_New(n);
    if (empty == NULL || out == NULL)
        goto fail;
    PyTypeObject *type = (PyTypeObject *)cls;
    Py_ssize_t start = 0, total = PyTuple_GET_SIZE(subs);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t k = PyLong_AsSsize_t(PyList_GET_ITEM(counts, i));
        if (k < 0 || start + k > total) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "routed: the counts do not fit the subs");
            goto fail;
        }
        PyObject *mine = k ? PyTuple_GetSlice(subs, start, start + k) : Py_NewRef(empty);
        if (mine == NULL)
            goto fail;
        start += k;
        PyObject *made = type->tp_alloc(type, 0);
        if (made == NULL ||
            set_routed(made, PySequence_Fast_GET_ITEM(seq, i), k ? ok : unmatched, mine) < 0) {
            Py_XDECREF(made);
            Py_DECREF(mine);
            goto fail;
        }
        Py_DECREF(mine);
        PyList_SET_ITEM(out, i, made);
    }
    Py_DECREF(seq);
    Py_DECREF(empty);
    return out;
fail:
    Py_DECREF(seq);
    Py_XDECREF(empty);
    Py_XDECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, setup_doc},
    {"setup_values", setup_values, METH_VARARGS, setup_values_doc},
    {"typed", typed, METH_O, typed_doc},
    {"context_json", (PyCFunction)(void (*)(void))context_json, METH_FASTCALL, context_json_doc},
    {"message_columns", (PyCFunction)(void (*)(void))message_columns, METH_FASTCALL,
     message_columns_doc},
    {"routed", (PyCFunction)(void (*)(void))routed, METH_FASTCALL, routed_doc},
    {"uuid7s", (PyCFunction)(void (*)(void))uuid7s, METH_FASTCALL, uuid7s_doc},
    {"uuid_bytes", uuid_bytes, METH_O, uuid_bytes_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "messagebox._native",
    "Compiled helpers of the publish path: UUIDs, typed contexts (optional).",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    str_int = PyUnicode_InternFromString("int");
    str_is_safe = PyUnicode_InternFromString("is_safe");
    if (str_int == NULL || str_is_safe == NULL)
        return NULL;
    tag_b = PyUnicode_InternFromString("b");
    tag_i = PyUnicode_InternFromString("i");
    tag_f = PyUnicode_InternFromString("f");
    tag_s = PyUnicode_InternFromString("s");
    tag_d = PyUnicode_InternFromString("d");
    if (!tag_b || !tag_i || !tag_f || !tag_s || !tag_d)
        return NULL;
    str_message_id = PyUnicode_InternFromString("message_id");
    str_outcome = PyUnicode_InternFromString("outcome");
    str_subscriptions = PyUnicode_InternFromString("subscriptions");
    if (!str_message_id || !str_outcome || !str_subscriptions)
        return NULL;
    str_promoted = PyUnicode_InternFromString("promoted");
    str_written = PyUnicode_InternFromString("written");
    str_parts = PyUnicode_InternFromString("parts");
    str_body_part = PyUnicode_InternFromString("body_part");
    if (!str_promoted || !str_written || !str_parts || !str_body_part)
        return NULL;
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL)
        return NULL;
    return PyModule_Create(&module);
}
