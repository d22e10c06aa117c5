/* metaq._speedups: the producer's per-message SendResult, compiled (issue 13).
 *
 * Why compiled: of send_async's ~2.2 us of client CPU per message, the SendResult made per message and the
 * full collections it causes were ~0.5 us (docs/benchmarks.md, "send_async: a SendResult the GC does not
 * track"). Every instance of a Python class is tracked by the cyclic GC, so the window's tens of thousands
 * of live results (each held by its future, held by the caller) were walked by every full collection and
 * pushed one every ~40,000 messages. No way of building a Python object avoids that; a C type can.
 *
 * SendResult here behaves as the dataclass metaq.types._PySendResult (the pure-Python fallback, used when
 * this module is missing or METAQ_NO_SPEEDUPS=1): the same seven attributes, readable, writable and
 * deletable; equality and repr as the dataclass makes them; unhashable; partition_id and message_id_hex;
 * pickling, copy and the dataclasses helpers (metaq.types binds the dataclass's field table to this type).
 * tests/unit/test_send_result_impl.py runs the same checks against both.
 *
 * The cyclic GC and an error: a failed result holds an exception, and an exception can reference a
 * traceback -> frames -> their locals, which may hold the result itself: a cycle. An object the collector
 * does not know cannot be part of a collected cycle, so such a cycle would never be freed (a leak of one
 * traceback's frames per failure). And a GC-capable type whose instances are merely left untracked (what
 * CPython does for dicts and tuples of atomic values) is not enough: every GC object's allocation still
 * counts towards the next collection, and with a result per message that alone kept one full collection
 * per ~40,000 messages (measured: 0.36 us of GC per message against 0.07 with no result per message). So
 * this type has both kinds of instance, as `type` itself does (static types are not GC objects, heap
 * types are): Py_TPFLAGS_HAVE_GC with a tp_is_gc that answers per instance.
 *
 *  - An instance built with an argument of a GC type (an exception, a container: every failure the
 *    producer makes, SendResult(False, error=exc)) or with no arguments at all (SendResult.__new__, then
 *    fields set one by one, as unpickling an old pickle does) is a GC object: allocated with the GC
 *    header, tracked, tp_traverse/tp_clear over its fields. A cycle through its error is collected like any
 *    Python object's.
 *  - Every other one (every success: bool, int, str and None only) is a plain object: no GC header, never
 *    seen by the collector, not counted towards its collections. It holds nothing that can reference
 *    anything, so it cannot be part of a cycle.
 *
 * The one case this does not cover: assigning, afterwards, an object of a GC type to a field of a plain
 * instance (r.error = exc on a success), where that object then leads back to the result (exc's traceback
 * holds a frame whose locals hold r). That cycle is never freed (a leak of that cycle, not a crash). The
 * producer never does it; the dataclass fallback has no such case.
 *
 * BatchMessages: the consumer's per-message iterator over a batch (metaq.protocol.records._build_plain and
 * _build, its pure-Python twins): each next() builds one metaq.types.Message, an empty instance of the
 * dataclass (slots=True) whose thirteen slots are filled here, the payload sliced into its own bytes. bind_message() finds each slot's place in the instance once, from the class's member
 * descriptors, and refuses a class whose fields are not exactly the thirteen it fills (metaq.types then
 * keeps the Python builder; tests/unit/protocol/test_message_build.py fails). Building the Message was
 * about half of the per-message iterator's CPU (docs/benchmarks.md, "A compiled Message builder").
 *
 * bind_constructor(): Message(...) itself, the producer's side of the same idea (every send makes one). The class
 * gets a vectorcall (tp_vectorcall, which CPython uses to call a type object when set, and which subclasses do
 * not inherit) that does what type.__call__ does with the dataclass __init__: an instance from tp_alloc, every
 * field from the arguments or the __init__'s own __defaults__ (the same objects). A call the __init__ would
 * refuse goes the generic way, so its TypeError is CPython's own (3.13 words them differently from 3.11);
 * tests/unit/test_message_constructor.py holds the two to the same outcome with hypothesis. It stands in only
 * while the class is unchanged: bound to the class's tp_version_tag, which any assignment to a class attribute
 * (Message.__init__ = ..., a test double) replaces; then, and for any other class, every call goes the generic
 * way, through whatever __init__ is there. 0.18 -> 0.075 us a Message here.
 *
 * plain_region(): the records region of a batch of plain records (no key, attribute or headers) in one pass:
 * the six columns and the payloads, and the timestamps' range. The Python twin, metaq.protocol.records.
 * _plain_region_py, builds it from array columns; array() from a list or a map runs per item (a 2,300-record
 * batch of 100 B: 333 us for the columns and the join, 80 us for min() and max(), against 46-48 us here;
 * docs/benchmarks.md, "The send path's per-message and per-batch costs").
 *
 * plain_columns_ok(): the broker's side of the same format: whether a produced batch's columns are what a
 * producer writes without attributes or headers, whole and within the size limit, in one pass. A fast accept
 * only: it says yes to nothing the Python checks (metaq.protocol.records._Columns.parse) refuse, and no to
 * anything else, which those checks then decide (tests/unit/protocol/test_plain_region.py). validate_batch's
 * share of the broker's loop under the batch API was 26%, most of it Python ints made per column entry.
 *
 * validate_plain() and stamp_prefix(): the broker's per-batch work on a produced batch, the rest of what
 * records.validate_batch does around plain_columns_ok() (length, magic, header_crc, body crc, count and last delta,
 * attributes, the producer block) and the 45 bytes it stamps before the append (records.stamp_prefix). Python ran
 * them in ~2 us and ~0.7 us a batch of 1-5 messages (timeit; 3.2 and 1.2 us as the broker calls them, caches
 * colder), some forty small steps: struct unpacks, a NamedTuple, memoryview slices, five crc32c calls. Here 0.35-0.4
 * and 0.2 (0.55 and 0.3 in the broker). validate_plain is a fast accept like plain_columns_ok: the header
 * read_header would give, or None for anything it does not cover (compression, attributes or headers on records, a
 * check failing), and validate_batch's Python code decides those. The CRC32C is the crc32c package's, called as
 * Python calls it (it has no C API): once over the header's 67 covered bytes copied side by side, once over the
 * body. The header is built as tuple.__new__ builds a subclass's instance; calling the NamedTuple class instead
 * (its Python __new__) cost 0.2 us more.
 * bind_batch_header() gives both the BatchHeader class (checked: a tuple subclass with the twelve fields in order)
 * and crc32c.crc32c; tests/unit/protocol/test_compiled_batch_check.py holds them to the Python code.
 *
 * No code here knows the producer's internals: the producer is Python, and uses only SendResult and the batch
 * encoder's region builder from this module.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    PyObject *success;
    PyObject *message_id;
    PyObject *partition;
    PyObject *offset;
    PyObject *error;
    PyObject *topic;
    PyObject *broker_id;
    int is_gc;  /* allocated with the GC header (see above); a subclass's instances always are */
} SendResultObject;

