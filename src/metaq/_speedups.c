/* metaq._speedups: the few hot paths where Python is the floor, in plain CPython C API.
 *
 * Why: per message, the consumer builds a Message and the producer takes a send and gives its SendResult; per
 * batch, the producer lays out the records region and the broker checks what it receives and stamps what it
 * stores. In Python those cost 2-5 times what they cost here (docs/compiled.md: the figures, and the commands that
 * measure them).
 *
 * The contract, for everything in this file:
 *  - A function is pure: bytes, buffers and plain values (ints, tuples, lists of bytes) in; bytes, ints and
 *    tuples out. It may decline (return None) a case it does not cover; its caller then runs the reference.
 *  - A type owns its state and has a method API of its own (Message, SendResult, MessageBuilder, PlainRun,
 *    PlainColumns). It reaches other Python objects only through their public protocols: calls, the buffer and
 *    iterator protocols, a class's attribute descriptors. Nothing here reads or writes another object's private
 *    attributes or memory layout (a Python subclass of a type here, as ProducerBatch of PlainColumns, adds slots of
 *    its own that this code never touches).
 *  - Each has ONE plain Python reference, written to be read, which is what metaq runs without this module (not
 *    built, or METAQ_NO_EXTENSIONS=1; metaq/_compiled.py is the one importer). Tests hold the two to the same
 *    results, and CI runs the unit tests both ways. docs/compiled.md lists each piece beside its reference.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

static PyObject *minus_one = NULL;
static PyObject *empty_str = NULL;
static PyObject *empty_tuple = NULL;
static PyObject *one = NULL;

/* ---------------------------------------------------------------- shared helpers */

static int
int_in(PyObject *v, long long lo, long long hi, long long *out)
{
    /* an int field within [lo, hi] (what struct packs it into): 1, or 0 for anything else */
    int overflow;
    if (!PyLong_Check(v)) {
        return 0;
    }
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow && *out >= lo && *out <= hi;
}

static int
limit_of(PyObject *v, long long *out)
{
    /* a size limit: an int, one beyond 64 bits clamped (no size reaches 2**63): 1, or 0 for anything else */
    int overflow;
    if (!PyLong_Check(v)) {
        return 0;
    }
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) {
        *out = overflow > 0 ? LLONG_MAX : LLONG_MIN;
    }
    return 1;
}

/* ---------------------------------------------------------------- SendResult (reference: metaq.types._PySendResult)
 *
 * The dataclass's seven fields, __init__, equality, repr and pickling, in a type the cyclic GC mostly does not see:
 * the producer keeps a window of tens of thousands of successes alive (each held by its future), and as instances of
 * a Python class they were walked by every full collection (~0.4 us of GC per message, docs/compiled.md). metaq.types
 * adds the rest of the dataclass to this (heap, mutable) type from Python: the partition_id and message_id_hex
 * properties and the dataclasses metadata (fields, asdict, replace and match work).
 *
 * Two kinds of instance, as `type` itself has (Py_TPFLAGS_HAVE_GC with a tp_is_gc that answers per instance):
 *  - built with an argument of a GC type (an exception, a container: every failure) or with no arguments (fields set
 *    later, as unpickling does): a tracked GC object, so a cycle through its error's traceback is collected;
 *  - every other (every success: bool, int, str and None only): a plain object, never seen by the collector and not
 *    counted towards its collections. It holds nothing that can lead back to it.
 * Not covered: assigning afterwards an object of a GC type to a success (r.error = exc) whose references lead back
 * to the result; that cycle is never freed (a leak, not a crash). The producer never does it. */

typedef struct {
    PyObject_HEAD
    PyObject *success;
    PyObject *message_id;
    PyObject *partition;
    PyObject *offset;
    PyObject *error;
    PyObject *topic;
    PyObject *broker_id;
    int is_gc;  /* allocated with the GC header; a subclass's instances always are */
} SendResultObject;

#define N_FIELDS 7
static const char *const field_names[N_FIELDS] = {
    "success", "message_id", "partition", "offset", "error", "topic", "broker_id",
};
#define FIELDS(o) (&((SendResultObject *)(o))->success)

static PyTypeObject *SendResult_Type = NULL;  /* made by PyType_FromSpec at import */

/* A plain instance of the exact type (no GC header), every field NULL. */
static SendResultObject *
new_plain(void)
{
    SendResultObject *r = (SendResultObject *)PyObject_Malloc(sizeof(SendResultObject));
    if (r == NULL) {
        return (SendResultObject *)PyErr_NoMemory();
    }
    PyObject_Init((PyObject *)r, SendResult_Type);  /* holds a reference to the (heap) type */
    memset(FIELDS(r), 0, N_FIELDS * sizeof(PyObject *));
    r->is_gc = 0;
    return r;
}

/* A GC instance of the exact type, every field NULL, tracked. */
static SendResultObject *
new_gc(void)
{
    SendResultObject *r = PyObject_GC_New(SendResultObject, SendResult_Type);
    if (r == NULL) {
        return NULL;
    }
    memset(FIELDS(r), 0, N_FIELDS * sizeof(PyObject *));
    r->is_gc = 1;
    PyObject_GC_Track(r);
    return r;
}

static int
SendResult_is_gc(PyObject *self)
{
    return ((SendResultObject *)self)->is_gc;
}

static void
SendResult_free(void *self)
{
    if (((SendResultObject *)self)->is_gc) {
        PyObject_GC_Del(self);
    }
    else {
        PyObject_Free(self);
    }
}

/* Whether the instance must be a GC object: an argument of a GC type, or no arguments (fields set later). */
static int
needs_gc(PyObject *args, PyObject *kwds)
{
    Py_ssize_t n = args == NULL ? 0 : PyTuple_GET_SIZE(args);
    Py_ssize_t nk = kwds == NULL ? 0 : PyDict_GET_SIZE(kwds);
    if (n == 0 && nk == 0) {
        return 1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_IS_GC(PyTuple_GET_ITEM(args, i))) {
            return 1;
        }
    }
    if (nk) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(kwds, &pos, &key, &value)) {
            if (PyObject_IS_GC(value)) {
                return 1;
            }
        }
    }
    return 0;
}

static PyObject *
SendResult_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    /* Like the dataclass's __new__: an instance with its fields unset (__init__ fills them). */
    SendResultObject *r;
    if (type != SendResult_Type) {
        r = (SendResultObject *)type->tp_alloc(type, 0);  /* a subclass: always GC */
        if (r != NULL) {
            r->is_gc = 1;
        }
    }
    else {
        r = needs_gc(args, kwds) ? new_gc() : new_plain();
    }
    return (PyObject *)r;
}

static int
SendResult_init(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"success", "message_id", "partition", "offset", "error", "topic", "broker_id", NULL};
    PyObject *v[N_FIELDS] = {NULL, minus_one, minus_one, minus_one, Py_None, empty_str, minus_one};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|OOOOOO:SendResult", kwlist,
                                     &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6])) {
        return -1;
    }
    PyObject **f = FIELDS(self);
    for (int i = 0; i < N_FIELDS; i++) {
        Py_INCREF(v[i]);
        Py_XSETREF(f[i], v[i]);
    }
    return 0;
}

static int
SendResult_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));  /* a heap type: its instances reference it */
    PyObject **f = FIELDS(self);
    for (int i = 0; i < N_FIELDS; i++) {
        Py_VISIT(f[i]);
    }
    return 0;
}

static int
SendResult_clear(PyObject *self)
{
    PyObject **f = FIELDS(self);
    for (int i = 0; i < N_FIELDS; i++) {
        Py_CLEAR(f[i]);
    }
    return 0;
}

static void
SendResult_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    if (((SendResultObject *)self)->is_gc) {
        PyObject_GC_UnTrack(self);
    }
    SendResult_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *
unset_field(PyObject *self, int i)
{
    /* the AttributeError reading an unset field gives (as a dataclass slot's) */
    PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%s'", Py_TYPE(self)->tp_name, field_names[i]);
    return NULL;
}

static PyMemberDef SendResult_members[] = {  /* as slots: readable, writable, deletable, AttributeError when unset */
    {"success", T_OBJECT_EX, offsetof(SendResultObject, success), 0, NULL},
    {"message_id", T_OBJECT_EX, offsetof(SendResultObject, message_id), 0, NULL},
    {"partition", T_OBJECT_EX, offsetof(SendResultObject, partition), 0, NULL},
    {"offset", T_OBJECT_EX, offsetof(SendResultObject, offset), 0, NULL},
    {"error", T_OBJECT_EX, offsetof(SendResultObject, error), 0, NULL},
    {"topic", T_OBJECT_EX, offsetof(SendResultObject, topic), 0, NULL},
    {"broker_id", T_OBJECT_EX, offsetof(SendResultObject, broker_id), 0, NULL},
    {NULL},
};

static PyObject *
SendResult_repr(PyObject *self)
{
    /* As the dataclass: Name(success=..., ...), '...' for a result met again inside its own repr. */
    int rc = Py_ReprEnter(self);
    if (rc != 0) {
        return rc > 0 ? PyUnicode_FromString("...") : NULL;
    }
    PyObject *result = NULL;
    PyObject **f = FIELDS(self);
    for (int i = 0; i < N_FIELDS; i++) {
        if (f[i] == NULL) {
            unset_field(self, i);
            goto done;
        }
    }
    PyObject *name = PyType_GetQualName(Py_TYPE(self));
    if (name != NULL) {
        result = PyUnicode_FromFormat("%U(success=%R, message_id=%R, partition=%R, offset=%R, error=%R, topic=%R, "
                                      "broker_id=%R)", name, f[0], f[1], f[2], f[3], f[4], f[5], f[6]);
        Py_DECREF(name);
    }
done:
    Py_ReprLeave(self);
    return result;
}

static PyObject *
SendResult_richcompare(PyObject *a, PyObject *b, int op)
{
    /* As the dataclass: equal when of the same class and the field tuples are equal; no ordering. */
    if ((op != Py_EQ && op != Py_NE) || Py_TYPE(a) != Py_TYPE(b)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject **fa = FIELDS(a), **fb = FIELDS(b);
    for (int i = 0; i < N_FIELDS; i++) {
        if (fa[i] == NULL || fb[i] == NULL) {
            return unset_field(fa[i] == NULL ? a : b, i);
        }
        int eq = PyObject_RichCompareBool(fa[i], fb[i], Py_EQ);
        if (eq < 0) {
            return NULL;
        }
        if (!eq) {
            return PyBool_FromLong(op == Py_NE);
        }
    }
    return PyBool_FromLong(op == Py_EQ);
}

static PyObject *
SendResult_reduce(PyObject *self, PyObject *unused)
{
    /* (class, the seven fields): unpickles into this type or, without the module, the dataclass. */
    PyObject **f = FIELDS(self);
    for (int i = 0; i < N_FIELDS; i++) {
        if (f[i] == NULL) {
            return unset_field(self, i);
        }
    }
    return Py_BuildValue("O(OOOOOOO)", (PyObject *)Py_TYPE(self), f[0], f[1], f[2], f[3], f[4], f[5], f[6]);
}

static int
set_from_dict(PyObject *self, PyObject *d)
{
    if (d == Py_None) {
        return 0;
    }
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "SendResult state must be (None, {field: value})");
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &key, &value)) {
        if (PyObject_SetAttr(self, key, value) < 0) {
            return -1;
        }
    }
    return 0;
}

