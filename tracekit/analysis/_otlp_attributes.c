/* The fast reader's attribute loop in C (tracekit/analysis/_otlp_typed.py, ``attributes``).
 *
 * msgspec decodes every OTLP ``KeyValue`` of a span into a ``_KeyValue`` struct holding a
 * ``_Value`` struct; turning those into the span's attribute dict is one Python loop
 * iteration per attribute, and a span has 10 to 25 of them: the largest part of the reader's
 * Python. This is the same loop in C, reading the structs' fields at the offsets their member
 * descriptors give (as CPython's own attribute access does), after checking each object's
 * exact type. It does exactly what the Python version does, in the same order:
 *
 * - the value is the first set field of doubleValue, stringValue, intValue (decimal text
 *   becomes an int, as int() makes it), boolValue; texts are shared strings;
 * - an array whose items are all integers (tracekit's loop slices and waits) becomes a list
 *   of ints here too;
 * - anything else (other arrays, key-value lists, bytes, an integer text int() refuses)
 *   goes to the Python ``rest`` function, and a ``None`` from it leaves the attribute out;
 * - keys are shared strings; the last duplicate wins.
 *
 * Shared strings: ``shared`` is the dict of tracekit.analysis._records (a hit is used as is),
 * ``share`` the Python function that adds a miss (and bounds the table).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

static PyTypeObject *kv_type, *value_type, *array_type, *scalar_type;
static PyObject *unset, *shared, *share, *rest;
static Py_ssize_t key_at, value_at, double_at, string_at, int_at, bool_at, array_at;
static Py_ssize_t values_at, item_int_at;

#define FIELD(obj, at) (*(PyObject **)((char *)(obj) + (at)))

static int
offset_of(PyTypeObject *type, const char *name, Py_ssize_t *at)
{
    PyObject *descr = PyDict_GetItemString(type->tp_dict, name);  /* borrowed */
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a struct field", type->tp_name, name);
        return -1;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != T_OBJECT_EX && member->type != T_OBJECT) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not an object field", type->tp_name, name);
        return -1;
    }
    *at = member->offset;
    return 0;
}

PyDoc_STRVAR(configure_doc,
"configure(kv_type, value_type, array_type, scalar_type, unset, shared, share, rest) -> None\n\n"
"Set the struct types, the UNSET marker, the shared-string table and its Python adder, and\n"
"the Python conversion of the other values.");

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "configure() takes 8 arguments");
        return NULL;
    }
    for (int i = 0; i < 4; i++) {
        if (!PyType_Check(args[i])) {
            PyErr_SetString(PyExc_TypeError, "configure(): expected four types first");
            return NULL;
        }
    }
    if (!PyDict_CheckExact(args[5]) || !PyCallable_Check(args[6]) || !PyCallable_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "configure(): expected a dict and two callables last");
        return NULL;
    }
    PyTypeObject *kv = (PyTypeObject *)args[0], *value = (PyTypeObject *)args[1];
    PyTypeObject *array = (PyTypeObject *)args[2], *scalar = (PyTypeObject *)args[3];
    Py_ssize_t at[9];
    if (offset_of(kv, "key", &at[0]) < 0 || offset_of(kv, "value", &at[1]) < 0
            || offset_of(value, "doubleValue", &at[2]) < 0
            || offset_of(value, "stringValue", &at[3]) < 0
            || offset_of(value, "intValue", &at[4]) < 0
            || offset_of(value, "boolValue", &at[5]) < 0
            || offset_of(value, "arrayValue", &at[6]) < 0
            || offset_of(array, "values", &at[7]) < 0
            || offset_of(scalar, "intValue", &at[8]) < 0)
        return NULL;
    key_at = at[0]; value_at = at[1]; double_at = at[2]; string_at = at[3]; int_at = at[4];
    bool_at = at[5]; array_at = at[6]; values_at = at[7]; item_int_at = at[8];
    Py_XSETREF(kv_type, (PyTypeObject *)Py_NewRef(kv));
    Py_XSETREF(value_type, (PyTypeObject *)Py_NewRef(value));
    Py_XSETREF(array_type, (PyTypeObject *)Py_NewRef(array));
    Py_XSETREF(scalar_type, (PyTypeObject *)Py_NewRef(scalar));
    Py_XSETREF(unset, Py_NewRef(args[4]));
    Py_XSETREF(shared, Py_NewRef(args[5]));
    Py_XSETREF(share, Py_NewRef(args[6]));
    Py_XSETREF(rest, Py_NewRef(args[7]));
    Py_RETURN_NONE;
}

/* An int from an intValue field (decimal text or an int), or NULL, with no exception set,
 * when it is neither or int() would refuse the text. */