#define N_FIELDS 7
static const char *const field_names[N_FIELDS] = {
    "success", "message_id", "partition", "offset", "error", "topic", "broker_id",
};
#define FIELDS(o) (&((SendResultObject *)(o))->success)

static PyTypeObject SendResult_Type;

/* Bound by metaq.types (bind()): PartitionId, format_message_id. */
static PyObject *partition_id_cls = NULL;
static PyObject *format_message_id_fn = NULL;

static PyObject *minus_one = NULL;
static PyObject *zero = NULL;
static PyObject *empty_str = NULL;

/* A plain instance of the exact type (no GC header), every field NULL. */
static SendResultObject *
new_plain(void)
{
    SendResultObject *r = (SendResultObject *)PyObject_Malloc(sizeof(SendResultObject));
    if (r == NULL) {
        return (SendResultObject *)PyErr_NoMemory();
    }
    PyObject_Init((PyObject *)r, &SendResult_Type);
    memset(FIELDS(r), 0, N_FIELDS * sizeof(PyObject *));
    r->is_gc = 0;
    return r;
}

/* A GC instance of the exact type, every field NULL, tracked. */
static SendResultObject *
new_gc(void)
{
    SendResultObject *r = PyObject_GC_New(SendResultObject, &SendResult_Type);
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
    if (type != &SendResult_Type) {
        r = (SendResultObject *)type->tp_alloc(type, 0);  /* a subclass: a heap type, always GC */
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
    PyObject **f = FIELDS(self);
    for (int i = 0; i < N_FIELDS; i++) {
        Py_VISIT(f[i]);
    }
    return 0;  /* a static type: a heap subclass's traverse visits its type itself */
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
    if (((SendResultObject *)self)->is_gc) {
        PyObject_GC_UnTrack(self);
    }
    PyObject **f = FIELDS(self);
    for (int i = 0; i < N_FIELDS; i++) {
        Py_CLEAR(f[i]);
    }
    Py_TYPE(self)->tp_free(self);
}

/* Attributes: get/set/delete as a dataclass slot (AttributeError when unset). */
static PyObject *
field_get(PyObject *self, void *closure)
{
    Py_ssize_t i = (Py_ssize_t)closure;
    PyObject *v = FIELDS(self)[i];
    if (v == NULL) {
        PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%s'", Py_TYPE(self)->tp_name,
                     field_names[i]);
        return NULL;
    }
    return Py_NewRef(v);
}

static int
field_set(PyObject *self, PyObject *value, void *closure)
{
    Py_ssize_t i = (Py_ssize_t)closure;
    PyObject **slot = &FIELDS(self)[i];
    if (value == NULL && *slot == NULL) {
        PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%s'", Py_TYPE(self)->tp_name,
                     field_names[i]);
        return -1;
    }
    Py_XINCREF(value);
    Py_XSETREF(*slot, value);  /* a plain instance stays plain: see the top of this file */
    return 0;
}

static PyObject *
get_partition_id(PyObject *self, void *closure)
{
    SendResultObject *r = (SendResultObject *)self;
    if (partition_id_cls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "metaq._speedups is not bound (import metaq.types)");
        return NULL;
    }
    if (r->broker_id == NULL || r->partition == NULL) {
        return field_get(self, (void *)(Py_ssize_t)(r->broker_id == NULL ? 6 : 2));
    }
    PyObject *args[2] = {r->broker_id, r->partition};
    return PyObject_Vectorcall(partition_id_cls, args, 2, NULL);
}