static PyObject *
SendResult_setstate(PyObject *self, PyObject *state)
{
    /* What a pickle of the dataclass carries (object's default state for __slots__: (None, {field: value})),
     * so results pickled without the module load into this type. */
    if (PyTuple_Check(state) && PyTuple_GET_SIZE(state) == 2) {
        if (set_from_dict(self, PyTuple_GET_ITEM(state, 0)) < 0 || set_from_dict(self, PyTuple_GET_ITEM(state, 1)) < 0) {
            return NULL;
        }
    }
    else if (set_from_dict(self, state) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef SendResult_methods[] = {
    {"__reduce__", SendResult_reduce, METH_NOARGS, NULL},
    {"__setstate__", SendResult_setstate, METH_O, NULL},
    {NULL},
};

static PyType_Slot SendResult_slots[] = {
    {Py_tp_doc, "SendResult(success, message_id=-1, partition=-1, offset=-1, error=None, topic='', broker_id=-1)\n"
                "--\n\n"
                "What a send returns. A one-way (async) send returns partition, offset and id of -1, as MetaQ.\n\n"
                "``broker_id`` and ``partition`` say where the message was stored (``partition_id`` together)."},
    {Py_tp_new, SendResult_new},
    {Py_tp_init, SendResult_init},
    {Py_tp_dealloc, SendResult_dealloc},
    {Py_tp_free, SendResult_free},
    {Py_tp_is_gc, SendResult_is_gc},
    {Py_tp_traverse, SendResult_traverse},
    {Py_tp_clear, SendResult_clear},
    {Py_tp_repr, SendResult_repr},
    {Py_tp_hash, PyObject_HashNotImplemented},
    {Py_tp_richcompare, SendResult_richcompare},
    {Py_tp_methods, SendResult_methods},
    {Py_tp_members, SendResult_members},
    {0, NULL},
};

static PyType_Spec SendResult_spec = {
    .name = "metaq.types.SendResult",
    .basicsize = sizeof(SendResultObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = SendResult_slots,
};

/* ---------------------------------------------------------------- Message (reference: metaq.types._PyMessage)
 *
 * The dataclass's thirteen fields, __init__, equality and repr, in a type that owns them: `Message(topic, data)` is
 * one C call (~0.1 us) where the dataclass's __init__ runs 13 attribute stores in Python (~0.2 us). metaq.types adds
 * the rest of the dataclass to this (heap, mutable) type from Python: the partition_id property, the dataclasses
 * metadata (fields, asdict, replace and match work), __annotations__, __doc__ and __slots__ (the field names: with
 * them, copy and pickle take object's default path, the same reduce and state as the dataclass's, so a pickle made
 * with or without this module loads in either).
 *
 * Like the dataclass's generated methods, __init__, == and repr reach a subclass's instance through its attributes
 * (getattr / setattr, which a subclass may override); an instance of the exact type is read and written directly.
 * Always a GC object, as the dataclass's instances are (headers is a list). */

#define N_MESSAGE_FIELDS 13
enum {
    F_TOPIC, F_DATA, F_ATTRIBUTE, F_KEY, F_HEADERS, F_TIMESTAMP_MS, F_PARTITION, F_OFFSET, F_ID,
    F_APPEND_TIME_MS, F_BROKER_ID, F_DELIVER_AT, F_DELAY_MS,
};
static const char *const message_field_names[N_MESSAGE_FIELDS] = {
    "topic", "data", "attribute", "key", "headers", "timestamp_ms", "partition", "offset", "id",
    "append_time_ms", "broker_id", "deliver_at", "delay_ms",
};
#define N_REQUIRED 2  /* topic, data: the rest have defaults */
static PyObject *message_names[N_MESSAGE_FIELDS];      /* interned */
static PyObject *message_defaults[N_MESSAGE_FIELDS];   /* NULL for the required ones */

typedef struct {
    PyObject_HEAD
    PyObject *fields[N_MESSAGE_FIELDS];  /* NULL: unset (AttributeError on reading, as a slot's) */
} MessageObject;

static PyTypeObject *Message_Type = NULL;  /* made by PyType_FromSpec at import */

/* The argument `name` names: its field's index, or -1. */
static int
message_field_index(PyObject *name)
{
    for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
        if (name == message_names[i]) {
            return i;
        }
    }
    for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
        if (PyUnicode_Compare(name, message_names[i]) == 0) {
            return i;
        }
    }
    return -1;
}

/* One keyword argument into out[] (borrowed): 0, or -1 with the TypeError the dataclass's __init__ raises. */
static int
message_keyword(PyObject **out, PyObject *name, PyObject *value)
{
    if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "keywords must be strings");
        return -1;
    }
    int i = message_field_index(name);
    if (i < 0) {
        PyErr_Format(PyExc_TypeError, "Message.__init__() got an unexpected keyword argument '%S'", name);
        return -1;
    }
    if (out[i] != NULL) {
        PyErr_Format(PyExc_TypeError, "Message.__init__() got multiple values for argument '%S'", name);
        return -1;
    }
    out[i] = value;
    return 0;
}

/* After the positional and keyword arguments: the count and missing checks, in the order a Python function makes
 * them, then the defaults. out[] holds borrowed references. 0, or -1 with TypeError. */
static int
message_finish_args(PyObject **out, Py_ssize_t nargs)
{
    if (nargs > N_MESSAGE_FIELDS) {
        PyErr_Format(PyExc_TypeError, "Message.__init__() takes from %d to %d positional arguments but %zd were given",
                     N_REQUIRED + 1, N_MESSAGE_FIELDS + 1, nargs + 1);
        return -1;
    }
    if (out[F_TOPIC] == NULL || out[F_DATA] == NULL) {
        if (out[F_TOPIC] == NULL && out[F_DATA] == NULL) {
            PyErr_SetString(PyExc_TypeError,
                            "Message.__init__() missing 2 required positional arguments: 'topic' and 'data'");
        }
        else {
            PyErr_Format(PyExc_TypeError, "Message.__init__() missing 1 required positional argument: '%s'",
                         out[F_TOPIC] == NULL ? "topic" : "data");
        }
        return -1;
    }
    for (int i = N_REQUIRED; i < N_MESSAGE_FIELDS; i++) {
        if (out[i] == NULL) {
            out[i] = message_defaults[i];
        }
    }
    return 0;
}

/* Positional arguments into out[] (borrowed): the first thirteen (more is an error message_finish_args raises after
 * the keywords, as Python does). */
static void
message_positional(PyObject **out, PyObject *const *args, Py_ssize_t nargs)
{
    memset(out, 0, N_MESSAGE_FIELDS * sizeof(PyObject *));
    for (Py_ssize_t i = 0; i < nargs && i < N_MESSAGE_FIELDS; i++) {
        out[i] = args[i];
    }
}

/* The values into self: stored for the exact type, set as attributes (in field order) for a subclass's instance. */
static int
message_store(PyObject *self, PyObject **values)
{
    if (Py_TYPE(self) == Message_Type) {
        PyObject **f = ((MessageObject *)self)->fields;
        for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
            Py_XSETREF(f[i], Py_NewRef(values[i]));
        }
        return 0;
    }
    for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
        if (PyObject_SetAttr(self, message_names[i], values[i]) < 0) {
            return -1;
        }
    }
    return 0;
}

static int
Message_init(PyObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *values[N_MESSAGE_FIELDS];
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    message_positional(values, &PyTuple_GET_ITEM(args, 0), nargs);
    if (kwds != NULL) {
        PyObject *name, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(kwds, &pos, &name, &value)) {
            if (message_keyword(values, name, value) < 0) {
                return -1;
            }
        }
    }
    if (message_finish_args(values, nargs) < 0) {
        return -1;
    }
    return message_store(self, values);
}

static PyObject *
Message_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    /* Message(...): the arguments checked first, then the instance allocated and filled in one go. */
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if ((PyTypeObject *)type != Message_Type) {  /* not inherited by a subclass; should one get it: type.__call__ */
        PyObject *tuple = PyTuple_New(nargs), *dict = NULL, *result = NULL;
        if (tuple == NULL) {
            return NULL;
        }
        for (Py_ssize_t i = 0; i < nargs; i++) {
            PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
        }
        Py_ssize_t nk = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
        if (nk) {
            dict = PyDict_New();
            for (Py_ssize_t i = 0; dict != NULL && i < nk; i++) {
                if (PyDict_SetItem(dict, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
                    Py_CLEAR(dict);
                }
            }
            if (dict == NULL) {
                Py_DECREF(tuple);
                return NULL;
            }
        }
        result = PyType_Type.tp_call(type, tuple, dict);
        Py_DECREF(tuple);
        Py_XDECREF(dict);
        return result;
    }
    PyObject *values[N_MESSAGE_FIELDS];
    message_positional(values, args, nargs);
    if (kwnames != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
            if (message_keyword(values, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
                return NULL;
            }
        }
    }
    if (message_finish_args(values, nargs) < 0) {
        return NULL;
    }
    MessageObject *m = PyObject_GC_New(MessageObject, Message_Type);
    if (m == NULL) {
        return NULL;
    }
    for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
        m->fields[i] = Py_NewRef(values[i]);
    }
    PyObject_GC_Track(m);
    return (PyObject *)m;
}

static int
Message_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));  /* a heap type: its instances reference it */
    PyObject **f = ((MessageObject *)self)->fields;
    for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
        Py_VISIT(f[i]);
    }
    return 0;
}

static int
Message_clear(PyObject *self)
{
    PyObject **f = ((MessageObject *)self)->fields;
    for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
        Py_CLEAR(f[i]);
    }
    return 0;
}

static void
Message_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Message_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

#define MESSAGE_MEMBER(i) {NULL, T_OBJECT_EX, offsetof(MessageObject, fields) + (i) * sizeof(PyObject *), 0, NULL}
static PyMemberDef Message_members[] = {  /* as slots: readable, writable, deletable, AttributeError when unset */
    MESSAGE_MEMBER(0), MESSAGE_MEMBER(1), MESSAGE_MEMBER(2), MESSAGE_MEMBER(3), MESSAGE_MEMBER(4), MESSAGE_MEMBER(5),
    MESSAGE_MEMBER(6), MESSAGE_MEMBER(7), MESSAGE_MEMBER(8), MESSAGE_MEMBER(9), MESSAGE_MEMBER(10), MESSAGE_MEMBER(11),
    MESSAGE_MEMBER(12), {NULL},
};

/* The thirteen fields read as attributes, as the dataclass's methods read them: 0, or -1 (out[] cleared). */
static int
message_values(PyObject *self, PyObject **out)
{
    for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
        out[i] = PyObject_GetAttr(self, message_names[i]);
        if (out[i] == NULL) {
            for (int j = 0; j < i; j++) {
                Py_DECREF(out[j]);
            }
            return -1;
        }
    }
    return 0;
}

static void
message_release(PyObject **values)
{
    for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
        Py_DECREF(values[i]);
    }
}

static PyObject *
Message_repr(PyObject *self)
{
    /* As the dataclass: Qualname(topic=..., ...), each field's repr in order; '...' for a Message met again inside
     * its own repr (dataclasses' recursive_repr). */
    int rc = Py_ReprEnter(self);
    if (rc != 0) {
        return rc > 0 ? PyUnicode_FromString("...") : NULL;
    }
    PyObject *result = NULL;
    PyObject *parts = PyList_New(0);
    PyObject *name = PyType_GetQualName(Py_TYPE(self));
    PyObject *piece = name == NULL ? NULL : PyUnicode_FromFormat("%U(", name);
    if (parts == NULL || piece == NULL || PyList_Append(parts, piece) < 0) {
        goto done;
    }
    for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
        PyObject *value = PyObject_GetAttr(self, message_names[i]);
        if (value == NULL) {
            goto done;
        }
        Py_SETREF(piece, PyUnicode_FromFormat(i == 0 ? "%U=%R" : ", %U=%R", message_names[i], value));
        Py_DECREF(value);
        if (piece == NULL || PyList_Append(parts, piece) < 0) {
            goto done;
        }
    }
    Py_SETREF(piece, PyUnicode_FromString(")"));
    if (piece == NULL || PyList_Append(parts, piece) < 0) {
        goto done;
    }
    result = PyUnicode_Join(empty_str, parts);
done:
    Py_XDECREF(piece);
    Py_XDECREF(name);
    Py_XDECREF(parts);
    Py_ReprLeave(self);
    return result;
}

