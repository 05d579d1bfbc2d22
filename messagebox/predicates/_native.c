/* The compiled matcher of messagebox.predicates.index: FilterIndex's match in C.
 *
 * index.py compiles each bucket of filed groups (the groups under one anchor value,
 * one prefix, one mask, one sorted range, the present and != anchors, the unanchored)
 * into a Groups object: the groups laid out one after another in one block of memory,
 * each with its checks inline and typed (a numeric operand also as int64 and as double
 * where it is exactly one), a range's bounds as doubles where all are exact. A match
 * then reads a few contiguous blocks per candidate bucket instead of a tuple, a checks
 * tuple, a check tuple and a boxed bound per candidate: at 100,000 subscriptions most
 * of the matching time was those cache misses.
 *
 * The semantics stay Python's: a typed comparison is taken only where it is exact (two
 * doubles; two int64s; an int64 within 2**53 beside a double), everything else is left
 * to the values themselves (PyObject_RichCompareBool): numbers compare exactly,
 * strings by code point, datetimes as Python does. Families, the bool keys and the
 * check codes come from index.py (setup); index.py's pure-Python match is the fallback
 * and the reference, and the shared hypothesis suites hold the two equal.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The check codes of index.py (_GT ... _PREFIX), in that order: setup() checks them. */
enum { GT, GE, LT, LE, NE, MEMBER, EXISTS, NOT_EXISTS, MASK, PREFIX, N_CODES };

static PyObject *family_map = NULL; /* type -> family (index._FAMILY) */
static PyObject *family_fn = NULL;  /* index._family, for other types */
static PyObject *key_true = NULL;   /* index._key(True) */
static PyObject *key_false = NULL;  /* index._key(False) */
static long num_family = -1;        /* the family of int and float */

#define EXACT_DOUBLE_LIMIT 9007199254740992LL /* 2**53: every int64 up to it is a double */

/* The value's family, or -1 with an exception set. */
static long
family_of(PyObject *v)
{
    if (PyFloat_CheckExact(v) || PyLong_CheckExact(v))
        return num_family;
    PyObject *fam = PyDict_GetItemWithError(family_map, (PyObject *)Py_TYPE(v));
    if (fam != NULL)
        return PyLong_AsLong(fam);
    if (PyErr_Occurred())
        return -1;
    PyObject *got = PyObject_CallOneArg(family_fn, v);
    if (got == NULL)
        return -1;
    long out = PyLong_AsLong(got);
    Py_DECREF(got);
    return out;
}

static inline PyObject *
hash_key(PyObject *v)
{
    if (Py_IS_TYPE(v, &PyBool_Type))
        return v == Py_True ? key_true : key_false;
    return v;
}

/* A number as the typed forms it has exactly. */
enum { HAS_I64 = 1, HAS_DOUBLE = 2 };

typedef struct {
    int kinds; /* HAS_I64 | HAS_DOUBLE */
    int64_t i;
    double d;
} Typed;

/* The exact typed forms of v (none for other types). Never fails. */
static Typed
typed(PyObject *v)
{
    Typed t = {0, 0, 0.0};
    if (PyFloat_CheckExact(v)) {
        t.kinds = HAS_DOUBLE;
        t.d = PyFloat_AS_DOUBLE(v);
    }
    else if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (x == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return t;
        }
        if (!overflow) {
            t.kinds = HAS_I64;
            t.i = (int64_t)x;
            if (x <= EXACT_DOUBLE_LIMIT && x >= -EXACT_DOUBLE_LIMIT) {
                t.kinds |= HAS_DOUBLE;
                t.d = (double)x;
            }
        }
    }
    return t;
}

/* --- Groups: a bucket of filed groups, compiled --- */

typedef struct {
    int code;
    int fam;           /* comparisons: the operand's family */
    int kinds;         /* the operand's exact typed forms (comparisons and masks) */
    int pad;
    PyObject *prop;    /* owned */
    PyObject *operand; /* owned; NULL for exists / not_exists */
    int64_t i;
    double d;
} Check;

typedef struct {
    PyObject *key; /* owned */
    Py_ssize_t n_checks;
    /* followed by n_checks Check */
} Group;