static PyObject *
get_message_id_hex(PyObject *self, void *closure)
{
    SendResultObject *r = (SendResultObject *)self;
    if (format_message_id_fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "metaq._speedups is not bound (import metaq.types)");
        return NULL;
    }
    if (r->message_id == NULL) {
        return field_get(self, (void *)1);
    }
    int nonneg = PyObject_RichCompareBool(r->message_id, zero, Py_GE);
    if (nonneg < 0) {
        return NULL;
    }
    if (!nonneg) {
        return PyUnicode_FromString("-1");
    }
    return PyObject_CallOneArg(format_message_id_fn, r->message_id);
}

static PyGetSetDef SendResult_getset[] = {
    {"success", field_get, field_set, NULL, (void *)0},
    {"message_id", field_get, field_set, NULL, (void *)1},
    {"partition", field_get, field_set, NULL, (void *)2},
    {"offset", field_get, field_set, NULL, (void *)3},
    {"error", field_get, field_set, NULL, (void *)4},
    {"topic", field_get, field_set, NULL, (void *)5},
    {"broker_id", field_get, field_set, NULL, (void *)6},
    {"partition_id", get_partition_id, NULL,
     "``brokerId-partition`` the message was stored in (InvalidArgument if it was not stored).", NULL},
    {"message_id_hex", get_message_id_hex, NULL, NULL, NULL},
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
    PyObject *name = PyType_GetQualName(Py_TYPE(self));
    if (name == NULL) {
        goto done;
    }
    PyObject **f = FIELDS(self);
    for (int i = 0; i < N_FIELDS; i++) {
        if (f[i] == NULL) {
            Py_DECREF(name);
            field_get(self, (void *)(Py_ssize_t)i);
            goto done;
        }
    }
    result = PyUnicode_FromFormat("%U(success=%R, message_id=%R, partition=%R, offset=%R, error=%R, topic=%R, "
                                  "broker_id=%R)", name, f[0], f[1], f[2], f[3], f[4], f[5], f[6]);
    Py_DECREF(name);
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
            return field_get(fa[i] == NULL ? a : b, (void *)(Py_ssize_t)i);
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
    /* (class, the seven fields): unpickles into this type or, without the extension, the dataclass. */
    PyObject **f = FIELDS(self);
    for (int i = 0; i < N_FIELDS; i++) {
        if (f[i] == NULL) {
            return field_get(self, (void *)(Py_ssize_t)i);
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
     * so results pickled without the extension load into this type. */
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

PyDoc_STRVAR(SendResult_doc,
"SendResult(success, message_id=-1, partition=-1, offset=-1, error=None, topic='', broker_id=-1)\n--\n\n"
"What a send returns. A one-way (async) send returns partition, offset and id of -1, as MetaQ.\n\n"
"``broker_id`` and ``partition`` say where the message was stored (``partition_id`` together).");

static PyTypeObject SendResult_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "metaq.types.SendResult",
    .tp_basicsize = sizeof(SendResultObject),
    .tp_dealloc = SendResult_dealloc,
    .tp_repr = SendResult_repr,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = SendResult_doc,
    .tp_traverse = SendResult_traverse,
    .tp_clear = SendResult_clear,
    .tp_richcompare = SendResult_richcompare,
    .tp_methods = SendResult_methods,
    .tp_getset = SendResult_getset,
    .tp_init = SendResult_init,
    .tp_new = SendResult_new,
    .tp_free = SendResult_free,
    .tp_is_gc = SendResult_is_gc,
};

static PyObject *
bind(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    /* bind(PartitionId, format_message_id, dataclass): what the properties call, and the dataclass's field
     * table, params and __match_args__ copied onto the type (dataclasses.fields/asdict/replace work). */
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "bind takes 3 arguments");
        return NULL;
    }
    Py_XSETREF(partition_id_cls, Py_NewRef(args[0]));
    Py_XSETREF(format_message_id_fn, Py_NewRef(args[1]));
    static const char *const copied[] = {"__dataclass_fields__", "__dataclass_params__", "__match_args__", NULL};
    for (int i = 0; copied[i] != NULL; i++) {
        PyObject *v = PyObject_GetAttrString(args[2], copied[i]);
        if (v == NULL) {
            return NULL;
        }
        int rc = PyDict_SetItemString(SendResult_Type.tp_dict, copied[i], v);
        Py_DECREF(v);
        if (rc < 0) {
            return NULL;
        }
    }
    PyType_Modified(&SendResult_Type);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- BatchMessages (consumer side) */

#define N_MESSAGE_SLOTS 13
enum {
    M_TOPIC, M_DATA, M_ATTRIBUTE, M_KEY, M_HEADERS, M_TIMESTAMP_MS, M_PARTITION, M_OFFSET, M_ID,
    M_APPEND_TIME_MS, M_BROKER_ID, M_DELIVER_AT, M_DELAY_MS,
};
static const char *const message_slot_names[N_MESSAGE_SLOTS] = {
    "topic", "data", "attribute", "key", "headers", "timestamp_ms", "partition", "offset", "id",
    "append_time_ms", "broker_id", "deliver_at", "delay_ms",
};
static PyTypeObject *message_type = NULL;
static Py_ssize_t message_slot_offsets[N_MESSAGE_SLOTS];

typedef struct {
    PyObject_HEAD
    PyObject *topic;
    PyObject *raw;          /* bytes: every payload of the batch, back to back */
    Py_buffer lengths;      /* int32 each (the batch's value-length column): payload i is lengths[i] bytes */
    Py_ssize_t count;       /* entries of lengths */
    Py_ssize_t position;    /* where in raw the next payload starts */
    PyObject *attributes;   /* iterators over each record's attribute, key and headers, or NULL: all None */
    PyObject *keys;
    PyObject *headers;
    PyObject *timestamps;   /* iterators over each record's timestamp, offset and id */
    PyObject *offsets;
    PyObject *ids;
    PyObject *partition;
    PyObject *append_time_ms;
    PyObject *broker_id;
    Py_ssize_t next;        /* index into lengths of the next payload */
} BatchMessagesObject;

static PyTypeObject BatchMessages_Type;

static int
object_slot(PyTypeObject *cls, PyObject *name, Py_ssize_t *offset)
{
    /* where the writable object slot ``name`` (a str) of cls lives in its instances, from the class's member
     * descriptor: 1 and *offset set, 0 when cls has no such slot, -1 on an error */
    PyObject *descr = PyDict_GetItemWithError(cls->tp_dict, name);  /* borrowed */
    if (descr == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        return 0;
    }
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    if (member->type != T_OBJECT_EX || (member->flags & READONLY) || member->offset <= 0
            || member->offset + (Py_ssize_t)sizeof(PyObject *) > cls->tp_basicsize) {
        return 0;
    }
    *offset = member->offset;
    return 1;
}

static int
object_slots(PyTypeObject *cls, const char *const *names, int n, Py_ssize_t *offsets)
{
    /* object_slot() of each of ``names``: 1 when all are found, 0 when one is not, -1 on an error */
    for (int i = 0; i < n; i++) {
        PyObject *name = PyUnicode_FromString(names[i]);
        if (name == NULL) {
            return -1;
        }
        int found = object_slot(cls, name, &offsets[i]);
        Py_DECREF(name);
        if (found <= 0) {
            return found;
        }
    }
    return 1;
}

static PyObject *
bind_message(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    /* bind_message(Message, field_names): the slot of each field in an instance, from the class's member
     * descriptors. ValueError (nothing bound) unless field_names are exactly the thirteen filled here and each
     * is a writable object slot of the class. */
    if (nargs != 2 || !PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "bind_message(cls, field_names)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *names = PySequence_Tuple(args[1]);
    if (names == NULL) {
        return NULL;
    }
    Py_ssize_t offsets[N_MESSAGE_SLOTS];
    int ok = PyTuple_GET_SIZE(names) == N_MESSAGE_SLOTS && cls->tp_dictoffset == 0;
    for (int i = 0; ok && i < N_MESSAGE_SLOTS; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        ok = PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, message_slot_names[i]) == 0;
        if (!ok) {
            break;
        }
        ok = object_slot(cls, name, &offsets[i]);
        if (ok < 0) {
            Py_DECREF(names);
            return NULL;
        }
    }
    Py_DECREF(names);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "the Message class is not the one the compiled builder fills "
                                          "(its fields or their slots differ)");
        return NULL;
    }
    memcpy(message_slot_offsets, offsets, sizeof(offsets));
    Py_XSETREF(message_type, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_NONE;
}

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