static PyObject *
Message_richcompare(PyObject *a, PyObject *b, int op)
{
    /* As the dataclass's __eq__: of the same class, each side's field tuple read in full (a's, then b's), then
     * compared as tuples compare (identity, then ==, item by item); NotImplemented otherwise. != is object's: the
     * negation of the instance's own == (a subclass's __eq__ included), unless that is NotImplemented. */
    if (op == Py_NE) {
        PyObject *eq = Py_TYPE(a)->tp_richcompare(a, b, Py_EQ);
        if (eq == NULL || eq == Py_NotImplemented) {
            return eq;
        }
        int truth = PyObject_IsTrue(eq);
        Py_DECREF(eq);
        return truth < 0 ? NULL : PyBool_FromLong(!truth);
    }
    if (op != Py_EQ || Py_TYPE(a) != Py_TYPE(b)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    PyObject *va[N_MESSAGE_FIELDS], *vb[N_MESSAGE_FIELDS];
    if (message_values(a, va) < 0) {
        return NULL;
    }
    if (message_values(b, vb) < 0) {
        message_release(va);
        return NULL;
    }
    int eq = 1;
    for (int i = 0; eq == 1 && i < N_MESSAGE_FIELDS; i++) {
        eq = PyObject_RichCompareBool(va[i], vb[i], Py_EQ);
    }
    message_release(va);
    message_release(vb);
    return eq < 0 ? NULL : PyBool_FromLong(eq);
}

static PyType_Slot Message_slots[] = {
    {Py_tp_doc, "Message(topic, data, attribute=None, key=None, headers=None, timestamp_ms=-1, partition=-1, "
                "offset=-1, id=-1, append_time_ms=-1, broker_id=-1, deliver_at=None, delay_ms=None)\n--\n\n"
                "A message as the producer sends it and the consumer receives it (metaq.types gives it the "
                "dataclass's docstring)."},
    {Py_tp_init, Message_init},  /* __new__ is object's, as the dataclass's: an instance with every field unset */
    {Py_tp_dealloc, Message_dealloc},
    {Py_tp_traverse, Message_traverse},
    {Py_tp_clear, Message_clear},
    {Py_tp_repr, Message_repr},
    {Py_tp_hash, PyObject_HashNotImplemented},
    {Py_tp_richcompare, Message_richcompare},
    {Py_tp_members, Message_members},
    {0, NULL},
};

static PyType_Spec Message_spec = {
    .name = "metaq.types.Message",
    .basicsize = sizeof(MessageObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = Message_slots,
};

/* A type made from a spec named "metaq.types.Name" says "Name" in error messages ("'Name' object has no attribute
 * ...", "unhashable type: 'Name'"), as its dataclass reference does: type's __name__ setter sets the short name. */
static int
short_name(PyTypeObject *type)
{
    PyObject *name = PyObject_GetAttrString((PyObject *)type, "__name__");
    int rc = name == NULL ? -1 : PyObject_SetAttrString((PyObject *)type, "__name__", name);
    Py_XDECREF(name);
    return rc;
}

/* The type, its member names and the defaults: 0, or -1 with an exception set. */
static int
message_type_init(void)
{
    for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
        message_names[i] = PyUnicode_InternFromString(message_field_names[i]);
        if (message_names[i] == NULL) {
            return -1;
        }
        Message_members[i].name = message_field_names[i];
        message_defaults[i] = i < N_REQUIRED ? NULL : (i <= F_HEADERS || i >= F_DELIVER_AT ? Py_None : minus_one);
    }
    Message_Type = (PyTypeObject *)PyType_FromSpec(&Message_spec);
    if (Message_Type == NULL) {
        return -1;
    }
    Message_Type->tp_vectorcall = Message_vectorcall;  /* this type's own constructor call; subclasses use type's */
    return short_name(Message_Type);
}

/* ---------------------------------------------------------------- MessageBuilder (reference: metaq.protocol.records.
 * decode.build_messages)
 *
 * The consumer's Messages, one per next() over a batch's columns. MessageBuilder(cls, field_names) takes the class
 * and, once, each field's attribute descriptor from it (the member descriptors of a slots dataclass); each Message is
 * then cls.__new__(cls) with every field set through its descriptor's __set__, what `m.topic = topic` does without
 * the lookup. field_names must be exactly the thirteen fields filled here, in order (ValueError otherwise), so a
 * field added to Message fails at import rather than being left unset. messages() reads the batch's lengths, offset
 * deltas and timestamps as buffers and makes each offset and id from its delta: a produced batch's ids are
 * consecutive (the previous id + 1) and its timestamps mostly equal (one int shared). Building Messages was about
 * half of the per-message iterator's CPU in Python. */

typedef struct {
    PyObject_HEAD
    PyTypeObject *cls;
    PyObject *setters[N_MESSAGE_FIELDS];  /* each field's data descriptor, from the class */
} MessageBuilderObject;

static PyTypeObject MessageBuilder_Type;
static PyTypeObject BatchMessages_Type;

static PyObject *
MessageBuilder_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *cls, *names;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "MessageBuilder takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "MessageBuilder", 2, 2, &cls, &names)) {
        return NULL;
    }
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "MessageBuilder(cls, field_names): cls must be a class");
        return NULL;
    }
    PyObject *fields = PySequence_Tuple(names);
    if (fields == NULL) {
        return NULL;
    }
    int same = PyTuple_GET_SIZE(fields) == N_MESSAGE_FIELDS;
    for (int i = 0; same && i < N_MESSAGE_FIELDS; i++) {
        PyObject *name = PyTuple_GET_ITEM(fields, i);
        same = PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, message_field_names[i]) == 0;
    }
    if (!same) {
        PyErr_Format(PyExc_ValueError, "MessageBuilder fills the fields topic, data, attribute, key, headers, "
                     "timestamp_ms, partition, offset, id, append_time_ms, broker_id, deliver_at, delay_ms, in this "
                     "order; %R has %R (src/metaq/_speedups.c must learn the new fields)", cls, fields);
        Py_DECREF(fields);
        return NULL;
    }
    MessageBuilderObject *self = PyObject_GC_New(MessageBuilderObject, type);
    if (self == NULL) {
        Py_DECREF(fields);
        return NULL;
    }
    self->cls = (PyTypeObject *)Py_NewRef(cls);
    memset(self->setters, 0, sizeof(self->setters));
    PyObject_GC_Track(self);
    for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
        PyObject *descr = PyObject_GetAttr(cls, PyTuple_GET_ITEM(fields, i));
        if (descr == NULL || Py_TYPE(descr)->tp_descr_set == NULL) {
            if (descr != NULL) {
                PyErr_Format(PyExc_ValueError, "MessageBuilder: %R.%U is not a settable attribute descriptor", cls,
                             PyTuple_GET_ITEM(fields, i));
                Py_DECREF(descr);
            }
            Py_DECREF(fields);
            Py_DECREF(self);
            return NULL;
        }
        self->setters[i] = descr;
    }
    Py_DECREF(fields);
    return (PyObject *)self;
}

static int
MessageBuilder_traverse(MessageBuilderObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->cls);
    for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
        Py_VISIT(self->setters[i]);
    }
    return 0;
}

static int
MessageBuilder_clear(MessageBuilderObject *self)
{
    Py_CLEAR(self->cls);
    for (int i = 0; i < N_MESSAGE_FIELDS; i++) {
        Py_CLEAR(self->setters[i]);
    }
    return 0;
}

static void
MessageBuilder_dealloc(MessageBuilderObject *self)
{
    PyObject_GC_UnTrack(self);
    MessageBuilder_clear(self);
    PyObject_GC_Del(self);
}

typedef struct {
    PyObject_HEAD
    MessageBuilderObject *builder;
    PyObject *topic;
    PyObject *raw;          /* bytes: the records' payloads back to back, from position on */
    Py_buffer lengths;      /* int32 each: payload i is lengths[i] bytes */
    Py_buffer deltas;       /* int32 each: record i's offset delta */
    Py_buffer timestamps;   /* int64 each */
    Py_ssize_t count;       /* records: the shortest of the three columns */
    Py_ssize_t position;    /* where in raw the next payload starts */
    PyObject *attributes;   /* iterators over each record's attribute, key and headers, or NULL: all None */
    PyObject *keys;
    PyObject *headers;
    long long base_offset;
    PyObject *base_message_id;
    PyObject *partition;
    PyObject *append_time_ms;
    PyObject *broker_id;
    Py_ssize_t next;        /* the next record */
    PyObject *last_id;      /* the previous record's id and timestamp, and its delta: a record whose delta is one */
    PyObject *last_timestamp;  /* more (every produced batch) gets last_id + 1, and one with the same timestamp (most */
    int32_t last_delta;     /* records of a batch have their batch's) shares the int object */
} BatchMessagesObject;

static PyObject *
iter_or_null(PyObject *column, int *failed)
{
    /* an iterator over a column, or NULL for None (a column of None) */
    if (column == Py_None || *failed) {
        return NULL;
    }
    PyObject *it = PyObject_GetIter(column);
    *failed = it == NULL;
    return it;
}