typedef struct {
    PyObject_VAR_HEAD
    Py_ssize_t n;         /* groups */
    Py_ssize_t n_bounds;  /* bounds held (n, or 0 for a bucket that is not a range) */
    int bounds;           /* 0: none; 1: bounds as objects; 2: also as doubles */
    Py_ssize_t *offsets;  /* n: each group's byte offset in data */
    PyObject **obounds;   /* n, owned (bounds >= 1) */
    double *dbounds;      /* n (bounds == 2) */
    char *data;           /* the groups */
    char memory[1];
} Groups;

static PyTypeObject GroupsType;

static inline Group *
group_at(Groups *g, Py_ssize_t i)
{
    return (Group *)(g->data + g->offsets[i]);
}

static inline Check *
checks_of(Group *group)
{
    return (Check *)(group + 1);
}

static void
Groups_dealloc(Groups *self)
{
    for (Py_ssize_t i = 0; i < self->n; i++) {
        Group *group = group_at(self, i);
        Check *checks = checks_of(group);
        for (Py_ssize_t j = 0; j < group->n_checks; j++) {
            Py_XDECREF(checks[j].prop);
            Py_XDECREF(checks[j].operand);
        }
        Py_XDECREF(group->key);
    }
    for (Py_ssize_t i = 0; i < self->n_bounds; i++)
        Py_XDECREF(self->obounds[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
Groups_length(Groups *self)
{
    return self->n;
}

static PySequenceMethods Groups_as_sequence = {
    .sq_length = (lenfunc)Groups_length,
};

static PyTypeObject GroupsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "messagebox.predicates._native.Groups",
    .tp_basicsize = offsetof(Groups, memory),
    .tp_itemsize = 1,
    .tp_dealloc = (destructor)Groups_dealloc,
    .tp_as_sequence = &Groups_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Filed groups compiled by compile(): read by match().",
};

static inline Py_ssize_t
align8(Py_ssize_t n)
{
    return (n + 7) & ~(Py_ssize_t)7;
}

/* Fill one check from its data tuple (code, property, operand...): 0, or -1. */
static int
fill_check(Check *c, PyObject *data)
{
    if (!PyTuple_Check(data) || PyTuple_GET_SIZE(data) < 2) {
        PyErr_SetString(PyExc_TypeError, "compile(): a check is (code, property, ...)");
        return -1;
    }
    long code = PyLong_AsLong(PyTuple_GET_ITEM(data, 0));
    if (code == -1 && PyErr_Occurred())
        return -1;
    if (code < 0 || code >= N_CODES) {
        PyErr_SetString(PyExc_ValueError, "compile(): unknown check code");
        return -1;
    }
    c->code = (int)code;
    c->prop = Py_NewRef(PyTuple_GET_ITEM(data, 1));
    Py_ssize_t size = PyTuple_GET_SIZE(data);
    if (code <= NE) { /* (code, property, family, bound) */
        if (size != 4) {
            PyErr_SetString(PyExc_TypeError, "compile(): a comparison is 4 items");
            return -1;
        }
        long fam = PyLong_AsLong(PyTuple_GET_ITEM(data, 2));
        if (fam == -1 && PyErr_Occurred())
            return -1;
        c->fam = (int)fam;
        c->operand = Py_NewRef(PyTuple_GET_ITEM(data, 3));
    }
    else if (code == MEMBER || code == MASK || code == PREFIX) { /* (code, property, x) */
        if (size != 3) {
            PyErr_SetString(PyExc_TypeError, "compile(): a member, mask or prefix is 3 items");
            return -1;
        }
        c->operand = Py_NewRef(PyTuple_GET_ITEM(data, 2));
        if (code == PREFIX && !PyUnicode_Check(c->operand)) {
            PyErr_SetString(PyExc_TypeError, "compile(): a prefix is a str");
            return -1;
        }
    }
    if (c->operand != NULL && (code <= NE || code == MASK)) {
        Typed t = typed(c->operand);
        c->kinds = t.kinds;
        c->i = t.i;
        c->d = t.d;
    }
    return 0;
}

PyDoc_STRVAR(compile_doc,
             "compile(groups, bounds=None) -> Groups\n\n"
             "Filed groups, each (key, anchor, checks), compiled for match(); with\n"
             "``bounds``, a range's sorted bounds, one a group in the same order.");

static PyObject *
compile_groups(PyObject *self, PyObject *args)
{
    PyObject *groups_in, *bounds_in = Py_None;
    if (!PyArg_ParseTuple(args, "O|O", &groups_in, &bounds_in))
        return NULL;
    PyObject *groups = PySequence_Fast(groups_in, "compile(): groups must be a sequence");
    if (groups == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(groups);
    PyObject **items = PySequence_Fast_ITEMS(groups);
    PyObject *bounds = NULL;
    if (bounds_in != Py_None) {
        bounds = PySequence_Fast(bounds_in, "compile(): bounds must be a sequence");
        if (bounds == NULL)
            goto fail_early;
        if (PySequence_Fast_GET_SIZE(bounds) != n) {
            PyErr_SetString(PyExc_ValueError, "compile(): one bound a group");
            goto fail_early;
        }
    }
    /* sizes first: the offsets, the bounds, then each group with its checks */
    Py_ssize_t size = align8(n * (Py_ssize_t)sizeof(Py_ssize_t));
    if (bounds != NULL)
        size += align8(n * (Py_ssize_t)sizeof(PyObject *)) + align8(n * (Py_ssize_t)sizeof(double));
    Py_ssize_t data_start = size;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = items[i];
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3 ||
            !PyTuple_Check(PyTuple_GET_ITEM(item, 2))) {
            PyErr_SetString(PyExc_TypeError, "compile(): a group is (key, anchor, checks)");
            goto fail_early;
        }
        size += (Py_ssize_t)sizeof(Group) +
                PyTuple_GET_SIZE(PyTuple_GET_ITEM(item, 2)) * (Py_ssize_t)sizeof(Check);
    }
    Groups *out = PyObject_NewVar(Groups, &GroupsType, size + 8);
    if (out == NULL)
        goto fail_early;
    char *base = (char *)(((uintptr_t)out->memory + 7) & ~(uintptr_t)7);
    memset(base, 0, (size_t)size);
    out->n = 0; /* groups and bounds filled so far: what dealloc releases */
    out->n_bounds = 0;
    out->offsets = (Py_ssize_t *)base;
    out->bounds = 0;
    out->obounds = NULL;
    out->dbounds = NULL;
    if (bounds != NULL) {
        out->obounds = (PyObject **)(base + align8(n * (Py_ssize_t)sizeof(Py_ssize_t)));
        out->dbounds = (double *)((char *)out->obounds + align8(n * (Py_ssize_t)sizeof(PyObject *)));
        out->bounds = 2;
        PyObject **b = PySequence_Fast_ITEMS(bounds);
        for (Py_ssize_t i = 0; i < n; i++) {
            out->obounds[i] = Py_NewRef(b[i]);
            out->n_bounds = i + 1;
            Typed t = typed(b[i]);
            if (t.kinds & HAS_DOUBLE)
                out->dbounds[i] = t.d;
            else
                out->bounds = 1; /* not every bound is a double: compare objects */
        }
    }
    out->data = base + data_start;
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *checks = PyTuple_GET_ITEM(items[i], 2);
        Py_ssize_t n_checks = PyTuple_GET_SIZE(checks);
        out->offsets[i] = at;
        Group *group = (Group *)(out->data + at);
        group->key = Py_NewRef(PyTuple_GET_ITEM(items[i], 0));
        group->n_checks = 0;
        out->n = i + 1;
        for (Py_ssize_t j = 0; j < n_checks; j++) {
            group->n_checks = j + 1; /* released by dealloc even if it fails half-filled */
            if (fill_check(&checks_of(group)[j], PyTuple_GET_ITEM(checks, j)) < 0) {
                Py_DECREF(out);
                goto fail_early;
            }
        }
        at += (Py_ssize_t)sizeof(Group) + n_checks * (Py_ssize_t)sizeof(Check);
    }
    Py_XDECREF(bounds);
    Py_DECREF(groups);
    return (PyObject *)out;
fail_early:
    Py_XDECREF(bounds);
    Py_DECREF(groups);
    return NULL;
}