static PyObject *
BatchMessages_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    /* BatchMessages(topic, raw, start, lengths, attributes, keys, headers, timestamps, offsets, ids, partition,
     *               append_time_ms, broker_id); attributes, keys, headers: None when all None */
    PyObject *topic, *raw, *start, *lengths, *attributes, *keys, *headers, *timestamps, *offsets, *ids;
    PyObject *partition, *append_time_ms, *broker_id;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "BatchMessages takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "BatchMessages", 13, 13, &topic, &raw, &start, &lengths, &attributes, &keys,
                           &headers, &timestamps, &offsets, &ids, &partition, &append_time_ms, &broker_id)) {
        return NULL;
    }
    if (message_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind_message() was not called");
        return NULL;
    }
    if (!PyBytes_Check(raw)) {
        PyErr_SetString(PyExc_TypeError, "BatchMessages: raw must be bytes");
        return NULL;
    }
    Py_ssize_t position = PyLong_AsSsize_t(start);
    if (position == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (position < 0) {
        PyErr_SetString(PyExc_ValueError, "BatchMessages: start is negative");
        return NULL;
    }
    Py_buffer buffer;
    if (PyObject_GetBuffer(lengths, &buffer, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (buffer.itemsize != 4 || buffer.format == NULL || strcmp(buffer.format, "i") != 0) {
        PyBuffer_Release(&buffer);
        PyErr_SetString(PyExc_TypeError, "BatchMessages: lengths must be an array('i')");
        return NULL;
    }
    BatchMessagesObject *self = PyObject_GC_New(BatchMessagesObject, type);
    if (self == NULL) {
        PyBuffer_Release(&buffer);
        return NULL;
    }
    int failed = 0;
    self->topic = Py_NewRef(topic);
    self->raw = Py_NewRef(raw);
    self->lengths = buffer;
    self->count = buffer.len / 4;
    self->position = position;
    self->attributes = iter_or_null(attributes, &failed);
    self->keys = iter_or_null(keys, &failed);
    self->headers = iter_or_null(headers, &failed);
    self->timestamps = failed ? NULL : PyObject_GetIter(timestamps);
    self->offsets = self->timestamps ? PyObject_GetIter(offsets) : NULL;
    self->ids = self->offsets ? PyObject_GetIter(ids) : NULL;
    self->partition = Py_NewRef(partition);
    self->append_time_ms = Py_NewRef(append_time_ms);
    self->broker_id = Py_NewRef(broker_id);
    self->next = 0;
    PyObject_GC_Track(self);
    if (self->ids == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
BatchMessages_traverse(BatchMessagesObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->topic);
    Py_VISIT(self->raw);
    Py_VISIT(self->lengths.obj);
    Py_VISIT(self->attributes);
    Py_VISIT(self->keys);
    Py_VISIT(self->headers);
    Py_VISIT(self->timestamps);
    Py_VISIT(self->offsets);
    Py_VISIT(self->ids);
    Py_VISIT(self->partition);
    Py_VISIT(self->append_time_ms);
    Py_VISIT(self->broker_id);
    return 0;
}

static int
BatchMessages_clear(BatchMessagesObject *self)
{
    Py_CLEAR(self->topic);
    Py_CLEAR(self->raw);
    if (self->lengths.obj != NULL) {
        PyBuffer_Release(&self->lengths);
    }
    self->count = 0;
    Py_CLEAR(self->attributes);
    Py_CLEAR(self->keys);
    Py_CLEAR(self->headers);
    Py_CLEAR(self->timestamps);
    Py_CLEAR(self->offsets);
    Py_CLEAR(self->ids);
    Py_CLEAR(self->partition);
    Py_CLEAR(self->append_time_ms);
    Py_CLEAR(self->broker_id);
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
    /* zip(ends, ends[1:], attributes, keys, headers, timestamps, offsets, ids) as records._build walks it, the
     * ends being start and the running sum of lengths: the first column exhausted ends it */
    if (self->next >= self->count) {
        return NULL;
    }
    Py_ssize_t length = ((const int32_t *)self->lengths.buf)[self->next];
    if (length < 0) {
        PyErr_SetString(PyExc_ValueError, "BatchMessages: a payload length is negative");
        return NULL;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(self->raw);  /* bounds past raw are clamped, as a slice's are */
    Py_ssize_t start = self->position < size ? self->position : size;
    Py_ssize_t end = self->position + length < size ? self->position + length : size;
    PyObject *values[N_MESSAGE_SLOTS] = {NULL};
    PyObject *const sources[] = {self->attributes, self->keys, self->headers, self->timestamps, self->offsets,
                                 self->ids};
    static const int slots[] = {M_ATTRIBUTE, M_KEY, M_HEADERS, M_TIMESTAMP_MS, M_OFFSET, M_ID};
    for (int i = 0; i < 6; i++) {
        values[slots[i]] = next_or_none(sources[i]);
        if (values[slots[i]] == NULL) {
            goto fail;
        }
    }
    values[M_DATA] = PyBytes_FromStringAndSize(PyBytes_AS_STRING(self->raw) + start, end > start ? end - start : 0);
    if (values[M_DATA] == NULL) {
        goto fail;
    }
    PyObject *m = message_type->tp_alloc(message_type, 0);
    if (m == NULL) {
        goto fail;
    }
    self->next++;
    self->position += length;
    values[M_TOPIC] = Py_NewRef(self->topic);
    values[M_PARTITION] = Py_NewRef(self->partition);
    values[M_APPEND_TIME_MS] = Py_NewRef(self->append_time_ms);
    values[M_BROKER_ID] = Py_NewRef(self->broker_id);
    values[M_DELIVER_AT] = Py_NewRef(Py_None);
    values[M_DELAY_MS] = Py_NewRef(Py_None);
    for (int i = 0; i < N_MESSAGE_SLOTS; i++) {  /* tp_alloc zeroed the instance: every slot is empty */
        *(PyObject **)((char *)m + message_slot_offsets[i]) = values[i];
    }
    return m;
fail:
    for (int i = 0; i < N_MESSAGE_SLOTS; i++) {
        Py_XDECREF(values[i]);
    }
    return NULL;
}

static PyTypeObject BatchMessages_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "metaq._speedups.BatchMessages",
    .tp_doc = "BatchMessages(topic, raw, start, lengths, attributes, keys, headers, timestamps, offsets, ids,\n"
              "partition, append_time_ms, broker_id): the Messages of a batch, built one per next(); payload i is\n"
              "lengths[i] bytes of raw from start on (lengths: an array('i')); attributes, keys and headers None\n"
              "when all None (the compiled metaq.protocol.records._build_plain and _build).",
    .tp_basicsize = sizeof(BatchMessagesObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = BatchMessages_new,
    .tp_dealloc = (destructor)BatchMessages_dealloc,
    .tp_traverse = (traverseproc)BatchMessages_traverse,
    .tp_clear = (inquiry)BatchMessages_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)BatchMessages_next,
};

/* ---------------------------------------------------------------- Message(...) (producer side) */

static PyObject *message_defaults = NULL;   /* the dataclass __init__'s __defaults__: the optional fields' */
static PyObject *message_field_strs[N_MESSAGE_SLOTS];  /* interned field names, for keyword arguments */
static Py_ssize_t message_required = 0;     /* the fields without a default: the first ones */
static unsigned int message_version = 0;    /* the class's tp_version_tag when bound: any change to the class
                                             * (Message.__init__ = ..., any attribute set) gives it another */

static PyObject *
message_call_generic(PyObject *callable, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* what calling the class does without the compiled constructor: type.__call__ (__new__, then __init__) */
    PyObject *tuple = PyTuple_New(nargs), *kwargs = NULL, *result = NULL;
    if (tuple == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    }
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        kwargs = PyDict_New();
        if (kwargs == NULL) {
            goto done;
        }
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(kwnames); j++) {
            if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, j), args[nargs + j]) < 0) {
                goto done;
            }
        }
    }
    result = Py_TYPE(callable)->tp_call(callable, tuple, kwargs);