static PyObject *
integer(PyObject *field)
{
    if (PyLong_CheckExact(field))
        return Py_NewRef(field);
    if (!PyUnicode_CheckExact(field))
        return NULL;
    PyObject *x = PyLong_FromUnicodeObject(field, 10);
    if (x == NULL)
        PyErr_Clear();  /* the Python conversion raises the same error again */
    return x;
}

/* The list of ints of an all-integer array value, or NULL with no exception set when the
 * array is anything else (the Python conversion decides). */
static PyObject *
int_array(PyObject *array)
{
    PyObject *items = FIELD(array, values_at);
    if (items == NULL)
        return NULL;
    if (items == Py_None)
        return PyList_New(0);
    if (!PyList_CheckExact(items))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        PyErr_Clear();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i), *field, *x;
        if (!Py_IS_TYPE(item, scalar_type) || (field = FIELD(item, item_int_at)) == NULL
                || field == unset || (x = integer(field)) == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, x);
    }
    return out;
}

/* The shared string equal to ``text`` (a new reference), or NULL with an exception. */
static PyObject *
shared_text(PyObject *text)
{
    PyObject *hit = PyDict_GetItemWithError(shared, text);  /* borrowed */
    if (hit != NULL)
        return Py_NewRef(hit);
    if (PyErr_Occurred())
        return NULL;
    return PyObject_CallOneArg(share, text);
}

PyDoc_STRVAR(attributes_doc,
"attributes(kvs) -> dict[str, Any]\n\n"
"The typed attribute dict of a list of decoded _KeyValue structs (see the module comment).");

static PyObject *
attributes(PyObject *module, PyObject *kvs)
{
    if (kv_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        return NULL;
    }
    if (!PyList_Check(kvs)) {
        PyErr_SetString(PyExc_TypeError, "attributes() expects a list");
        return NULL;
    }
    /* Sized for every attribute at once: growing key by key would resize it twice. */
    PyObject *out = _PyDict_NewPresized(PyList_GET_SIZE(kvs));
    if (out == NULL)
        return NULL;
    /* The list may change under a Python callback (share, rest): index it afresh each time. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(kvs); i++) {
        PyObject *kv = PyList_GET_ITEM(kvs, i);
        if (!Py_IS_TYPE(kv, kv_type)) {
            PyErr_SetString(PyExc_TypeError, "attributes() expects _KeyValue structs");
            goto error;
        }
        Py_INCREF(kv);  /* holds its key and value while callbacks run */
        PyObject *key = FIELD(kv, key_at), *value = FIELD(kv, value_at), *x = NULL;
        if (key == NULL || value == NULL || !PyUnicode_CheckExact(key)
                || !Py_IS_TYPE(value, value_type)) {
            Py_DECREF(kv);
            PyErr_SetString(PyExc_TypeError, "attributes(): a _KeyValue struct is incomplete");
            goto error;
        }
        PyObject *field = FIELD(value, double_at);
        if (field != NULL && field != unset) {
            x = Py_NewRef(field);
        }
        else if ((field = FIELD(value, string_at)) != NULL && field != unset) {
            x = shared_text(field);
        }
        else if ((field = FIELD(value, int_at)) != NULL && field != unset
                 && (x = integer(field)) != NULL) {
        }
        else if ((field = FIELD(value, bool_at)) != NULL && field != unset
                 && FIELD(value, int_at) == unset) {
            x = Py_NewRef(field);
        }
        else if ((field = FIELD(value, array_at)) != NULL && Py_IS_TYPE(field, array_type)
                 && FIELD(value, int_at) == unset && FIELD(value, bool_at) == unset
                 && (x = int_array(field)) != NULL) {
        }
        else {
            x = PyObject_CallOneArg(rest, value);
            if (x == Py_None) {  /* an empty value: left out */
                Py_DECREF(x);
                Py_DECREF(kv);
                continue;
            }
        }
        if (x == NULL) {
            Py_DECREF(kv);
            goto error;
        }
        PyObject *name = shared_text(key);
        Py_DECREF(kv);
        if (name == NULL) {
            Py_DECREF(x);
            goto error;
        }
        int failed = PyDict_SetItem(out, name, x);
        Py_DECREF(name);
        Py_DECREF(x);
        if (failed < 0)
            goto error;
    }
    return out;
error:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL, configure_doc},
    {"attributes", attributes, METH_O, attributes_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_otlp_attributes",
    "The OTLP fast reader's attribute loop in C (see tracekit/analysis/_otlp_attributes.c).",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__otlp_attributes(void)
{
    return PyModule_Create(&module);
}