/* --- matching --- */

/* The keys found so far, by identity (a filter's groups share its key object), in an
 * open-addressed table of pointers that grows as needed, and the list to return. */
typedef struct {
    PyObject **slots;
    Py_ssize_t mask; /* capacity - 1 */
    Py_ssize_t used;
    PyObject *found; /* list */
    PyObject *small[64];
} Seen;

static inline size_t
pointer_hash(PyObject *p)
{
    uintptr_t x = (uintptr_t)p >> 4;
    x ^= x >> 17;
    x *= 0x9E3779B97F4A7C15ULL;
    return (size_t)(x ^ (x >> 29));
}

static int
seen_has(Seen *s, PyObject *key)
{
    for (size_t i = pointer_hash(key) & (size_t)s->mask;; i = (i + 1) & (size_t)s->mask) {
        PyObject *at = s->slots[i];
        if (at == key)
            return 1;
        if (at == NULL)
            return 0;
    }
}

static int
seen_grow(Seen *s)
{
    Py_ssize_t capacity = (s->mask + 1) * 2;
    PyObject **slots = PyMem_Calloc((size_t)capacity, sizeof(PyObject *));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i <= s->mask; i++) {
        PyObject *key = s->slots[i];
        if (key == NULL)
            continue;
        size_t j = pointer_hash(key) & (size_t)(capacity - 1);
        while (slots[j] != NULL)
            j = (j + 1) & (size_t)(capacity - 1);
        slots[j] = key;
    }
    if (s->slots != s->small)
        PyMem_Free(s->slots);
    s->slots = slots;
    s->mask = capacity - 1;
    return 0;
}