done:
    Py_DECREF(tuple);
    Py_XDECREF(kwargs);
    return result;
}

static PyObject *
Message_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    /* Message(...): what type.__call__ does with the dataclass __init__ (an instance from tp_alloc, each field
     * set from the arguments or its default), without running Python code. Anything else goes the generic way
     * (type.__call__, i.e. __new__ and whatever __init__ is there): another class, the class changed since it
     * was bound (tp_version_tag differs), and every call the __init__ would refuse (too many positional
     * arguments, an unknown or repeated keyword, a required one missing), so that its TypeError is the one the
     * running CPython words. */
    PyTypeObject *type = (PyTypeObject *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (type != message_type || message_version == 0 || type->tp_version_tag != message_version
            || nargs > N_MESSAGE_SLOTS) {
        return message_call_generic(callable, args, nargs, kwnames);
    }
    PyObject *values[N_MESSAGE_SLOTS] = {NULL};  /* borrowed */
    for (Py_ssize_t i = 0; i < nargs; i++) {
        values[i] = args[i];
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t j = 0; j < nkw; j++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, j);
        int found = -1;
        for (int i = 0; i < N_MESSAGE_SLOTS && found < 0; i++) {  /* keyword names are interned: usually */
            if (name == message_field_strs[i]) {
                found = i;
            }
        }
        for (int i = 0; i < N_MESSAGE_SLOTS && found < 0 && PyUnicode_Check(name); i++) {
            if (PyUnicode_Compare(name, message_field_strs[i]) == 0) {  /* both str: no error */
                found = i;
            }
        }
        if (found < 0 || values[found] != NULL) {
            return message_call_generic(callable, args, nargs, kwnames);
        }
        values[found] = args[nargs + j];
    }
    for (Py_ssize_t i = 0; i < message_required; i++) {
        if (values[i] == NULL) {
            return message_call_generic(callable, args, nargs, kwnames);
        }
    }
    PyObject *m = type->tp_alloc(type, 0);
    if (m == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < N_MESSAGE_SLOTS; i++) {  /* tp_alloc zeroed the instance: every slot is empty */
        PyObject *v = values[i] != NULL ? values[i] : PyTuple_GET_ITEM(message_defaults, i - message_required);
        *(PyObject **)((char *)m + message_slot_offsets[i]) = Py_NewRef(v);
    }
    return m;
}