static int
get_column(PyObject *column, const char *format, Py_ssize_t itemsize, Py_buffer *out)
{
    /* an array column (typecode ``format``) through the buffer protocol: 0, or -1 with TypeError */
    if (PyObject_GetBuffer(column, out, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (out->itemsize != itemsize || out->format == NULL || strcmp(out->format, format) != 0) {
        PyBuffer_Release(out);
        PyErr_Format(PyExc_TypeError, "messages: a column must be an array('%s')", format);
        return -1;
    }
    return 0;
}

static PyObject *
MessageBuilder_messages(MessageBuilderObject *builder, PyObject *const *args, Py_ssize_t nargs)
{
    /* messages(topic, raw, start, lengths, deltas, timestamps, attributes, keys, headers, base_offset,
     *          base_message_id, partition, append_time_ms, broker_id) */
    if (nargs != 14) {
        PyErr_SetString(PyExc_TypeError, "messages(topic, raw, start, lengths, deltas, timestamps, attributes, keys, "
                                         "headers, base_offset, base_message_id, partition, append_time_ms, "
                                         "broker_id)");
        return NULL;
    }
    PyObject *raw = args[1];
    if (!PyBytes_Check(raw)) {
        PyErr_SetString(PyExc_TypeError, "messages: raw must be bytes");
        return NULL;
    }
    Py_ssize_t position = PyLong_AsSsize_t(args[2]);
    if (position == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (position < 0) {
        PyErr_SetString(PyExc_ValueError, "messages: start is negative");
        return NULL;
    }
    long long base_offset = PyLong_AsLongLong(args[9]);
    if (base_offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (!PyLong_Check(args[10])) {
        PyErr_SetString(PyExc_TypeError, "messages: base_message_id must be an int");
        return NULL;
    }
    Py_buffer lengths, deltas, timestamps;
    if (get_column(args[3], "i", 4, &lengths) < 0) {
        return NULL;
    }
    if (get_column(args[4], "i", 4, &deltas) < 0) {
        PyBuffer_Release(&lengths);
        return NULL;
    }
    if (get_column(args[5], "q", 8, &timestamps) < 0) {
        PyBuffer_Release(&lengths);
        PyBuffer_Release(&deltas);
        return NULL;
    }
    BatchMessagesObject *self = PyObject_GC_New(BatchMessagesObject, &BatchMessages_Type);
    if (self == NULL) {
        PyBuffer_Release(&lengths);
        PyBuffer_Release(&deltas);
        PyBuffer_Release(&timestamps);
        return NULL;
    }
    int failed = 0;
    self->builder = (MessageBuilderObject *)Py_NewRef(builder);
    self->topic = Py_NewRef(args[0]);
    self->raw = Py_NewRef(raw);
    self->lengths = lengths;
    self->deltas = deltas;
    self->timestamps = timestamps;
    self->count = lengths.len / 4;
    if (deltas.len / 4 < self->count) {
        self->count = deltas.len / 4;
    }
    if (timestamps.len / 8 < self->count) {
        self->count = timestamps.len / 8;
    }
    self->position = position;
    self->attributes = iter_or_null(args[6], &failed);
    self->keys = iter_or_null(args[7], &failed);
    self->headers = iter_or_null(args[8], &failed);
    self->base_offset = base_offset;
    self->base_message_id = Py_NewRef(args[10]);
    self->partition = Py_NewRef(args[11]);
    self->append_time_ms = Py_NewRef(args[12]);
    self->broker_id = Py_NewRef(args[13]);
    self->next = 0;
    self->last_id = self->last_timestamp = NULL;
    self->last_delta = 0;
    PyObject_GC_Track(self);
    if (failed) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
BatchMessages_traverse(BatchMessagesObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->builder);
    Py_VISIT(self->topic);
    Py_VISIT(self->raw);
    Py_VISIT(self->lengths.obj);
    Py_VISIT(self->deltas.obj);
    Py_VISIT(self->timestamps.obj);
    Py_VISIT(self->attributes);
    Py_VISIT(self->keys);
    Py_VISIT(self->headers);
    Py_VISIT(self->base_message_id);
    Py_VISIT(self->partition);
    Py_VISIT(self->append_time_ms);
    Py_VISIT(self->broker_id);
    Py_VISIT(self->last_id);
    Py_VISIT(self->last_timestamp);
    return 0;
}

static int
BatchMessages_clear(BatchMessagesObject *self)
{
    Py_CLEAR(self->builder);
    Py_CLEAR(self->topic);
    Py_CLEAR(self->raw);
    Py_buffer *buffers[] = {&self->lengths, &self->deltas, &self->timestamps};
    for (int i = 0; i < 3; i++) {
        if (buffers[i]->obj != NULL) {
            PyBuffer_Release(buffers[i]);
        }
    }
    self->count = 0;
    Py_CLEAR(self->attributes);
    Py_CLEAR(self->keys);
    Py_CLEAR(self->headers);
    Py_CLEAR(self->base_message_id);
    Py_CLEAR(self->partition);
    Py_CLEAR(self->append_time_ms);
    Py_CLEAR(self->broker_id);
    Py_CLEAR(self->last_id);
    Py_CLEAR(self->last_timestamp);
    return 0;
}

static void
BatchMessages_dealloc(BatchMessagesObject *self)
{
    PyObject_GC_UnTrack(self);
    BatchMessages_clear(self);
    PyObject_GC_Del(self);
}

static PyObject *
next_or_none(PyObject *it)
{
    /* the next value of a column's iterator (NULL when it is exhausted or failed), None for a column of None */
    return it == NULL ? Py_NewRef(Py_None) : PyIter_Next(it);
}

static PyObject *
BatchMessages_next(BatchMessagesObject *self)
{
    /* record self->next as build_messages makes it; the first column exhausted ends the batch */
    if (self->next >= self->count) {
        return NULL;
    }
    Py_ssize_t i = self->next;
    Py_ssize_t length = ((const int32_t *)self->lengths.buf)[i];
    int32_t delta = ((const int32_t *)self->deltas.buf)[i];
    if (length < 0) {
        PyErr_SetString(PyExc_ValueError, "messages: a payload length is negative");
        return NULL;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(self->raw);  /* bounds past raw are clamped, as a slice's are */
    Py_ssize_t start = self->position < size ? self->position : size;
    Py_ssize_t end = self->position + length < size ? self->position + length : size;
    PyObject *values[N_MESSAGE_FIELDS] = {NULL};
    PyObject *m = NULL;
    PyObject *const sources[] = {self->attributes, self->keys, self->headers};
    static const int fields[] = {F_ATTRIBUTE, F_KEY, F_HEADERS};
    for (int c = 0; c < 3; c++) {
        values[fields[c]] = next_or_none(sources[c]);
        if (values[fields[c]] == NULL) {
            goto done;
        }
    }
    if (self->last_id != NULL && (int64_t)delta == (int64_t)self->last_delta + 1) {
        values[F_ID] = PyNumber_Add(self->last_id, one);
    }
    else {
        PyObject *delta_obj = PyLong_FromLong(delta);
        values[F_ID] = delta_obj == NULL ? NULL : PyNumber_Add(self->base_message_id, delta_obj);
        Py_XDECREF(delta_obj);
    }
    int64_t timestamp = ((const int64_t *)self->timestamps.buf)[i];
    if (self->last_timestamp != NULL && i > 0 && ((const int64_t *)self->timestamps.buf)[i - 1] == timestamp) {
        values[F_TIMESTAMP_MS] = Py_NewRef(self->last_timestamp);
    }
    else {
        values[F_TIMESTAMP_MS] = PyLong_FromLongLong(timestamp);
    }
    long long base = self->base_offset;  /* base + delta within 64 bits, else in Python ints */
    if (delta > 0 ? base <= LLONG_MAX - delta : base >= LLONG_MIN - delta) {
        values[F_OFFSET] = PyLong_FromLongLong(base + delta);
    }
    else {
        PyObject *b = PyLong_FromLongLong(base), *d = PyLong_FromLong(delta);
        values[F_OFFSET] = b == NULL || d == NULL ? NULL : PyNumber_Add(b, d);
        Py_XDECREF(b);
        Py_XDECREF(d);
    }
    values[F_DATA] = PyBytes_FromStringAndSize(PyBytes_AS_STRING(self->raw) + start, end > start ? end - start : 0);
    if (values[F_ID] == NULL || values[F_OFFSET] == NULL || values[F_TIMESTAMP_MS] == NULL || values[F_DATA] == NULL) {
        goto done;
    }
    values[F_TOPIC] = Py_NewRef(self->topic);
    values[F_PARTITION] = Py_NewRef(self->partition);
    values[F_APPEND_TIME_MS] = Py_NewRef(self->append_time_ms);
    values[F_BROKER_ID] = Py_NewRef(self->broker_id);
    values[F_DELIVER_AT] = Py_NewRef(Py_None);
    values[F_DELAY_MS] = Py_NewRef(Py_None);
    PyTypeObject *cls = self->builder->cls;
    m = cls->tp_new(cls, empty_tuple, NULL);  /* cls.__new__(cls) */
    for (int f = 0; m != NULL && f < N_MESSAGE_FIELDS; f++) {
        PyObject *setter = self->builder->setters[f];
        if (Py_TYPE(setter)->tp_descr_set(setter, m, values[f]) < 0) {
            Py_CLEAR(m);
        }
    }
    if (m != NULL) {
        self->next++;
        self->position += length;
        Py_XSETREF(self->last_id, Py_NewRef(values[F_ID]));
        Py_XSETREF(self->last_timestamp, Py_NewRef(values[F_TIMESTAMP_MS]));
        self->last_delta = delta;
    }
done:
    for (int f = 0; f < N_MESSAGE_FIELDS; f++) {
        Py_XDECREF(values[f]);
    }
    return m;
}

static PyMethodDef MessageBuilder_methods[] = {
    {"messages", (PyCFunction)(void (*)(void))MessageBuilder_messages, METH_FASTCALL,
     "messages(topic, raw, start, lengths, deltas, timestamps, attributes, keys, headers, base_offset,\n"
     "base_message_id, partition, append_time_ms, broker_id): an iterator of a batch's Messages, one built per\n"
     "next(). Record i: payload lengths[i] bytes of raw (the first from start on), offset base_offset + deltas[i], id\n"
     "base_message_id + deltas[i], timestamps[i] (lengths and deltas: array('i'), timestamps: array('q')); attributes,\n"
     "keys and headers: iterables, or None when all None."},
    {NULL},
};

static PyTypeObject MessageBuilder_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "metaq._speedups.MessageBuilder",
    .tp_doc = "MessageBuilder(cls, field_names): builds instances of cls (Message) from a batch's columns, each field\n"
              "set through cls's attribute descriptor.",
    .tp_basicsize = sizeof(MessageBuilderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = MessageBuilder_new,
    .tp_dealloc = (destructor)MessageBuilder_dealloc,
    .tp_traverse = (traverseproc)MessageBuilder_traverse,
    .tp_clear = (inquiry)MessageBuilder_clear,
    .tp_methods = MessageBuilder_methods,
};

static PyTypeObject BatchMessages_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "metaq._speedups.BatchMessages",
    .tp_doc = "The Messages of one batch, built one per next() (MessageBuilder.messages).",
    .tp_basicsize = sizeof(BatchMessagesObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)BatchMessages_dealloc,
    .tp_traverse = (traverseproc)BatchMessages_traverse,
    .tp_clear = (inquiry)BatchMessages_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)BatchMessages_next,
};

/* ---------------------------------------------------------------- plain_region (reference: metaq.protocol.records.
 * encode.plain_region_py)
 *
 * The records region of every batch of plain messages a producer sends, in one pass: the six columns, the payloads
 * and the timestamps' range. In Python, array() from a list runs per item: a 2,300-record batch of 100 B took
 * ~400 us in column operations against ~47 us here. */

static void
put_le(char *out, uint64_t v, int width)
{
    /* v's low `width` bytes, little-endian whatever the host's order (the batch format's) */
    for (int b = 0; b < width; b++) {
        out[b] = (char)(v >> (8 * b));
    }
}

static PyObject *
plain_region(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    /* plain_region(values, timestamps) -> (region, min_ts, max_ts), or None when a value is not bytes or
     * bytearray (the caller builds the region in Python then). The uncompressed records region of a batch of
     * plain records (no key, attribute or headers): offset deltas 0..n-1 (int32), timestamps (int64),
     * key lengths -1 (int32), value lengths (int32), attribute lengths -1 (int16), header counts 0 (int16),
     * then the payloads back to back. timestamps: one int for every record, or a list/tuple of n ints. */
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "plain_region(values, timestamps)");
        return NULL;
    }
    PyObject *values = PySequence_Fast(args[0], "plain_region: values must be a sequence");
    if (values == NULL) {
        return NULL;
    }
    PyObject *result = NULL, *region = NULL, *stamps = NULL, *lo_obj = NULL, *hi_obj = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(values);
    PyObject **items = PySequence_Fast_ITEMS(values);
    long long one = 0;
    int shared = PyLong_Check(args[1]);
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "a record batch needs at least one record");
        goto done;
    }
    if (shared) {
        one = PyLong_AsLongLong(args[1]);
        if (one == -1 && PyErr_Occurred()) {
            goto done;
        }
    } else {
        stamps = PySequence_Fast(args[1], "plain_region: timestamps must be an int or a sequence of ints");
        if (stamps == NULL) {
            goto done;
        }
        if (PySequence_Fast_GET_SIZE(stamps) != n) {
            PyErr_SetString(PyExc_ValueError, "plain_region: one timestamp per value");
            goto done;
        }
    }
    Py_ssize_t payload = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        Py_ssize_t len;
        if (PyBytes_CheckExact(v)) {
            len = PyBytes_GET_SIZE(v);
        } else if (PyByteArray_CheckExact(v)) {
            len = PyByteArray_GET_SIZE(v);
        } else {
            result = Py_NewRef(Py_None);
            goto done;
        }
        if (len > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "a payload of more than 2**31-1 bytes");
            goto done;
        }
        payload += len;
    }
    if (n > (PY_SSIZE_T_MAX - payload) / 24) {
        PyErr_NoMemory();
        goto done;
    }
    region = PyBytes_FromStringAndSize(NULL, 24 * n + payload);
    if (region == NULL) {
        goto done;
    }
    char *deltas = PyBytes_AS_STRING(region);
    char *ts = deltas + 4 * n, *keys = ts + 8 * n, *lens = keys + 4 * n, *attrs = lens + 4 * n;
    char *hcounts = attrs + 2 * n, *data = hcounts + 2 * n;
    long long lo = one, hi = one;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long t = one;
        if (!shared) {
            PyObject *item = PySequence_Fast_GET_ITEM(stamps, i);
            if (!PyLong_Check(item)) {
                PyErr_Format(PyExc_TypeError, "a timestamp must be an int, not %.100s", Py_TYPE(item)->tp_name);
                goto done;
            }
            t = PyLong_AsLongLong(item);
            if (t == -1 && PyErr_Occurred()) {
                goto done;
            }
            if (i == 0 || t < lo) {
                lo = t;
            }
            if (i == 0 || t > hi) {
                hi = t;
            }
        }
        PyObject *v = items[i];  /* bytes or bytearray, checked above; a bytearray's size may not change here */
        Py_ssize_t len = PyBytes_CheckExact(v) ? PyBytes_GET_SIZE(v) : PyByteArray_GET_SIZE(v);
        put_le(deltas + 4 * i, (uint64_t)(uint32_t)i, 4);
        put_le(ts + 8 * i, (uint64_t)t, 8);
        put_le(keys + 4 * i, 0xFFFFFFFFu, 4);
        put_le(lens + 4 * i, (uint64_t)(uint32_t)len, 4);
        put_le(attrs + 2 * i, 0xFFFFu, 2);
        put_le(hcounts + 2 * i, 0, 2);
        memcpy(data, PyBytes_CheckExact(v) ? PyBytes_AS_STRING(v) : PyByteArray_AS_STRING(v), (size_t)len);
        data += len;
    }
    lo_obj = PyLong_FromLongLong(lo);
    hi_obj = PyLong_FromLongLong(hi);
    if (lo_obj != NULL && hi_obj != NULL) {
        result = PyTuple_Pack(3, region, lo_obj, hi_obj);
    }
done:
    Py_DECREF(values);
    Py_XDECREF(stamps);
    Py_XDECREF(region);
    Py_XDECREF(lo_obj);
    Py_XDECREF(hi_obj);
    return result;
}

/* ---------------------------------------------------------------- plain_columns_ok (reference: metaq.protocol.records.
 * validate.plain_columns_ok_py)
 *
 * The broker's side of the same format: whether a produced batch's columns are what a producer writes without
 * attributes or headers, whole and within the size limit, in one pass over the columns (the Python check makes a
 * Python int per column entry). validate_plain runs it on an uncompressed batch; validate_batch on the inflated
 * records of a compressed one. */