/* Add a key not yet seen: 0, or -1. */
static int
seen_add(Seen *s, PyObject *key)
{
    if (PyList_Append(s->found, key) < 0)
        return -1;
    if ((s->used + 1) * 2 > s->mask + 1 && seen_grow(s) < 0)
        return -1;
    size_t i = pointer_hash(key) & (size_t)s->mask;
    while (s->slots[i] != NULL)
        i = (i + 1) & (size_t)s->mask;
    s->slots[i] = key;
    s->used++;
    return 0;
}

/* a <op> b for a comparison's check code: one body for int64s and for doubles. */
#define COMPARED(a, b, code)                                                                   \
    ((code) == GT   ? (a) > (b)                                                                \
     : (code) == GE ? (a) >= (b)                                                               \
     : (code) == LT ? (a) < (b)                                                                \
     : (code) == LE ? (a) <= (b)                                                               \
                    : (a) != (b))

/* Whether a non-zero v & mask, v an exact int: 1, 0 or -1. */
static int
masked(PyObject *v, PyObject *mask, const Typed *tv, int mask_kinds, int64_t mask_i)
{
    if ((tv->kinds & HAS_I64) && (mask_kinds & HAS_I64))
        return (tv->i & mask_i) != 0;
    PyObject *both = PyNumber_And(v, mask);
    if (both == NULL)
        return -1;
    int out = PyObject_IsTrue(both);
    Py_DECREF(both);
    return out;
}

/* index._holds for a compiled check: 1, 0 or -1 with an exception set. */
static int
holds(const Check *c, PyObject *props)
{
    PyObject *v = PyDict_GetItemWithError(props, c->prop);
    if (v == NULL)
        return PyErr_Occurred() ? -1 : c->code == NOT_EXISTS;
    int code = c->code;
    if (code <= NE) {
        long fam = family_of(v);
        if (fam == -1 && PyErr_Occurred())
            return -1;
        if (fam != c->fam)
            return 0; /* values of different families never meet */
        if (c->kinds) {
            Typed t = typed(v);
            if ((t.kinds & HAS_I64) && (c->kinds & HAS_I64))
                return COMPARED(t.i, c->i, code);
            if ((t.kinds & HAS_DOUBLE) && (c->kinds & HAS_DOUBLE))
                return COMPARED(t.d, c->d, code);
        }
        static const int ops[] = {Py_GT, Py_GE, Py_LT, Py_LE, Py_NE};
        return PyObject_RichCompareBool(v, c->operand, ops[code]);
    }
    switch (code) {
    case MEMBER: /* several values in a dict, one as itself */
        if (PyDict_CheckExact(c->operand))
            return PyDict_Contains(c->operand, hash_key(v));
        return PyObject_RichCompareBool(hash_key(v), c->operand, Py_EQ);
    case EXISTS:
        return 1;
    case MASK: {
        if (!PyLong_CheckExact(v))
            return 0;
        Typed t = typed(v);
        return masked(v, c->operand, &t, c->kinds, c->i);
    }
    case PREFIX:
        if (!PyUnicode_CheckExact(v))
            return 0;
        return (int)PyUnicode_Tailmatch(v, c->operand, 0, PY_SSIZE_T_MAX, -1);
    default:
        return 0; /* NOT_EXISTS of a present property */
    }
}