static PyObject *
bind_constructor(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    /* bind_constructor(Message): calling the class builds the instance here (Message_vectorcall) instead of
     * running the dataclass __init__. After bind_message(Message, ...) only. ValueError (nothing changed)
     * unless Message.__init__ is a plain function of self and the thirteen fields in their order, positional or
     * keyword, the required ones first and the others with __defaults__. */
    if (nargs != 1 || (PyTypeObject *)args[0] != message_type || message_type == NULL) {
        PyErr_SetString(PyExc_TypeError, "bind_constructor(cls): cls as given to bind_message");
        return NULL;
    }
    PyTypeObject *cls = message_type;
    PyObject *init = PyObject_GetAttrString((PyObject *)cls, "__init__");  /* gives the class a version tag */
    if (init == NULL) {
        return NULL;
    }
    PyObject *defaults = NULL, *names[N_MESSAGE_SLOTS] = {NULL};
    int ok = PyFunction_Check(init);
    if (ok) {
        PyCodeObject *code = (PyCodeObject *)PyFunction_GET_CODE(init);
        defaults = PyFunction_GET_DEFAULTS(init);
        PyObject *varnames = PyObject_GetAttrString((PyObject *)code, "co_varnames");
        if (varnames == NULL) {
            Py_DECREF(init);
            return NULL;
        }
        ok = code->co_argcount == N_MESSAGE_SLOTS + 1 && code->co_kwonlyargcount == 0
             && code->co_posonlyargcount == 0 && !(code->co_flags & (CO_VARARGS | CO_VARKEYWORDS))
             && PyFunction_GET_KW_DEFAULTS(init) == NULL
             && defaults != NULL && PyTuple_Check(defaults) && PyTuple_GET_SIZE(defaults) <= N_MESSAGE_SLOTS
             && PyTuple_Check(varnames) && PyTuple_GET_SIZE(varnames) > N_MESSAGE_SLOTS;
        for (int i = 0; ok && i < N_MESSAGE_SLOTS; i++) {
            PyObject *name = PyTuple_GET_ITEM(varnames, i + 1);
            ok = PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, message_slot_names[i]) == 0;
        }
        Py_DECREF(varnames);
    }
    for (int i = 0; ok && i < N_MESSAGE_SLOTS; i++) {
        names[i] = PyUnicode_InternFromString(message_slot_names[i]);
        ok = names[i] != NULL;
    }
    if (!ok || cls->tp_version_tag == 0) {  /* 0: no valid tag (the flag for it is unused from 3.13 on) */
        Py_DECREF(init);
        for (int i = 0; i < N_MESSAGE_SLOTS; i++) {
            Py_XDECREF(names[i]);
        }
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "Message.__init__ is not the dataclass __init__ the compiled "
                                              "constructor stands in for (its parameters differ)");
        }
        return NULL;
    }
    Py_XSETREF(message_defaults, Py_NewRef(defaults));
    for (int i = 0; i < N_MESSAGE_SLOTS; i++) {
        Py_XSETREF(message_field_strs[i], names[i]);
    }
    message_required = N_MESSAGE_SLOTS - PyTuple_GET_SIZE(defaults);
    message_version = cls->tp_version_tag;
    cls->tp_vectorcall = Message_vectorcall;
    Py_DECREF(init);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- plain_region (producer side) */

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
     * plain records (metaq.protocol.records.encode_columns): offset deltas 0..n-1 (int32), timestamps (int64),
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