static uint32_t
get_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static int
columns_ok(const unsigned char *base, Py_ssize_t len, Py_ssize_t n, long long max_bytes)
{
    /* plain_columns_ok() of the len bytes at base (validate_plain calls it on the batch's own buffer) */
    if (n < 1 || n > len / 24) {
        return 0;
    }
    const unsigned char *deltas = base, *keys = base + 12 * n, *lens = base + 16 * n, *attrs = base + 20 * n;
    const unsigned char *hcounts = base + 22 * n;
    long long data = 0;
    int ok = 1;
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        int32_t klen = (int32_t)get_le32(keys + 4 * i), vlen = (int32_t)get_le32(lens + 4 * i);
        ok = get_le32(deltas + 4 * i) == (uint32_t)i && klen >= -1 && vlen >= 0
             && attrs[2 * i] == 0xFF && attrs[2 * i + 1] == 0xFF && hcounts[2 * i] == 0 && hcounts[2 * i + 1] == 0
             && 24 + (long long)(klen > 0 ? klen : 0) + vlen <= max_bytes;
        data += (klen > 0 ? klen : 0) + (long long)vlen;
    }
    return ok && 24 * (long long)n + data == (long long)len;
}

static PyObject *
plain_columns_ok(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    /* plain_columns_ok(region, n, max_message_bytes) -> bool: whether the records region of an n-record batch
     * is one a producer writes without attributes or headers, whole and within the size limit: offset deltas
     * 0..n-1, key lengths >= -1, value lengths >= 0, attribute lengths all -1, header counts all 0, the keys
     * and values filling the rest of the region exactly, and no record (24 bytes of columns, key, value) over
     * max_message_bytes. False for anything else, a count or a limit that is not an int included:
     * the caller's general check (records.validate.Columns.parse) then says what is wrong, or accepts what this
     * does not cover (attributes, headers). */
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "plain_columns_ok(region, n, max_message_bytes)");
        return NULL;
    }
    long long n, max_bytes;
    if (!int_in(args[1], 1, PY_SSIZE_T_MAX, &n) || !limit_of(args[2], &max_bytes)) {
        Py_RETURN_FALSE;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    int ok = columns_ok(view.buf, view.len, (Py_ssize_t)n, max_bytes);
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

/* ---------------------------------------------------------------- validate_plain, stamp_prefix (broker side)
 *
 * The broker's per-batch work on what producers send: the check of a produced batch (reference: records.validate.
 * validate_batch's Python code) and the 45 bytes stamped before the append (reference: records.format.
 * stamp_prefix_py). In Python some forty small steps a batch (struct unpacks, memoryview slices, five crc32c calls):
 * ~2 us and ~0.7 us against ~0.4 and ~0.2 here. The CRC32C is the crc32c package's, called as Python calls it. */

/* The batch header's layout (metaq.protocol.records, its module docstring): big-endian fields at these places. */
#define HEADER_BYTES 71
#define HEADER_CRC_COVERS 41    /* header_crc: CRC32C of [0, 41) continued over [45, 71) */
#define STAMPED_BYTES 45        /* [0, 45): what the broker stamps; crc covers [45, end) */
#define PRODUCER_BLOCK_BYTES 16
#define BATCH_MAGIC 2
#define ATTR_PRODUCER_STAMPED 0x8
#define ATTR_KNOWN (0x7 | 0x8 | 0x80)  /* compression, producer block, delayed (records.format.KNOWN_ATTRIBUTES) */
#define N_HEADER_FIELDS 12      /* records.BatchHeader: base_offset .. record_count, in read_header's order */
enum { H_BATCH_LENGTH = 1, H_CRC = 5, H_ATTRIBUTES = 7, H_LAST_DELTA, H_FIRST_TS, H_MAX_TS, H_COUNT };

static PyObject *crc32c_fn = NULL;  /* crc32c.crc32c, imported with this module: the package has no C API */

static uint64_t
get_be64(const unsigned char *p)
{
    return ((uint64_t)p[0] << 56) | ((uint64_t)p[1] << 48) | ((uint64_t)p[2] << 40) | ((uint64_t)p[3] << 32)
           | ((uint64_t)p[4] << 24) | ((uint64_t)p[5] << 16) | ((uint64_t)p[6] << 8) | (uint64_t)p[7];
}

static uint32_t
get_be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static void
put_be64(unsigned char *out, uint64_t v)
{
    out[0] = (unsigned char)(v >> 56), out[1] = (unsigned char)(v >> 48), out[2] = (unsigned char)(v >> 40);
    out[3] = (unsigned char)(v >> 32), out[4] = (unsigned char)(v >> 24), out[5] = (unsigned char)(v >> 16);
    out[6] = (unsigned char)(v >> 8), out[7] = (unsigned char)v;
}

static void
put_be32(unsigned char *out, uint32_t v)
{
    out[0] = (unsigned char)(v >> 24), out[1] = (unsigned char)(v >> 16), out[2] = (unsigned char)(v >> 8);
    out[3] = (unsigned char)v;
}

#define CRC_COPY_MAX 1024
/* Up to this many bytes crc32c_of() hands crc32c a copy (one bytes object) rather than a memoryview over them (a
 * memoryview and its managed buffer: two GC objects): ~25 ns less a call for a header or a small batch's body,
 * the same at 1-2 KiB (validate_plain of 200 B to 5 KiB batches, timeit). */

static int
crc32c_of(const unsigned char *p, Py_ssize_t len, uint32_t *out)
{
    /* crc32c.crc32c of the len bytes at p: 0, or -1 with an exception set. A memoryview over them does not copy;
     * the caller holds the buffer they are in, so a bytearray cannot be resized should crc32c release the GIL. */
    PyObject *data = len <= CRC_COPY_MAX ? PyBytes_FromStringAndSize((const char *)p, len)
                                         : PyMemoryView_FromMemory((char *)p, len, PyBUF_READ);
    if (data == NULL) {
        return -1;
    }
    PyObject *crc = PyObject_Vectorcall(crc32c_fn, &data, 1, NULL);
    Py_DECREF(data);
    if (crc == NULL) {
        return -1;
    }
    unsigned long v = PyLong_AsUnsignedLong(crc);
    Py_DECREF(crc);
    if (v == (unsigned long)-1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static PyObject *
validate_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    /* validate_plain(batch, max_message_bytes, max_batch_bytes, header_type) -> header_type or None: records.
     * validate_batch for what producers send, an uncompressed batch of plain records (with or without the producer
     * block). Its header, as read_header makes it, when the batch is within max_batch_bytes, its header whole with
     * magic 2, header_crc, length and body crc right, record_count >= 1 and last_offset_delta record_count - 1, no
     * attribute bit but the producer block's and the delayed flag, no compression, and plain_columns_ok() of its
     * records region. The header is tuple.__new__(header_type, its twelve fields in the format's order): a tuple
     * subclass such as the BatchHeader NamedTuple. None for anything else (another buffer than bytes, bytearray or a
     * memoryview of bytes, a check failing, compression, attributes or headers on records): validate_batch's Python
     * code then decides, and raises the precise error. Never an accept those checks would refuse. */
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "validate_plain(batch, max_message_bytes, max_batch_bytes, header_type)");
        return NULL;
    }
    PyObject *batch = args[0];
    PyTypeObject *header_type = (PyTypeObject *)args[3];
    if (!PyType_Check(header_type) || !PyType_IsSubtype(header_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "validate_plain: header_type must be a tuple class");
        return NULL;
    }
    long long max_message_bytes, max_batch_bytes;
    if (!limit_of(args[1], &max_message_bytes) || !limit_of(args[2], &max_batch_bytes)) {
        Py_RETURN_NONE;
    }
    if (!PyBytes_CheckExact(batch) && !PyByteArray_CheckExact(batch)) {
        /* len(batch), what the Python code measures, is its bytes only for a memoryview of single bytes in one
         * dimension (and a subclass of bytes could say otherwise) */
        if (!PyMemoryView_Check(batch) || PyMemoryView_GET_BUFFER(batch)->itemsize != 1
                || PyMemoryView_GET_BUFFER(batch)->ndim != 1) {
            Py_RETURN_NONE;
        }
    }
    Py_buffer view;
    if (PyObject_GetBuffer(batch, &view, PyBUF_SIMPLE) < 0) {  /* a released or non-contiguous memoryview */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *result = NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t total = view.len;
    if (total > max_batch_bytes || total < HEADER_BYTES || p[12] != BATCH_MAGIC
            || 12 + (long long)(int32_t)get_be32(p + 8) != total) {
        goto decline;
    }
    int attributes = (int16_t)(((unsigned)p[45] << 8) | p[46]);
    int32_t last_delta = (int32_t)get_be32(p + 47), count = (int32_t)get_be32(p + 67);
    Py_ssize_t records_at = attributes & ATTR_PRODUCER_STAMPED ? HEADER_BYTES + PRODUCER_BLOCK_BYTES : HEADER_BYTES;
    if (count < 1 || last_delta != count - 1 || (attributes & ~ATTR_KNOWN) || (attributes & 0x7)
            || total < records_at) {
        goto decline;
    }
    /* the columns before the CRCs: a batch with keys, attributes or headers is declined without computing them */
    if (!columns_ok(p + records_at, total - records_at, count, max_message_bytes)) {
        goto decline;
    }
    /* header_crc covers [0, 41) then [45, 71): the two copied side by side, so that crc32c runs once */
    unsigned char covered[HEADER_CRC_COVERS + HEADER_BYTES - STAMPED_BYTES];
    memcpy(covered, p, HEADER_CRC_COVERS);
    memcpy(covered + HEADER_CRC_COVERS, p + STAMPED_BYTES, HEADER_BYTES - STAMPED_BYTES);
    uint32_t header_crc, body_crc;
    if (crc32c_of(covered, sizeof(covered), &header_crc) < 0
            || crc32c_of(p + STAMPED_BYTES, total - STAMPED_BYTES, &body_crc) < 0) {
        goto done;
    }
    if (header_crc != get_be32(p + 41) || body_crc != get_be32(p + 37)) {
        goto decline;
    }
    /* the header, as read_header unpacks ">qibQQqIIhiqqi" (the id: (hi << 64) | lo) */
    PyObject *items[N_HEADER_FIELDS] = {NULL};
    uint64_t id_hi = get_be64(p + 13), id_lo = get_be64(p + 21);
    items[0] = PyLong_FromLongLong((int64_t)get_be64(p));
    items[1] = PyLong_FromLong((int32_t)get_be32(p + 8));
    items[2] = PyLong_FromLong(BATCH_MAGIC);
    if (id_hi == 0) {  /* what producers send (0): the broker stamps the id */
        items[3] = PyLong_FromUnsignedLongLong(id_lo);
    }
    else {
        PyObject *hi = PyLong_FromUnsignedLongLong(id_hi), *lo = PyLong_FromUnsignedLongLong(id_lo);
        PyObject *sixty_four = PyLong_FromLong(64);
        PyObject *shifted = hi != NULL && sixty_four != NULL ? PyNumber_Lshift(hi, sixty_four) : NULL;
        items[3] = shifted != NULL && lo != NULL ? PyNumber_Or(shifted, lo) : NULL;
        Py_XDECREF(hi);
        Py_XDECREF(lo);
        Py_XDECREF(sixty_four);
        Py_XDECREF(shifted);
    }
    items[4] = PyLong_FromLongLong((int64_t)get_be64(p + 29));
    items[5] = PyLong_FromUnsignedLong(body_crc);
    items[6] = PyLong_FromUnsignedLong(header_crc);
    items[7] = PyLong_FromLong(attributes);
    items[8] = PyLong_FromLong(last_delta);
    items[9] = PyLong_FromLongLong((int64_t)get_be64(p + 51));
    items[10] = PyLong_FromLongLong((int64_t)get_be64(p + 59));
    items[11] = PyLong_FromLong(count);
    PyObject *fields = PyTuple_New(N_HEADER_FIELDS);
    for (int i = 0; i < N_HEADER_FIELDS; i++) {
        if (fields != NULL && items[i] != NULL) {
            PyTuple_SET_ITEM(fields, i, items[i]);  /* owned by the tuple now */
        }
        else {
            Py_XDECREF(items[i]);
            Py_CLEAR(fields);
        }
    }
    if (fields != NULL && header_type == &PyTuple_Type) {
        result = fields;
    }
    else if (fields != NULL) {  /* tuple.__new__(header_type, fields), as a NamedTuple's own __new__ ends */
        PyObject *call = PyTuple_Pack(1, fields);
        result = call == NULL ? NULL : PyTuple_Type.tp_new(header_type, call, NULL);
        Py_XDECREF(call);
        Py_DECREF(fields);
    }
    goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&view);
    return result;
}