/* Groups lo..hi of a compiled bucket: each whose checks all hold adds its key. */
static int
consider(Groups *g, Py_ssize_t lo, Py_ssize_t hi, PyObject *props, Seen *seen)
{
    for (Py_ssize_t i = lo; i < hi; i++) {
        Group *group = group_at(g, i);
        if (seen->used && seen_has(seen, group->key))
            continue;
        const Check *checks = checks_of(group);
        int ok = 1;
        for (Py_ssize_t j = 0; j < group->n_checks; j++) {
            ok = holds(&checks[j], props);
            if (ok <= 0)
                break;
        }
        if (ok < 0)
            return -1;
        if (ok && seen_add(seen, group->key) < 0)
            return -1;
    }
    return 0;
}

static int
consider_all(PyObject *groups, PyObject *props, Seen *seen)
{
    if (!Py_IS_TYPE(groups, &GroupsType)) {
        PyErr_SetString(PyExc_TypeError, "match(): a bucket is not compiled Groups");
        return -1;
    }
    return consider((Groups *)groups, 0, ((Groups *)groups)->n, props, seen);
}

/* bisect_left (right=0) or bisect_right (right=1) of v in a compiled range's bounds,
 * with exactly the comparisons Python's bisect makes. */
static Py_ssize_t
bisect(Groups *g, PyObject *v, int right)
{
    Py_ssize_t lo = 0, hi = g->n;
    if (g->bounds == 2) {
        Typed t = typed(v);
        if (t.kinds & HAS_DOUBLE) { /* every bound and v exactly doubles */
            const double *b = g->dbounds;
            double x = t.d;
            while (lo < hi) {
                Py_ssize_t mid = lo + (hi - lo) / 2;
                if (right ? !(x < b[mid]) : (b[mid] < x))
                    lo = mid + 1;
                else
                    hi = mid;
            }
            return lo;
        }
    }
    PyObject **b = g->obounds;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        /* left: values[mid] < v goes right; right: v < values[mid] goes left */
        int less = right ? PyObject_RichCompareBool(v, b[mid], Py_LT)
                         : PyObject_RichCompareBool(b[mid], v, Py_LT);
        if (less < 0)
            return -1;
        if (right ? !less : less)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* One property's anchors for v: the packed tuple
 * (equal, present, prefixes, prefix_lengths, masks, ranges, not_equal) of compiled
 * Groups: equal and prefixes map to Groups, masks are (mask, Groups) pairs, ranges
 * (family, code, Groups with bounds), not_equal Groups whose first check is the anchor. */
static int
holding(PyObject *packed, PyObject *v, PyObject *props, Seen *seen)
{
    PyObject *equal = PyTuple_GET_ITEM(packed, 0);
    PyObject *present = PyTuple_GET_ITEM(packed, 1);
    PyObject *prefixes = PyTuple_GET_ITEM(packed, 2);
    PyObject *lengths = PyTuple_GET_ITEM(packed, 3);
    PyObject *masks = PyTuple_GET_ITEM(packed, 4);
    PyObject *ranges = PyTuple_GET_ITEM(packed, 5);
    PyObject *not_equal = PyTuple_GET_ITEM(packed, 6);

    if (PyDict_GET_SIZE(equal)) {
        PyObject *bucket = PyDict_GetItemWithError(equal, hash_key(v));
        if (bucket == NULL) {
            if (PyErr_Occurred())
                return -1;
        }
        else if (consider_all(bucket, props, seen) < 0)
            return -1;
    }
    if (present != Py_None && consider_all(present, props, seen) < 0)
        return -1;
    if (PyDict_GET_SIZE(prefixes) && PyUnicode_CheckExact(v)) {
        Py_ssize_t n = PyUnicode_GET_LENGTH(v);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(lengths); i++) {
            Py_ssize_t length = PyLong_AsSsize_t(PyTuple_GET_ITEM(lengths, i));
            if (length == -1 && PyErr_Occurred())
                return -1;
            if (length > n)
                break;
            PyObject *head = PyUnicode_Substring(v, 0, length);
            if (head == NULL)
                return -1;
            PyObject *bucket = PyDict_GetItemWithError(prefixes, head);
            Py_DECREF(head);
            if (bucket == NULL) {
                if (PyErr_Occurred())
                    return -1;
                continue;
            }
            if (consider_all(bucket, props, seen) < 0)
                return -1;
        }
    }
    if (PyTuple_GET_SIZE(masks) && PyLong_CheckExact(v)) {
        Typed tv = typed(v);
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(masks); i++) {
            PyObject *item = PyTuple_GET_ITEM(masks, i); /* (mask, Groups) */
            PyObject *mask = PyTuple_GET_ITEM(item, 0);
            Typed tm = typed(mask);
            int hit = masked(v, mask, &tv, tm.kinds, tm.i);
            if (hit < 0)
                return -1;
            if (hit && consider_all(PyTuple_GET_ITEM(item, 1), props, seen) < 0)
                return -1;
        }
    }
    if (PyTuple_GET_SIZE(ranges)) {
        long fam = family_of(v);
        if (fam == -1 && PyErr_Occurred())
            return -1;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ranges); i++) {
            PyObject *item = PyTuple_GET_ITEM(ranges, i); /* (family, code, Groups) */
            if (PyLong_AsLong(PyTuple_GET_ITEM(item, 0)) != fam)
                continue;
            long code = PyLong_AsLong(PyTuple_GET_ITEM(item, 1));
            PyObject *g = PyTuple_GET_ITEM(item, 2);
            if (!Py_IS_TYPE(g, &GroupsType) || ((Groups *)g)->bounds == 0) {
                PyErr_SetString(PyExc_TypeError, "match(): a range is not compiled with bounds");
                return -1;
            }
            Py_ssize_t at = bisect((Groups *)g, v, code == GE || code == LT);
            if (at < 0)
                return -1;
            int failed = (code == GT || code == GE)
                             ? consider((Groups *)g, 0, at, props, seen)
                             : consider((Groups *)g, at, ((Groups *)g)->n, props, seen);
            if (failed < 0)
                return -1;
        }
    }
    if (not_equal != Py_None && consider_all(not_equal, props, seen) < 0)
        return -1;
    return 0;
}