/* ---------------------------------------------------------------- plain_columns_ok (broker side) */

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
     * max_message_bytes. True only for regions the general check (records._Columns.parse) accepts too; False
     * says nothing: the caller runs that check, which says what is wrong or accepts what this does not cover
     * (attributes, headers). */
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "plain_columns_ok(region, n, max_message_bytes)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    long long max_bytes = PyLong_AsLongLong(args[2]);
    if ((n == -1 || max_bytes == -1) && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    int ok = columns_ok(view.buf, view.len, n, max_bytes);
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

/* ---------------------------------------------------------------- validate_plain, stamp_prefix (broker side) */

/* The batch header's layout (metaq.protocol.records, its module docstring): big-endian fields at these places. */
#define HEADER_BYTES 71
#define HEADER_CRC_COVERS 41    /* header_crc: CRC32C of [0, 41) continued over [45, 71) */
#define STAMPED_BYTES 45        /* [0, 45): what the broker stamps; crc covers [45, end) */
#define PRODUCER_BLOCK_BYTES 16
#define BATCH_MAGIC 2
#define ATTR_PRODUCER_STAMPED 0x8
#define ATTR_KNOWN (0x7 | 0x8 | 0x80)  /* compression, producer block, delayed (records._KNOWN_ATTRIBUTES) */
#define N_HEADER_FIELDS 12      /* records.BatchHeader: base_offset .. record_count, in read_header's order */
enum { H_BATCH_LENGTH = 1, H_CRC = 5, H_ATTRIBUTES = 7, H_LAST_DELTA, H_FIRST_TS, H_MAX_TS, H_COUNT };
static const char *const header_field_names[N_HEADER_FIELDS] = {
    "base_offset", "batch_length", "magic", "base_message_id", "append_time_ms", "crc", "header_crc", "attributes",
    "last_offset_delta", "first_timestamp_ms", "max_timestamp_ms", "record_count",
};

/* Bound by metaq.protocol.records (bind_batch_header()); validate_plain and stamp_prefix return None until then. */
static PyTypeObject *batch_header_type = NULL;
static PyObject *crc32c_fn = NULL;  /* crc32c.crc32c: the package has no C API, so it is called as Python calls it */

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
bind_batch_header(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    /* bind_batch_header(BatchHeader, crc32c): the class validate_plain builds (a NamedTuple whose _fields are
     * the twelve above, in order: its instances are made as tuple.__new__ makes a subclass's, tp_alloc and the
     * items) and the CRC function both functions call. ValueError (nothing bound) for another class. */
    if (nargs != 2 || !PyType_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "bind_batch_header(cls, crc32c)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *fields = PyObject_GetAttrString(args[0], "_fields");
    if (fields == NULL) {
        PyErr_Clear();
    }
    /* a plain tuple subclass: no instance dict, no slots of its own, so tp_alloc(cls, 12) and 12 items is all */
    int ok = fields != NULL && PyTuple_Check(fields) && PyTuple_GET_SIZE(fields) == N_HEADER_FIELDS
             && PyType_IsSubtype(cls, &PyTuple_Type) && cls->tp_dictoffset == 0
             && cls->tp_basicsize == PyTuple_Type.tp_basicsize && cls->tp_itemsize == PyTuple_Type.tp_itemsize;
    for (int i = 0; ok && i < N_HEADER_FIELDS; i++) {
        PyObject *name = PyTuple_GET_ITEM(fields, i);
        ok = PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, header_field_names[i]) == 0;
    }
    Py_XDECREF(fields);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "the BatchHeader class is not the twelve-field tuple validate_plain builds");
        return NULL;
    }
    Py_XSETREF(batch_header_type, (PyTypeObject *)Py_NewRef(cls));
    Py_XSETREF(crc32c_fn, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

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

static PyObject *
validate_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    /* validate_plain(batch, max_message_bytes, max_batch_bytes) -> BatchHeader or None: records.validate_batch
     * for what producers send, an uncompressed batch of plain records (with or without the producer block). Its
     * header, as read_header makes it, when the batch is within max_batch_bytes, its header whole with magic 2,
     * header_crc, length and body crc right, record_count >= 1 and last_offset_delta record_count - 1, no
     * attribute bit but the producer block's and the delayed flag, no compression, and plain_columns_ok() of its
     * records region. None for anything else (another buffer than bytes, bytearray or a memoryview of bytes, a
     * check failing, compression, attributes or headers on records, the class not bound): validate_batch's
     * Python code then decides, and raises the precise error. Never an accept those checks would refuse. */
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "validate_plain(batch, max_message_bytes, max_batch_bytes)");
        return NULL;
    }
    PyObject *batch = args[0];
    long long max_message_bytes, max_batch_bytes;
    /* a limit beyond 64 bits is left to the Python code too (whose plain_columns_ok call raises OverflowError) */
    if (batch_header_type == NULL || !int_in(args[1], LLONG_MIN, LLONG_MAX, &max_message_bytes)
            || !int_in(args[2], LLONG_MIN, LLONG_MAX, &max_batch_bytes)) {
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
    int built = 1;
    for (int i = 0; i < N_HEADER_FIELDS; i++) {
        built = built && items[i] != NULL;
    }
    /* as tuple.__new__ makes an instance of a subclass (tuple_subtype_new): tp_alloc, then the items, owned */
    result = built ? batch_header_type->tp_alloc(batch_header_type, N_HEADER_FIELDS) : NULL;
    for (int i = 0; i < N_HEADER_FIELDS; i++) {
        if (result != NULL) {
            PyTuple_SET_ITEM(result, i, items[i]);
        }
        else {
            Py_XDECREF(items[i]);
        }
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
    /* stamp_prefix(header, base_offset, base_message_id, append_time_ms) -> bytes or None: records.stamp_prefix,
     * the 45 bytes the broker writes before batch[45:]: base_offset, the header's batch_length, magic 2, the id's
     * two halves, append_time_ms, the header's crc, and header_crc over them and the header's fixed fields
     * [45, 71). None, for records.stamp_prefix's Python code to answer (and raise struct.error), unless header is
     * an instance of the bound BatchHeader and every field an int within what struct packs it into. */
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "stamp_prefix(header, base_offset, base_message_id, append_time_ms)");
        return NULL;
    }
    PyObject *header = args[0];
    if (batch_header_type == NULL || !Py_IS_TYPE(header, batch_header_type)
            || PyTuple_GET_SIZE(header) != N_HEADER_FIELDS) {
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

static PyMethodDef module_methods[] = {
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL, NULL},
    {"bind_message", (PyCFunction)(void (*)(void))bind_message, METH_FASTCALL,
     "bind_message(Message, field_names): where BatchMessages puts each field"},
    {"bind_constructor", (PyCFunction)(void (*)(void))bind_constructor, METH_FASTCALL,
     "bind_constructor(Message): calling the class builds its instances in C"},
    {"plain_columns_ok", (PyCFunction)(void (*)(void))plain_columns_ok, METH_FASTCALL,
     "plain_columns_ok(region, n, max_message_bytes) -> bool: a plain produced batch's columns, checked"},
    {"plain_region", (PyCFunction)(void (*)(void))plain_region, METH_FASTCALL,
     "plain_region(values, timestamps) -> (region, min_ts, max_ts) or None: a plain batch's records region"},
    {"bind_batch_header", (PyCFunction)(void (*)(void))bind_batch_header, METH_FASTCALL,
     "bind_batch_header(BatchHeader, crc32c): the class validate_plain builds and the CRC both functions use"},
    {"validate_plain", (PyCFunction)(void (*)(void))validate_plain, METH_FASTCALL,
     "validate_plain(batch, max_message_bytes, max_batch_bytes) -> BatchHeader or None: a plain batch, checked"},
    {"stamp_prefix", (PyCFunction)(void (*)(void))stamp_prefix, METH_FASTCALL,
     "stamp_prefix(header, base_offset, base_message_id, append_time_ms) -> bytes or None: the stamped 45 bytes"},
    {NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "metaq._speedups",
    .m_doc = "Compiled helpers of the per-message paths: the producer's SendResult the cyclic GC does not track, "
             "the consumer's Message builder, Message(...) itself, a plain batch's records region and its check, "
             "the broker's check of a plain produced batch and its stamped prefix.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&SendResult_Type) < 0 || PyType_Ready(&BatchMessages_Type) < 0) {
        return NULL;
    }
    minus_one = PyLong_FromLong(-1);
    zero = PyLong_FromLong(0);
    empty_str = PyUnicode_FromString("");
    if (minus_one == NULL || zero == NULL || empty_str == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "SendResult", (PyObject *)&SendResult_Type) < 0
            || PyModule_AddObjectRef(m, "BatchMessages", (PyObject *)&BatchMessages_Type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