static int
low_128_bits(PyObject *v, unsigned char out[16])
{
    /* (v >> 64) & (2**64 - 1) and v & (2**64 - 1), as records._prefix takes a message id, big-endian: 1, or 0 for
     * anything but an int (3.11 and 3.12: or one beyond [-2**127, 2**128), which the Python code masks) */
    int overflow;
    if (!PyLong_Check(v)) {
        return 0;
    }
    long long small = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (!overflow) {
        put_be64(out, small < 0 ? UINT64_MAX : 0);
        put_be64(out + 8, (uint64_t)small);
        return 1;
    }
#if PY_VERSION_HEX >= 0x030D0000
    /* the low 16 bytes, sign-extended, whatever the int's size (the size it needs is returned, not refused) */
    if (PyLong_AsNativeBytes(v, out, 16, Py_ASNATIVEBYTES_BIG_ENDIAN) < 0) {
        PyErr_Clear();
        return 0;
    }
    return 1;
#else
    if (_PyLong_AsByteArray((PyLongObject *)v, out, 16, 0, overflow < 0) < 0) {
        PyErr_Clear();
        return 0;
    }
    return 1;
#endif
}

static PyObject *
stamp_prefix(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    /* stamp_prefix(header, base_offset, base_message_id, append_time_ms) -> bytes or None: the 45 bytes the broker
     * writes before batch[45:]: base_offset, the header's batch_length, magic 2, the id's two halves (its low 128
     * bits), append_time_ms, the header's crc, and header_crc over them and the header's fixed fields [45, 71).
     * header: a tuple of the twelve header fields in the format's order (a BatchHeader). None, for the Python code
     * to answer (and raise struct.error), unless every field is an int within what struct packs it into. */
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "stamp_prefix(header, base_offset, base_message_id, append_time_ms)");
        return NULL;
    }
    PyObject *header = args[0];
    if (!PyTuple_Check(header) || PyTuple_GET_SIZE(header) != N_HEADER_FIELDS) {
        Py_RETURN_NONE;
    }
    long long base_offset, append_time, batch_length, crc, attributes, last_delta, first_ts, max_ts, count;
    /* [0, 41) as written, then [45, 71) as the header says: what header_crc covers, side by side */
    unsigned char out[HEADER_CRC_COVERS + HEADER_BYTES - STAMPED_BYTES], *tail = out + HEADER_CRC_COVERS;
    if (!int_in(args[1], LLONG_MIN, LLONG_MAX, &base_offset) || !int_in(args[3], LLONG_MIN, LLONG_MAX, &append_time)
            || !int_in(PyTuple_GET_ITEM(header, H_BATCH_LENGTH), INT32_MIN, INT32_MAX, &batch_length)
            || !int_in(PyTuple_GET_ITEM(header, H_CRC), 0, UINT32_MAX, &crc)
            || !int_in(PyTuple_GET_ITEM(header, H_ATTRIBUTES), INT16_MIN, INT16_MAX, &attributes)
            || !int_in(PyTuple_GET_ITEM(header, H_LAST_DELTA), INT32_MIN, INT32_MAX, &last_delta)
            || !int_in(PyTuple_GET_ITEM(header, H_FIRST_TS), LLONG_MIN, LLONG_MAX, &first_ts)
            || !int_in(PyTuple_GET_ITEM(header, H_MAX_TS), LLONG_MIN, LLONG_MAX, &max_ts)
            || !int_in(PyTuple_GET_ITEM(header, H_COUNT), INT32_MIN, INT32_MAX, &count)
            || !low_128_bits(args[2], out + 13)) {
        Py_RETURN_NONE;
    }
    put_be64(out, (uint64_t)base_offset);
    put_be32(out + 8, (uint32_t)batch_length);
    out[12] = BATCH_MAGIC;
    put_be64(out + 29, (uint64_t)append_time);
    put_be32(out + 37, (uint32_t)crc);
    tail[0] = (unsigned char)(attributes >> 8), tail[1] = (unsigned char)attributes;
    put_be32(tail + 2, (uint32_t)last_delta);
    put_be64(tail + 6, (uint64_t)first_ts);
    put_be64(tail + 14, (uint64_t)max_ts);
    put_be32(tail + 22, (uint32_t)count);
    uint32_t header_crc;
    if (crc32c_of(out, sizeof(out), &header_crc) < 0) {
        return NULL;
    }
    put_be32(out + HEADER_CRC_COVERS, header_crc);  /* over the tail: [41, 45) of the prefix */
    return PyBytes_FromStringAndSize((const char *)out, STAMPED_BYTES);
}
/* ---------------------------------------------------------------- PlainRun (reference: metaq.client.producer.
 * plain_run.PlainRunPy)
 *
 * The producer's run of plain messages deferred to the end of an event-loop step (docs/producer.md, "The compiled
 * seam"): add_async / add_oneway check a message and make its future; a deferred topic's message has its bytes
 * counted and its payload, timestamp and future kept in lists this object owns (take() hands the run to the
 * placement), a direct topic's goes to place_one at once. What it is given it reaches through public protocols
 * only: the message class's attribute descriptors (read once, as MessageBuilder does), `in` on the topic
 * containers, the buffer's `used` and `limit` attributes, and calls. The reference's docstring is the specification;
 * tests/unit/client/producer/test_plain_run.py holds the two to the same runs. */

enum { P_TOPIC, P_DATA, P_KEY, P_ATTRIBUTE, P_HEADERS, P_TIMESTAMP_MS, P_DELIVER_AT, P_DELAY_MS, N_PLAIN_FIELDS };
static const char *const plain_field_names[N_PLAIN_FIELDS] = {
    "topic", "data", "key", "attribute", "headers", "timestamp_ms", "deliver_at", "delay_ms",
};
static PyObject *str_used = NULL, *str_limit = NULL;

typedef struct {
    PyObject_HEAD
    PyTypeObject *cls;
    PyObject *getters[N_PLAIN_FIELDS];  /* each field's data descriptor, from the class */
    PyObject *topics, *direct, *buffer, *create_future, *on_start, *on_flush, *place_one;
    long long acks, max_message_bytes, capacity, record_overhead;
    /* the run */
    PyObject *topic;      /* "" while empty */
    long long run_acks;
    PyObject *values, *waiters;
    PyObject *stamps;     /* NULL while no message of the run had a timestamp of its own */
    long long nbytes;
} PlainRunObject;

static PyTypeObject PlainRun_Type;

static int
PlainRun_traverse(PlainRunObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->cls);
    for (int i = 0; i < N_PLAIN_FIELDS; i++) {
        Py_VISIT(self->getters[i]);
    }
    Py_VISIT(self->topics);
    Py_VISIT(self->direct);
    Py_VISIT(self->place_one);
    Py_VISIT(self->buffer);
    Py_VISIT(self->create_future);
    Py_VISIT(self->on_start);
    Py_VISIT(self->on_flush);
    Py_VISIT(self->topic);
    Py_VISIT(self->values);
    Py_VISIT(self->waiters);
    Py_VISIT(self->stamps);
    return 0;
}

static int
PlainRun_clear(PlainRunObject *self)
{
    Py_CLEAR(self->cls);
    for (int i = 0; i < N_PLAIN_FIELDS; i++) {
        Py_CLEAR(self->getters[i]);
    }
    Py_CLEAR(self->topics);
    Py_CLEAR(self->direct);
    Py_CLEAR(self->place_one);
    Py_CLEAR(self->buffer);
    Py_CLEAR(self->create_future);
    Py_CLEAR(self->on_start);
    Py_CLEAR(self->on_flush);
    Py_CLEAR(self->topic);
    Py_CLEAR(self->values);
    Py_CLEAR(self->waiters);
    Py_CLEAR(self->stamps);
    return 0;
}

static void
PlainRun_dealloc(PlainRunObject *self)
{
    PyObject_GC_UnTrack(self);
    PlainRun_clear(self);
    PyObject_GC_Del(self);
}

/* An empty run: "" for its topic, new lists. 0, or -1 with an exception set. */
static int
run_reset(PlainRunObject *self)
{
    PyObject *values = PyList_New(0), *waiters = PyList_New(0);
    if (values == NULL || waiters == NULL) {
        Py_XDECREF(values);
        Py_XDECREF(waiters);
        return -1;
    }
    Py_XSETREF(self->values, values);
    Py_XSETREF(self->waiters, waiters);
    Py_XSETREF(self->topic, Py_NewRef(empty_str));
    Py_CLEAR(self->stamps);
    self->run_acks = 0;
    self->nbytes = 0;
    return 0;
}

static PyObject *
PlainRun_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *cls, *topics, *direct, *buffer, *create_future, *on_start, *on_flush, *place_one;
    long long acks, max_message_bytes, capacity, record_overhead;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "PlainRun takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!OOOOOOOLLLL:PlainRun", &PyType_Type, &cls, &topics, &direct, &buffer,
                          &create_future, &on_start, &on_flush, &place_one, &acks, &max_message_bytes, &capacity,
                          &record_overhead)) {
        return NULL;
    }
    if (!PyAnySet_Check(topics) || !PyCallable_Check(create_future) || !PyCallable_Check(on_start)
            || !PyCallable_Check(on_flush) || !PyCallable_Check(place_one)) {
        PyErr_SetString(PyExc_TypeError, "PlainRun(message_class, topics: set, direct, buffer, create_future, "
                        "on_start, on_flush, place_one, acks, max_message_bytes, capacity, record_overhead): the four "
                        "hooks are callables");
        return NULL;
    }
    PlainRunObject *self = PyObject_GC_New(PlainRunObject, type);
    if (self == NULL) {
        return NULL;
    }
    self->cls = (PyTypeObject *)Py_NewRef(cls);
    memset(self->getters, 0, sizeof(self->getters));
    self->topics = Py_NewRef(topics);
    self->direct = Py_NewRef(direct);
    self->place_one = Py_NewRef(place_one);
    self->buffer = Py_NewRef(buffer);
    self->create_future = Py_NewRef(create_future);
    self->on_start = Py_NewRef(on_start);
    self->on_flush = Py_NewRef(on_flush);
    self->acks = acks;
    self->max_message_bytes = max_message_bytes;
    self->capacity = capacity;
    self->record_overhead = record_overhead;
    self->topic = self->values = self->waiters = self->stamps = NULL;
    PyObject_GC_Track(self);
    if (run_reset(self) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    for (int i = 0; i < N_PLAIN_FIELDS; i++) {
        PyObject *descr = PyObject_GetAttrString(cls, plain_field_names[i]);
        if (descr == NULL || Py_TYPE(descr)->tp_descr_get == NULL) {
            if (descr != NULL) {
                PyErr_Format(PyExc_ValueError, "PlainRun: %R.%s is not an attribute descriptor", cls,
                             plain_field_names[i]);
                Py_DECREF(descr);
            }
            Py_DECREF(self);
            return NULL;
        }
        self->getters[i] = descr;
    }
    return (PyObject *)self;
}

/* A buffer attribute as a long long: 1, 0 when it is not an int (the caller declines), -1 on an error. */
static int
buffer_int(PyObject *buffer, PyObject *name, long long *out)
{
    PyObject *v = PyObject_GetAttr(buffer, name);
    if (v == NULL) {
        return -1;
    }
    int ok = limit_of(v, out);
    Py_DECREF(v);
    return ok;
}

static PyObject *
call_hook(PyObject *hook)
{
    PyObject *r = PyObject_CallNoArgs(hook);
    if (r == NULL) {
        return NULL;
    }
    Py_DECREF(r);
    return Py_None;  /* borrowed: only compared with NULL */
}

/* The reference's _size and _append: 1 taken (*waiter_out: the new future, or NULL for one-way), 0 declined (nothing
 * done), -1 on an error. */