/* The keys that one dict of properties matches, each once, as a new list; NULL with an
 * exception set. */
static PyObject *
match_one(PyObject *packed, PyObject *unanchored, PyObject *props)
{
    Seen seen;
    memset(seen.small, 0, sizeof(seen.small));
    seen.slots = seen.small;
    seen.mask = 63;
    seen.used = 0;
    seen.found = PyList_New(0);
    if (seen.found == NULL)
        return NULL;
    if (unanchored != Py_None && consider_all(unanchored, props, &seen) < 0)
        goto fail;
    Py_ssize_t pos = 0;
    PyObject *name, *v;
    while (PyDict_Next(props, &pos, &name, &v)) {
        PyObject *anchors = PyDict_GetItemWithError(packed, name);
        if (anchors == NULL) {
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        if (holding(anchors, v, props, &seen) < 0)
            goto fail;
    }
    if (seen.slots != seen.small)
        PyMem_Free(seen.slots);
    return seen.found;
fail:
    if (seen.slots != seen.small)
        PyMem_Free(seen.slots);
    Py_DECREF(seen.found);
    return NULL;
}

/* The arguments of match() and match_all(): three, the first a dict, after setup(). */
static int
check_args(PyObject *const *args, Py_ssize_t nargs, const char *usage)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    if (family_map == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "messagebox.predicates._native: setup() not called");
        return -1;
    }
    if (!PyDict_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "match(): packed must be a dict");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(match_doc,
             "match(packed, unanchored, properties) -> list\n\n"
             "The keys of the filters that the dict ``properties`` matches, each once:\n"
             "``packed`` maps a property to its anchors as _Anchors.packed() gives them,\n"
             "``unanchored`` is the compiled groups with no anchor (or None).");

static PyObject *
match(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(args, nargs, "match() takes packed, unanchored, properties") < 0)
        return NULL;
    if (!PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "match(): properties must be a dict");
        return NULL;
    }
    return match_one(args[0], args[1], args[2]);
}

