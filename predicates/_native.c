/* The compiled matcher of messagebox.predicates.index: FilterIndex.match in C.
 *
 * It walks the index's own Python structures (dicts of filed groups, sorted bound
 * lists, checks as tuples), packed per property by index.py (_Anchors.packed), and
 * keeps the reference semantics by leaving every comparison to the values themselves
 * (PyObject_RichCompareBool): numbers compare exactly, strings by code point, datetimes
 * as Python does. Families, the bool keys and the check codes come from index.py
 * (setup); index.py's pure-Python match is the fallback and the reference, and the
 * shared hypothesis suites hold the two equal.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The check codes of index.py (_GT ... _PREFIX), in that order: setup() checks them. */
enum { GT, GE, LT, LE, NE, MEMBER, EXISTS, NOT_EXISTS, MASK, PREFIX, N_CODES };

static PyObject *family_map = NULL; /* type -> family (index._FAMILY) */
static PyObject *family_fn = NULL;  /* index._family, for other types */
static PyObject *key_true = NULL;   /* index._key(True) */
static PyObject *key_false = NULL;  /* index._key(False) */

/* The value's family, or -1 with an exception set. */
static long
family_of(PyObject *v)
{
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

/* Whether a non-zero v & mask (v an exact int): 1, 0 or -1. */
static int
masked(PyObject *v, PyObject *mask)
{
    PyObject *both = PyNumber_And(v, mask);
    if (both == NULL)
        return -1;
    int out = PyObject_IsTrue(both);
    Py_DECREF(both);
    return out;
}

/* index._holds: 1, 0 or -1 with an exception set. */
static int
holds(PyObject *check, PyObject *props)
{
    long code = PyLong_AsLong(PyTuple_GET_ITEM(check, 0));
    if (code == -1 && PyErr_Occurred())
        return -1;
    PyObject *v = PyDict_GetItemWithError(props, PyTuple_GET_ITEM(check, 1));
    if (v == NULL)
        return PyErr_Occurred() ? -1 : code == NOT_EXISTS;
    if (code <= NE) {
        long fam = family_of(v);
        if (fam == -1 && PyErr_Occurred())
            return -1;
        if (fam != PyLong_AsLong(PyTuple_GET_ITEM(check, 2)))
            return 0; /* values of different families never meet */
        static const int ops[] = {Py_GT, Py_GE, Py_LT, Py_LE, Py_NE};
        return PyObject_RichCompareBool(v, PyTuple_GET_ITEM(check, 3), ops[code]);
    }
    switch (code) {
    case MEMBER:
        return PyDict_Contains(PyTuple_GET_ITEM(check, 2), hash_key(v));
    case EXISTS:
        return 1;
    case MASK:
        return PyLong_CheckExact(v) ? masked(v, PyTuple_GET_ITEM(check, 2)) : 0;
    case PREFIX:
        if (!PyUnicode_CheckExact(v))
            return 0;
        return (int)PyUnicode_Tailmatch(v, PyTuple_GET_ITEM(check, 2), 0, PY_SSIZE_T_MAX, -1);
    default:
        return 0; /* NOT_EXISTS of a present property */
    }
}

/* A candidate group (key, anchor, checks): add its key to matched if every other
 * predicate holds. 0, or -1 with an exception set. */
static int
consider(PyObject *group, PyObject *props, PyObject *matched)
{
    PyObject *key = PyTuple_GET_ITEM(group, 0);
    int seen = PySet_Contains(matched, key);
    if (seen != 0)
        return seen < 0 ? -1 : 0;
    PyObject *checks = PyTuple_GET_ITEM(group, 2);
    Py_ssize_t n = PyTuple_GET_SIZE(checks);
    for (Py_ssize_t i = 0; i < n; i++) {
        int ok = holds(PyTuple_GET_ITEM(checks, i), props);
        if (ok <= 0)
            return ok;
    }
    return PySet_Add(matched, key);
}

/* Every group of a bucket (a dict gid -> group). */
static int
consider_bucket(PyObject *bucket, PyObject *props, PyObject *matched)
{
    Py_ssize_t pos = 0;
    PyObject *gid, *group;
    while (PyDict_Next(bucket, &pos, &gid, &group)) {
        if (consider(group, props, matched) < 0)
            return -1;
    }
    return 0;
}

static int
consider_slice(PyObject *groups, Py_ssize_t lo, Py_ssize_t hi, PyObject *props,
               PyObject *matched)
{
    for (Py_ssize_t i = lo; i < hi; i++) {
        if (consider(PyList_GET_ITEM(groups, i), props, matched) < 0)
            return -1;
    }
    return 0;
}

/* bisect_left (right=0) or bisect_right (right=1) of v in the sorted list values. */
static Py_ssize_t
bisect(PyObject *values, PyObject *v, int right)
{
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(values);
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        /* left: values[mid] < v goes right; right: v < values[mid] goes left */
        int less = right ? PyObject_RichCompareBool(v, PyList_GET_ITEM(values, mid), Py_LT)
                         : PyObject_RichCompareBool(PyList_GET_ITEM(values, mid), v, Py_LT);
        if (less < 0)
            return -1;
        if (right ? !less : less)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* _Anchors.holding over a packed property:
 * (equal, present, prefixes, prefix_lengths, masks, bounds, not_equal). */
static int
holding(PyObject *packed, PyObject *v, PyObject *props, PyObject *matched)
{
    PyObject *equal = PyTuple_GET_ITEM(packed, 0);
    PyObject *present = PyTuple_GET_ITEM(packed, 1);
    PyObject *prefixes = PyTuple_GET_ITEM(packed, 2);
    PyObject *lengths = PyTuple_GET_ITEM(packed, 3);
    PyObject *masks = PyTuple_GET_ITEM(packed, 4);
    PyObject *bounds = PyTuple_GET_ITEM(packed, 5);
    PyObject *not_equal = PyTuple_GET_ITEM(packed, 6);

    if (PyDict_GET_SIZE(equal)) {
        PyObject *bucket = PyDict_GetItemWithError(equal, hash_key(v));
        if (bucket == NULL) {
            if (PyErr_Occurred())
                return -1;
        }
        else if (consider_bucket(bucket, props, matched) < 0)
            return -1;
    }
    if (PyDict_GET_SIZE(present) && consider_bucket(present, props, matched) < 0)
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
            if (consider_bucket(bucket, props, matched) < 0)
                return -1;
        }
    }
    if (PyTuple_GET_SIZE(masks) && PyLong_CheckExact(v)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(masks); i++) {
            PyObject *item = PyTuple_GET_ITEM(masks, i); /* (mask, bucket) */
            int hit = masked(v, PyTuple_GET_ITEM(item, 0));
            if (hit < 0)
                return -1;
            if (hit && consider_bucket(PyTuple_GET_ITEM(item, 1), props, matched) < 0)
                return -1;
        }
    }
    long fam = -1;
    if (PyTuple_GET_SIZE(bounds) || PyTuple_GET_SIZE(not_equal)) {
        fam = family_of(v);
        if (fam == -1 && PyErr_Occurred())
            return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(bounds); i++) {
        PyObject *item = PyTuple_GET_ITEM(bounds, i); /* (family, code, values, groups) */
        if (PyLong_AsLong(PyTuple_GET_ITEM(item, 0)) != fam)
            continue;
        long code = PyLong_AsLong(PyTuple_GET_ITEM(item, 1));
        PyObject *values = PyTuple_GET_ITEM(item, 2);
        PyObject *groups = PyTuple_GET_ITEM(item, 3);
        Py_ssize_t n = PyList_GET_SIZE(groups);
        Py_ssize_t at = bisect(values, v, code == GE || code == LT);
        if (at < 0)
            return -1;
        int failed = (code == GT || code == GE) ? consider_slice(groups, 0, at, props, matched)
                                                : consider_slice(groups, at, n, props, matched);
        if (failed < 0)
            return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(not_equal); i++) {
        PyObject *item = PyTuple_GET_ITEM(not_equal, i); /* (family, value, group) */
        if (PyLong_AsLong(PyTuple_GET_ITEM(item, 0)) != fam)
            continue;
        int differ = PyObject_RichCompareBool(v, PyTuple_GET_ITEM(item, 1), Py_NE);
        if (differ < 0)
            return -1;
        if (differ && consider(PyTuple_GET_ITEM(item, 2), props, matched) < 0)
            return -1;
    }
    return 0;
}

PyDoc_STRVAR(match_doc,
             "match(packed, unanchored, properties) -> set\n\n"
             "The keys of the filters that the dict ``properties`` matches: ``packed`` maps a\n"
             "property to its anchors as _Anchors.packed() gives them, ``unanchored`` holds\n"
             "the groups with no anchor.");

static PyObject *
match(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "match() takes packed, unanchored, properties");
        return NULL;
    }
    PyObject *packed = args[0], *unanchored = args[1], *props = args[2];
    if (family_map == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "messagebox.predicates._native: setup() not called");
        return NULL;
    }
    if (!PyDict_CheckExact(packed) || !PyDict_CheckExact(unanchored) || !PyDict_Check(props)) {
        PyErr_SetString(PyExc_TypeError, "match() takes three dicts");
        return NULL;
    }
    PyObject *matched = PySet_New(NULL);
    if (matched == NULL)
        return NULL;
    if (PyDict_GET_SIZE(unanchored) && consider_bucket(unanchored, props, matched) < 0)
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
        if (holding(anchors, v, props, matched) < 0)
            goto fail;
    }
    return matched;
fail:
    Py_DECREF(matched);
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
    return PyModule_Create(&module);
}