static int
run_add(PlainRunObject *self, PyObject *msg, long long acks, int with_future, PyObject **waiter_out)
{
    PyObject *f[N_PLAIN_FIELDS] = {NULL};
    PyObject *waiter = NULL;
    int rc = 0;
    *waiter_out = NULL;
    if (Py_TYPE(msg) != self->cls) {
        return 0;
    }
    for (int i = 0; i < N_PLAIN_FIELDS; i++) {
        PyObject *g = self->getters[i];
        f[i] = Py_TYPE(g)->tp_descr_get(g, msg, (PyObject *)self->cls);
        if (f[i] == NULL) {
            rc = -1;
            goto done;
        }
    }
    PyObject *headers = f[P_HEADERS];
    if (!PyUnicode_CheckExact(f[P_TOPIC]) || !PyBytes_CheckExact(f[P_DATA]) || f[P_KEY] != Py_None
            || f[P_ATTRIBUTE] != Py_None || f[P_DELIVER_AT] != Py_None || f[P_DELAY_MS] != Py_None
            || !PyLong_CheckExact(f[P_TIMESTAMP_MS])
            || !(headers == Py_None || (PyList_CheckExact(headers) && PyList_GET_SIZE(headers) == 0)
                 || (PyTuple_CheckExact(headers) && PyTuple_GET_SIZE(headers) == 0))) {
        goto done;  /* another case (an empty headers container of another kind included): the general path */
    }
    int kept = PySet_Contains(self->topics, f[P_TOPIC]), direct = 0;
    if (kept == 0) {
        kept = direct = PySequence_Contains(self->direct, f[P_TOPIC]);
    }
    if (kept <= 0) {
        rc = kept;
        goto done;
    }
    int overflow;
    long long stamp = PyLong_AsLongLongAndOverflow(f[P_TIMESTAMP_MS], &overflow);
    if (overflow) {
        stamp = overflow;  /* only its sign is looked at here (the encoder refuses it later, as for any send) */
    }
    long long size = self->record_overhead + (long long)PyBytes_GET_SIZE(f[P_DATA]), used, limit;
    int got = buffer_int(self->buffer, str_used, &used);
    if (got > 0) {
        got = buffer_int(self->buffer, str_limit, &limit);
    }
    if (got <= 0) {
        rc = got;
        goto done;
    }
    if (size > self->max_message_bytes || (used + size > limit && used != 0)) {
        goto done;
    }
    rc = -1;  /* from here on the message is taken, or an error is raised */
    if (direct) {  /* placed at once, after the run so far (sends keep their order) */
        if (with_future) {
            waiter = PyObject_CallNoArgs(self->create_future);
            if (waiter == NULL) {
                goto done;
            }
        }
        if (PyList_GET_SIZE(self->values) > 0) {
            if (call_hook(self->on_flush) == NULL) {
                goto done;
            }
            if (PyList_GET_SIZE(self->values) > 0) {
                PyErr_SetString(PyExc_RuntimeError, "PlainRun: on_flush did not take the run");
                goto done;
            }
        }
        PyObject *size_obj = PyLong_FromLongLong(size), *acks_obj = PyLong_FromLongLong(acks);
        if (size_obj == NULL || acks_obj == NULL) {
            Py_XDECREF(size_obj);
            Py_XDECREF(acks_obj);
            goto done;
        }
        PyObject *call[6] = {f[P_TOPIC], f[P_DATA], f[P_TIMESTAMP_MS], waiter != NULL ? waiter : Py_None, size_obj,
                             acks_obj};
        PyObject *r = PyObject_Vectorcall(self->place_one, call, 6, NULL);
        Py_DECREF(size_obj);
        Py_DECREF(acks_obj);
        if (r == NULL) {
            goto done;
        }
        Py_DECREF(r);
        rc = 1;
        *waiter_out = waiter;
        waiter = NULL;
        goto done;
    }
    int called = 0;
    if (PyList_GET_SIZE(self->values) > 0) {
        int same = PyUnicode_Compare(f[P_TOPIC], self->topic);
        if (same == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (same != 0 || acks != self->run_acks) {
            called = 1;
            if (call_hook(self->on_flush) == NULL) {  /* the run so far goes first: sends keep their order */
                goto done;
            }
            if (PyList_GET_SIZE(self->values) > 0) {
                PyErr_SetString(PyExc_RuntimeError, "PlainRun: on_flush did not take the run");
                goto done;
            }
        }
    }
    if (PyList_GET_SIZE(self->values) == 0) {
        Py_SETREF(self->topic, Py_NewRef(f[P_TOPIC]));
        self->run_acks = acks;
        called = 1;
        if (call_hook(self->on_start) == NULL) {
            goto done;
        }
    }
    if (with_future) {
        called = 1;
        waiter = PyObject_CallNoArgs(self->create_future);
        if (waiter == NULL) {
            goto done;
        }
    }
    if (PyList_Append(self->values, f[P_DATA]) < 0) {
        goto done;
    }
    if (self->stamps != NULL) {
        if (PyList_Append(self->stamps, f[P_TIMESTAMP_MS]) < 0) {
            goto done;
        }
    }
    else if (stamp >= 0) {  /* the first timestamp given: the messages before it had none (-1) */
        Py_ssize_t before = PyList_GET_SIZE(self->values) - 1;
        PyObject *stamps = PyList_New(before + 1);
        if (stamps == NULL) {
            goto done;
        }
        for (Py_ssize_t i = 0; i < before; i++) {
            PyList_SET_ITEM(stamps, i, Py_NewRef(minus_one));
        }
        PyList_SET_ITEM(stamps, before, Py_NewRef(f[P_TIMESTAMP_MS]));
        self->stamps = stamps;
    }
    if (waiter != NULL && PyList_Append(self->waiters, waiter) < 0) {
        goto done;
    }
    self->nbytes += size;
    if (called) {  /* the hooks ran Python code: the buffer's count is read again */
        got = buffer_int(self->buffer, str_used, &used);
        if (got <= 0) {
            if (got == 0) {
                PyErr_SetString(PyExc_TypeError, "PlainRun: the buffer's used is not an int");
            }
            goto done;
        }
    }
    PyObject *now = PyLong_FromLongLong(used + size);
    if (now == NULL) {
        goto done;
    }
    int set = PyObject_SetAttr(self->buffer, str_used, now);
    Py_DECREF(now);
    if (set < 0) {
        goto done;
    }
    if (PyList_GET_SIZE(self->values) >= self->capacity && call_hook(self->on_flush) == NULL) {
        goto done;
    }
    rc = 1;
    *waiter_out = waiter;
    waiter = NULL;
done:
    Py_XDECREF(waiter);
    for (int i = 0; i < N_PLAIN_FIELDS; i++) {
        Py_XDECREF(f[i]);
    }
    return rc;
}

static PyObject *
PlainRun_add_async(PlainRunObject *self, PyObject *msg)
{
    PyObject *waiter;
    if (self->acks == 0) {
        Py_RETURN_NONE;
    }
    int rc = run_add(self, msg, self->acks, 1, &waiter);
    if (rc < 0) {
        return NULL;
    }
    return rc ? waiter : Py_NewRef(Py_None);
}

static PyObject *
PlainRun_add_oneway(PlainRunObject *self, PyObject *msg)
{
    PyObject *waiter;
    int rc = run_add(self, msg, 0, 0, &waiter);
    if (rc < 0) {
        return NULL;
    }
    return PyBool_FromLong(rc);
}

static PyObject *
PlainRun_take(PlainRunObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *taken = Py_BuildValue("(OLOOOL)", self->topic, self->run_acks, self->values,
                                    self->stamps != NULL ? self->stamps : Py_None, self->waiters, self->nbytes);
    if (taken == NULL || run_reset(self) < 0) {
        Py_XDECREF(taken);
        return NULL;
    }
    return taken;
}

static Py_ssize_t
PlainRun_len(PlainRunObject *self)
{
    return PyList_GET_SIZE(self->values);
}

static PyMethodDef PlainRun_methods[] = {
    {"add_async", (PyCFunction)PlainRun_add_async, METH_O,
     "add_async(message) -> its new future, or None: not the common case, nothing done"},
    {"add_oneway", (PyCFunction)PlainRun_add_oneway, METH_O,
     "add_oneway(message) -> bool: taken as a one-way send (False: not the common case, nothing done)"},
    {"take", (PyCFunction)PlainRun_take, METH_NOARGS,
     "take() -> (topic, acks, payloads, timestamps or None, futures, bytes): the run, emptied"},
    {NULL},
};

static PySequenceMethods PlainRun_as_sequence = {
    .sq_length = (lenfunc)PlainRun_len,
};

static PyTypeObject PlainRun_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "metaq._speedups.PlainRun",
    .tp_doc = "PlainRun(message_class, topics, direct, buffer, create_future, on_start, on_flush, place_one, acks,\n"
              "max_message_bytes, capacity, record_overhead): the producer's deferred run of plain messages (reference:\n"
              "metaq.client.producer.plain_run.PlainRunPy).",
    .tp_basicsize = sizeof(PlainRunObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PlainRun_new,
    .tp_dealloc = (destructor)PlainRun_dealloc,
    .tp_traverse = (traverseproc)PlainRun_traverse,
    .tp_clear = (inquiry)PlainRun_clear,
    .tp_methods = PlainRun_methods,
    .tp_as_sequence = &PlainRun_as_sequence,
};

/* ---------------------------------------------------------------- PlainColumns (reference: metaq.client.producer.
 * columns.PlainColumnsPy)
 *
 * An open batch's plain columns: payloads, timestamps and waiters of its records (lists this object owns), their
 * count and the batch's bytes. append() and extend() are the only ways a record joins a batch; the encoder and
 * the results read the lists it hands out (read-only attributes). ProducerBatch (a Python class) subclasses it, so
 * a plain send joins its batch in one C call. The reference's docstrings are the specification;
 * tests/unit/client/producer/test_plain_columns.py holds the two to the same results and errors. */

typedef struct {
    PyObject_HEAD
    PyObject *values, *timestamps, *waiters;
    PyObject *created_ms;  /* an int: the timestamp of a record given a negative one */
    Py_ssize_t count, size_bytes;
} PlainColumnsObject;

static PyTypeObject PlainColumns_Type;

static int
PlainColumns_traverse(PlainColumnsObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->values);
    Py_VISIT(self->timestamps);
    Py_VISIT(self->waiters);
    Py_VISIT(self->created_ms);
    return 0;
}

static int
PlainColumns_clear(PlainColumnsObject *self)
{
    Py_CLEAR(self->values);
    Py_CLEAR(self->timestamps);
    Py_CLEAR(self->waiters);
    Py_CLEAR(self->created_ms);
    return 0;
}