PyDoc_STRVAR(match_all_doc,
             "match_all(packed, unanchored, batch) -> (list, list)\n\n"
             "match() of each dict of a list, in order: every message's keys, sorted, one\n"
             "after another in one list, and how many each message has.");

static PyObject *
match_all(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(args, nargs, "match_all() takes packed, unanchored, batch") < 0)
        return NULL;
    PyObject *packed = args[0], *unanchored = args[1], *batch = args[2];
    if (!PyList_CheckExact(batch)) {
        PyErr_SetString(PyExc_TypeError, "match_all(): batch must be a list of dicts");
        return NULL;
    }
    PyObject *flat = PyList_New(0);
    PyObject *counts = PyList_New(PyList_GET_SIZE(batch));
    if (flat == NULL || counts == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batch); i++) {
        PyObject *props = PyList_GET_ITEM(batch, i);
        if (!PyDict_Check(props)) {
            PyErr_SetString(PyExc_TypeError, "match_all(): batch must be a list of dicts");
            goto fail;
        }
        PyObject *found = match_one(packed, unanchored, props);
        if (found == NULL)
            goto fail;
        Py_ssize_t n = PyList_GET_SIZE(found);
        int failed = (n > 1 && PyList_Sort(found) < 0) ||
                     (n && PyList_SetSlice(flat, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, found) < 0);
        Py_DECREF(found);
        if (failed)
            goto fail;
        PyObject *count = PyLong_FromSsize_t(n);
        if (count == NULL)
            goto fail;
        PyList_SET_ITEM(counts, i, count);
    }
    PyObject *out = PyTuple_Pack(2, flat, counts);
    Py_DECREF(flat);
    Py_DECREF(counts);
    return out;
fail:
    Py_XDECREF(flat);
    Py_XDECREF(counts);
    return NULL;
}

PyDoc_STRVAR(setup_doc,
             "setup(family_map, family_fn, key_true, key_false, codes) -> None\n\n"
             "What index.py decides: families by type, the family of other values, the hash\n"
             "keys of True and False, and the check codes (which must be 0 .. 9 in order).");

static PyObject *
setup(PyObject *self, PyObject *args)
{
    PyObject *fmap, *ffn, *kt, *kf, *codes;
    if (!PyArg_ParseTuple(args, "O!OOOO!", &PyDict_Type, &fmap, &ffn, &kt, &kf, &PyTuple_Type,
                          &codes))
        return NULL;
    if (PyTuple_GET_SIZE(codes) != N_CODES) {
        PyErr_SetString(PyExc_ValueError, "setup(): the check codes differ from the C module's");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < N_CODES; i++) {
        if (PyLong_AsLong(PyTuple_GET_ITEM(codes, i)) != i) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError,
                                "setup(): the check codes differ from the C module's");
            return NULL;
        }
    }
    PyObject *of_int = PyDict_GetItemWithError(fmap, (PyObject *)&PyLong_Type);
    PyObject *of_float = PyDict_GetItemWithError(fmap, (PyObject *)&PyFloat_Type);
    if (of_int == NULL || of_float == NULL || PyObject_RichCompareBool(of_int, of_float, Py_EQ) != 1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "setup(): int and float must share a family");
        return NULL;
    }
    long num = PyLong_AsLong(of_int);
    if (num == -1 && PyErr_Occurred())
        return NULL;
    num_family = num;
    Py_INCREF(fmap);
    Py_INCREF(ffn);
    Py_INCREF(kt);
    Py_INCREF(kf);
    Py_XSETREF(family_map, fmap);
    Py_XSETREF(family_fn, ffn);
    Py_XSETREF(key_true, kt);
    Py_XSETREF(key_false, kf);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"match", (PyCFunction)(void (*)(void))match, METH_FASTCALL, match_doc},
    {"match_all", (PyCFunction)(void (*)(void))match_all, METH_FASTCALL, match_all_doc},
    {"compile", compile_groups, METH_VARARGS, compile_doc},
    {"setup", setup, METH_VARARGS, setup_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "messagebox.predicates._native",
    "The compiled matcher of messagebox.predicates.index (optional: index.py falls back).",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    if (PyType_Ready(&GroupsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Groups", (PyObject *)&GroupsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