static void
PlainColumns_dealloc(PlainColumnsObject *self)
{
    PyObject_GC_UnTrack(self);
    PlainColumns_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Empty columns: new lists, no records. 0, or -1 with an exception set. */
static int
columns_reset(PlainColumnsObject *self)
{
    PyObject *values = PyList_New(0), *timestamps = PyList_New(0), *waiters = PyList_New(0);
    if (values == NULL || timestamps == NULL || waiters == NULL) {
        Py_XDECREF(values);
        Py_XDECREF(timestamps);
        Py_XDECREF(waiters);
        return -1;
    }
    Py_XSETREF(self->values, values);
    Py_XSETREF(self->timestamps, timestamps);
    Py_XSETREF(self->waiters, waiters);
    self->count = 0;
    return 0;
}

static PyObject *
PlainColumns_new(PyTypeObject *type, PyObject *Py_UNUSED(args), PyObject *Py_UNUSED(kwds))
{
    /* the arguments are __init__'s (a subclass's own, for ProducerBatch) */
    PlainColumnsObject *self = (PlainColumnsObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->created_ms = PyLong_FromLong(0);
    if (self->created_ms == NULL || columns_reset(self) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->size_bytes = 0;
    return (PyObject *)self;
}

static int
PlainColumns_init(PlainColumnsObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"created_ms", "size_bytes", NULL};
    PyObject *created_ms, *size_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:PlainColumns", kwlist, &created_ms, &size_bytes)) {
        return -1;
    }
    if (!PyLong_CheckExact(created_ms) || !PyLong_CheckExact(size_bytes)) {
        PyErr_SetString(PyExc_TypeError, "PlainColumns(created_ms: int, size_bytes: int)");
        return -1;
    }
    Py_ssize_t size = PyLong_AsSsize_t(size_bytes);
    if (size == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (columns_reset(self) < 0) {
        return -1;
    }
    Py_SETREF(self->created_ms, Py_NewRef(created_ms));
    self->size_bytes = size;
    return 0;
}

/* An exact int's sign: 1 (>= 0), 0 (< 0). */
static int
not_negative(PyObject *v)
{
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    return overflow ? overflow > 0 : x >= 0;
}

static PyObject *
PlainColumns_append(PlainColumnsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* append(timestamp_ms, value, waiter, size) -> None */
    if (nargs != 4 || !PyLong_CheckExact(args[0]) || !PyLong_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "PlainColumns.append(timestamp_ms: int, value, waiter, size: int)");
        return NULL;
    }
    Py_ssize_t size = PyLong_AsSsize_t(args[3]);
    if (size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *stamp = not_negative(args[0]) ? args[0] : self->created_ms;
    if (PyList_Append(self->values, args[1]) < 0 || PyList_Append(self->timestamps, stamp) < 0
            || PyList_Append(self->waiters, args[2]) < 0) {
        return NULL;
    }
    self->count += 1;
    self->size_bytes += size;
    Py_RETURN_NONE;
}

static PyObject *
PlainColumns_extend(PlainColumnsObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    /* extend(values, timestamps or None, waiters, size) -> None: checked whole before anything joins */
    if (nargs != 4 || !PyLong_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "PlainColumns.extend(values, timestamps, waiters, size: int)");
        return NULL;
    }
    Py_ssize_t size = PyLong_AsSsize_t(args[3]);
    if (size == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *values = NULL, *waiters = NULL, *given = NULL, *stamps = NULL, *result = NULL;
    values = PySequence_Fast(args[0], "PlainColumns.extend: values must be iterable");
    if (values == NULL) {
        goto done;
    }
    waiters = PySequence_Fast(args[2], "PlainColumns.extend: waiters must be iterable");
    if (waiters == NULL) {
        goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(values);
    if (args[1] == Py_None) {
        stamps = PyList_New(n);
        if (stamps == NULL) {
            goto done;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            PyList_SET_ITEM(stamps, i, Py_NewRef(self->created_ms));
        }
    }
    else {
        given = PySequence_Fast(args[1], "PlainColumns.extend: timestamps must be iterable");
        if (given == NULL) {
            goto done;
        }
        Py_ssize_t m = PySequence_Fast_GET_SIZE(given);
        PyObject **items = PySequence_Fast_ITEMS(given);
        for (Py_ssize_t i = 0; i < m; i++) {
            if (!PyLong_CheckExact(items[i])) {
                PyErr_SetString(PyExc_TypeError, "PlainColumns.extend: a timestamp is not an int");
                goto done;
            }
        }
        stamps = PyList_New(m);
        if (stamps == NULL) {
            goto done;
        }
        for (Py_ssize_t i = 0; i < m; i++) {
            PyList_SET_ITEM(stamps, i, Py_NewRef(not_negative(items[i]) ? items[i] : self->created_ms));
        }
    }
    if (PyList_GET_SIZE(stamps) != n || PySequence_Fast_GET_SIZE(waiters) != n) {
        PyErr_SetString(PyExc_ValueError, "PlainColumns.extend: values, timestamps and waiters of different lengths");
        goto done;
    }
    Py_ssize_t v = PyList_GET_SIZE(self->values), t = PyList_GET_SIZE(self->timestamps);
    Py_ssize_t w = PyList_GET_SIZE(self->waiters);
    if (PyList_SetSlice(self->values, v, v, values) < 0 || PyList_SetSlice(self->timestamps, t, t, stamps) < 0
            || PyList_SetSlice(self->waiters, w, w, waiters) < 0) {
        goto done;
    }
    self->count += n;
    self->size_bytes += size;
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(values);
    Py_XDECREF(waiters);
    Py_XDECREF(given);
    Py_XDECREF(stamps);
    return result;
}

static PyObject *
PlainColumns_drop_payloads(PlainColumnsObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *values = PyList_New(0), *timestamps = PyList_New(0);
    if (values == NULL || timestamps == NULL) {
        Py_XDECREF(values);
        Py_XDECREF(timestamps);
        return NULL;
    }
    Py_SETREF(self->values, values);
    Py_SETREF(self->timestamps, timestamps);
    Py_RETURN_NONE;
}

static PyMethodDef PlainColumns_methods[] = {
    {"append", (PyCFunction)(void (*)(void))PlainColumns_append, METH_FASTCALL,
     "append(timestamp_ms, value, waiter, size) -> None: one record (a negative timestamp: the creation time)"},
    {"extend", (PyCFunction)(void (*)(void))PlainColumns_extend, METH_FASTCALL,
     "extend(values, timestamps or None, waiters, size) -> None: a run of records, in order"},
    {"drop_payloads", (PyCFunction)PlainColumns_drop_payloads, METH_NOARGS,
     "drop_payloads() -> None: the payloads and timestamps let go (the batch is encoded)"},
    {NULL},
};

static PyMemberDef PlainColumns_members[] = {
    {"values", T_OBJECT, offsetof(PlainColumnsObject, values), READONLY, "the records' payloads"},
    {"timestamps", T_OBJECT, offsetof(PlainColumnsObject, timestamps), READONLY, "the records' timestamps"},
    {"waiters", T_OBJECT, offsetof(PlainColumnsObject, waiters), READONLY, "what learns each record's result"},
    {"created_ms", T_OBJECT, offsetof(PlainColumnsObject, created_ms), READONLY, "the batch's creation time"},
    {"count", T_PYSSIZET, offsetof(PlainColumnsObject, count), 0, "the records"},
    {"size_bytes", T_PYSSIZET, offsetof(PlainColumnsObject, size_bytes), 0, "the batch's bytes"},
    {NULL},
};

static PyTypeObject PlainColumns_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "metaq._speedups.PlainColumns",
    .tp_doc = "PlainColumns(created_ms, size_bytes): an open batch's payloads, timestamps and waiters, their count\n"
              "and the batch's bytes (reference: metaq.client.producer.columns.PlainColumnsPy).",
    .tp_basicsize = sizeof(PlainColumnsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PlainColumns_new,
    .tp_init = (initproc)PlainColumns_init,
    .tp_dealloc = (destructor)PlainColumns_dealloc,
    .tp_traverse = (traverseproc)PlainColumns_traverse,
    .tp_clear = (inquiry)PlainColumns_clear,
    .tp_free = PyObject_GC_Del,
    .tp_methods = PlainColumns_methods,
    .tp_members = PlainColumns_members,
};

/* ---------------------------------------------------------------- resolve_successes (reference: metaq.client.
 * producer.results.resolve_successes_py) */

static PyObject *str_set_result = NULL;
static PyObject *invalid_state_error = NULL;  /* asyncio.InvalidStateError, imported the first time one is raised */

static PyObject *
resolve_successes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    /* resolve_successes(waiters, base_id, base_offset, partition, topic, broker_id) -> None: waiters[i] (a future,
     * or None) gets SendResult(True, base_id + i, partition, base_offset + i, None, topic, broker_id), a success of
     * this module's SendResult (a plain object the cyclic GC does not track). A future already done is left as it
     * is: set_result is called, and its InvalidStateError cleared. */
    if (nargs != 6 || !PyList_Check(args[0]) || !PyLong_Check(args[1]) || !PyLong_Check(args[2])
            || !PyLong_Check(args[3]) || !PyUnicode_Check(args[4]) || !PyLong_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "resolve_successes(waiters: list, base_id: int, base_offset: int, "
                        "partition: int, topic: str, broker_id: int)");
        return NULL;
    }
    PyObject *waiters = args[0];
    PyObject *message_id = Py_NewRef(args[1]), *offset = Py_NewRef(args[2]);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(waiters); i++) {  /* the size read each time: calls run code */
        PyObject *w = PyList_GET_ITEM(waiters, i);
        if (w != Py_None) {
            SendResultObject *r = new_plain();
            if (r == NULL) {
                goto error;
            }
            r->success = Py_NewRef(Py_True);
            r->message_id = Py_NewRef(message_id);
            r->partition = Py_NewRef(args[3]);
            r->offset = Py_NewRef(offset);
            r->error = Py_NewRef(Py_None);
            r->topic = Py_NewRef(args[4]);
            r->broker_id = Py_NewRef(args[5]);
            Py_INCREF(w);
            PyObject *done = PyObject_CallMethodOneArg(w, str_set_result, (PyObject *)r);
            Py_DECREF(w);
            Py_DECREF(r);
            if (done == NULL) {
                if (invalid_state_error == NULL) {
                    PyObject *exc, *value, *tb;
                    PyErr_Fetch(&exc, &value, &tb);
                    PyObject *asyncio = PyImport_ImportModule("asyncio");
                    if (asyncio != NULL) {
                        invalid_state_error = PyObject_GetAttrString(asyncio, "InvalidStateError");
                        Py_DECREF(asyncio);
                    }
                    if (invalid_state_error == NULL) {
                        Py_XDECREF(exc);
                        Py_XDECREF(value);
                        Py_XDECREF(tb);
                        goto error;
                    }
                    PyErr_Restore(exc, value, tb);
                }
                if (!PyErr_ExceptionMatches(invalid_state_error)) {
                    goto error;
                }
                PyErr_Clear();  /* done already: its caller cancelled it */
            }
            else {
                Py_DECREF(done);
            }
        }
        Py_SETREF(message_id, PyNumber_Add(message_id, one));
        if (message_id == NULL) {
            goto error;
        }
        Py_SETREF(offset, PyNumber_Add(offset, one));
        if (offset == NULL) {
            goto error;
        }
    }
    Py_DECREF(message_id);
    Py_DECREF(offset);
    Py_RETURN_NONE;
error:
    Py_XDECREF(message_id);
    Py_XDECREF(offset);
    return NULL;
}

/* ================================================================ the module */

static PyMethodDef module_methods[] = {
    {"plain_region", (PyCFunction)(void (*)(void))plain_region, METH_FASTCALL,
     "plain_region(values, timestamps) -> (region, min_ts, max_ts) or None: a plain batch's records region"},
    {"plain_columns_ok", (PyCFunction)(void (*)(void))plain_columns_ok, METH_FASTCALL,
     "plain_columns_ok(region, n, max_message_bytes) -> bool: a plain produced batch's columns, checked"},
    {"validate_plain", (PyCFunction)(void (*)(void))validate_plain, METH_FASTCALL,
     "validate_plain(batch, max_message_bytes, max_batch_bytes, header_type) -> header or None: a plain batch, "
     "checked"},
    {"stamp_prefix", (PyCFunction)(void (*)(void))stamp_prefix, METH_FASTCALL,
     "stamp_prefix(header, base_offset, base_message_id, append_time_ms) -> bytes or None: the stamped 45 bytes"},
    {"resolve_successes", (PyCFunction)(void (*)(void))resolve_successes, METH_FASTCALL,
     "resolve_successes(waiters, base_id, base_offset, partition, topic, broker_id) -> None: a stored batch's "
     "futures get their SendResults"},
    {NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "metaq._speedups",
    .m_doc = "Compiled hot paths, each with a plain Python reference (docs/compiled.md): Message, the producer's "
             "SendResult the cyclic GC does not track, its deferred run of plain sends and the pass that gives a batch "
             "its results, the consumer's Message builder, a plain batch's records region and its check, the broker's "
             "check of a produced batch and its stamped prefix.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&MessageBuilder_Type) < 0 || PyType_Ready(&BatchMessages_Type) < 0
            || PyType_Ready(&PlainRun_Type) < 0
            || PyType_Ready(&PlainColumns_Type) < 0) {
        return NULL;
    }
    SendResult_Type = (PyTypeObject *)PyType_FromSpec(&SendResult_spec);
    if (SendResult_Type == NULL || short_name(SendResult_Type) < 0) {
        return NULL;
    }
    PyObject *crc32c = PyImport_ImportModule("crc32c");
    if (crc32c == NULL) {
        return NULL;
    }
    crc32c_fn = PyObject_GetAttrString(crc32c, "crc32c");
    Py_DECREF(crc32c);
    if (crc32c_fn == NULL) {
        return NULL;
    }
    minus_one = PyLong_FromLong(-1);
    empty_str = PyUnicode_FromString("");
    empty_tuple = PyTuple_New(0);
    one = PyLong_FromLong(1);
    str_used = PyUnicode_InternFromString("used");
    str_limit = PyUnicode_InternFromString("limit");
    str_set_result = PyUnicode_InternFromString("set_result");
    if (minus_one == NULL || empty_str == NULL || empty_tuple == NULL || one == NULL || str_used == NULL
            || str_limit == NULL || str_set_result == NULL) {
        return NULL;
    }
    if (message_type_init() < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "SendResult", (PyObject *)SendResult_Type) < 0
            || PyModule_AddObjectRef(m, "Message", (PyObject *)Message_Type) < 0
            || PyModule_AddObjectRef(m, "MessageBuilder", (PyObject *)&MessageBuilder_Type) < 0
            || PyModule_AddObjectRef(m, "PlainRun", (PyObject *)&PlainRun_Type) < 0
            || PyModule_AddObjectRef(m, "PlainColumns", (PyObject *)&PlainColumns_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
