/* metaq._kafka_speedups: Kafka records <-> metaq's columnar records region, compiled (docs/kafka.md).
 *
 * Why compiled: the Kafka listener converts every produced Kafka batch to a metaq batch and every fetched
 * metaq batch back (docs/kafka.md, "Storage: converted, measured"). Kafka records are varint-framed one by one,
 * so the conversion is a loop per record; in Python that loop cost ~1.5 us a record on the produce side and
 * ~1 us on the fetch side, which capped the listener far below the native protocol. Here each is one pass.
 *
 * Two pure functions over bytes, each with its readable Python reference in metaq.protocol.kafka.records
 * (records_to_region_py, region_to_records_py); tests/unit/protocol/test_kafka_records.py checks that both
 * give the same bytes. Whatever these do not handle (a record whose layout is not the plain one, a header
 * name that is not ASCII, the metaq.attribute header, a null value) makes them return None and the Python
 * code decides, with its precise errors: they never raise for bad input.
 *
 *   records_to_region(records, count, base_timestamp) -> (region, first_ts, max_ts) | None
 *       Kafka records (decompressed) -> metaq's records region: offset deltas 0..n-1, timestamps, key and
 *       value lengths, attribute lengths (-1), header counts (little-endian columns), then keys, values and
 *       headers (u16 LE name length, name, i32 LE value length, value).
 *
 *   region_to_records(region, count, base_timestamp) -> bytes | None
 *       a checked metaq records region -> Kafka records (no compression); a record's attribute becomes the
 *       header "metaq.attribute", first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static const char ATTR_HEADER[] = "metaq.attribute";
#define ATTR_HEADER_LEN 15

/* -- varints (zigzag, Kafka's signed varint/varlong) ------------------------------------------------- */

static int read_varint(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, int64_t *out) {
    uint64_t v = 0;
    int shift = 0;
    while (*pos < end) {
        uint8_t b = p[(*pos)++];
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
            return 0;
        }
        shift += 7;
        if (shift > 63) return -1;
    }
    return -1;
}

static Py_ssize_t varint_size(int64_t value) {
    uint64_t v = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    Py_ssize_t n = 1;
    while (v >= 0x80) { v >>= 7; n++; }
    return n;
}

static uint8_t *write_varint(uint8_t *out, int64_t value) {
    uint64_t v = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    while (v >= 0x80) { *out++ = (uint8_t)((v & 0x7F) | 0x80); v >>= 7; }
    *out++ = (uint8_t)v;
    return out;
}

static void put_le32(uint8_t *p, int32_t v) { uint32_t u = (uint32_t)v; p[0] = u; p[1] = u >> 8; p[2] = u >> 16; p[3] = u >> 24; }
static void put_le16(uint8_t *p, int16_t v) { uint16_t u = (uint16_t)v; p[0] = u; p[1] = u >> 8; }
static void put_le64(uint8_t *p, int64_t v) { uint64_t u = (uint64_t)v; for (int i = 0; i < 8; i++) p[i] = (uint8_t)(u >> (8 * i)); }
static int32_t get_le32(const uint8_t *p) { return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24); }
static int16_t get_le16(const uint8_t *p) { return (int16_t)((uint16_t)p[0] | (uint16_t)p[1] << 8); }
static int64_t get_le64(const uint8_t *p) { uint64_t u = 0; for (int i = 7; i >= 0; i--) u = (u << 8) | p[i]; return (int64_t)u; }

/* -- Kafka records -> metaq region ---------------------------------------------------------------------- */

typedef struct {
    Py_ssize_t key_at, value_at, headers_at, headers_end;
    int32_t klen, vlen;
    int32_t hcount;
    int64_t ts;
} rec_t;

/* One record's fields; 0, or -1 when this code leaves the record to Python. Header blob sizes in metaq's
 * encoding are added to *hbytes. */
static int parse_record(const uint8_t *p, Py_ssize_t n, Py_ssize_t *pos, int64_t i, int64_t base_ts, rec_t *r,
                        Py_ssize_t *hbytes) {
    int64_t length, ts_delta, offset_delta, klen, vlen, hcount;
    if (read_varint(p, n, pos, &length) < 0 || length < 0 || length > n - *pos) return -1;
    Py_ssize_t end = *pos + length;
    if (*pos >= end) return -1;
    (*pos)++;  /* record attributes */
    if (read_varint(p, end, pos, &ts_delta) < 0) return -1;
    if (read_varint(p, end, pos, &offset_delta) < 0 || offset_delta != i) return -1;
    if (read_varint(p, end, pos, &klen) < 0 || klen < -1 || klen > end - *pos) return -1;
    r->key_at = *pos;
    if (klen > 0) *pos += klen;
    if (read_varint(p, end, pos, &vlen) < 0 || vlen < 0 || vlen > end - *pos) return -1;  /* null value: Python */
    r->value_at = *pos;
    *pos += vlen;
    if (read_varint(p, end, pos, &hcount) < 0 || hcount < 0 || hcount > 0x7FFF) return -1;
    r->headers_at = *pos;
    for (int64_t h = 0; h < hcount; h++) {
        int64_t hk, hv;
        if (read_varint(p, end, pos, &hk) < 0 || hk < 0 || hk > 0xFFFF || hk > end - *pos) return -1;
        for (Py_ssize_t c = 0; c < hk; c++) if (p[*pos + c] & 0x80) return -1;  /* non-ASCII names: Python */
        if (hk == ATTR_HEADER_LEN && memcmp(p + *pos, ATTR_HEADER, ATTR_HEADER_LEN) == 0) return -1;
        *pos += hk;
        if (read_varint(p, end, pos, &hv) < 0 || hv < 0 || hv > end - *pos || hv > INT32_MAX) return -1;
        *pos += hv;
        *hbytes += 6 + hk + hv;
    }
    if (*pos != end) return -1;
    r->headers_end = end;
    r->klen = (int32_t)klen;
    r->vlen = (int32_t)vlen;
    r->hcount = (int32_t)hcount;
    r->ts = base_ts + ts_delta;
    return 0;
}

static PyObject *records_to_region(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t count;
    long long base_ts;
    if (!PyArg_ParseTuple(args, "y*nL", &buf, &count, &base_ts)) return NULL;
    const uint8_t *p = buf.buf;
    Py_ssize_t n = buf.len, pos = 0, keys = 0, values = 0, hbytes = 0;
    PyObject *result = NULL;
    if (count < 1 || count > n) {
        PyBuffer_Release(&buf);
        Py_RETURN_NONE;
    }
    rec_t *recs = PyMem_Malloc(sizeof(rec_t) * (size_t)count);
    if (recs == NULL) { PyBuffer_Release(&buf); return PyErr_NoMemory(); }
    int64_t first_ts = INT64_MAX, max_ts = INT64_MIN;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (parse_record(p, n, &pos, i, base_ts, &recs[i], &hbytes) < 0) goto fallback;
        keys += recs[i].klen > 0 ? recs[i].klen : 0;
        values += recs[i].vlen;
        if (recs[i].ts < first_ts) first_ts = recs[i].ts;
        if (recs[i].ts > max_ts) max_ts = recs[i].ts;
    }
    if (pos != n) goto fallback;
    Py_ssize_t total = 24 * count + keys + values + hbytes;
    PyObject *region = PyBytes_FromStringAndSize(NULL, total);
    if (region == NULL) goto done;
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(region);
    uint8_t *deltas = o, *tss = o + 4 * count, *kls = o + 12 * count, *vls = o + 16 * count,
            *als = o + 20 * count, *hcs = o + 22 * count;
    uint8_t *ko = o + 24 * count, *vo = ko + keys, *ho = vo + values;
    for (Py_ssize_t i = 0; i < count; i++) {
        rec_t *r = &recs[i];
        put_le32(deltas + 4 * i, (int32_t)i);
        put_le64(tss + 8 * i, r->ts);
        put_le32(kls + 4 * i, r->klen);
        put_le32(vls + 4 * i, r->vlen);
        put_le16(als + 2 * i, -1);
        put_le16(hcs + 2 * i, (int16_t)r->hcount);
        if (r->klen > 0) { memcpy(ko, p + r->key_at, r->klen); ko += r->klen; }
        memcpy(vo, p + r->value_at, r->vlen);
        vo += r->vlen;
        Py_ssize_t hp = r->headers_at;
        for (int32_t h = 0; h < r->hcount; h++) {
            int64_t hk = 0, hv = 0;
            read_varint(p, r->headers_end, &hp, &hk);
            put_le16(ho, (int16_t)(uint16_t)hk); ho += 2;
            memcpy(ho, p + hp, hk); ho += hk; hp += hk;
            read_varint(p, r->headers_end, &hp, &hv);
            put_le32(ho, (int32_t)hv); ho += 4;
            memcpy(ho, p + hp, hv); ho += hv; hp += hv;
        }
    }
    result = Py_BuildValue("(NLL)", region, (long long)first_ts, (long long)max_ts);
    goto done;
fallback:
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(recs);
    PyBuffer_Release(&buf);
    return result;
}

/* -- metaq region -> Kafka records ---------------------------------------------------------------------- */

static PyObject *region_to_records(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t n;
    long long base_ts;
    if (!PyArg_ParseTuple(args, "y*nL", &buf, &n, &base_ts)) return NULL;
    const uint8_t *p = buf.buf;
    Py_ssize_t size = buf.len;
    if (n < 1 || 24 * n > size) goto fallback;
    const uint8_t *deltas = p, *tss = p + 4 * n, *kls = p + 12 * n, *vls = p + 16 * n, *als = p + 20 * n,
                  *hcs = p + 22 * n;
    /* section starts and the output size, checking every length against the region */
    Py_ssize_t keys = 0, values = 0, attrs = 0, out_size = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t kl = get_le32(kls + 4 * i), vl = get_le32(vls + 4 * i);
        int16_t al = get_le16(als + 2 * i);
        if (kl < -1 || vl < 0 || al < -1 || get_le16(hcs + 2 * i) < 0) goto fallback;
        keys += kl > 0 ? kl : 0;
        values += vl;
        attrs += al > 0 ? al : 0;
    }
    Py_ssize_t key_at = 24 * n, value_at = key_at + keys, attr_at = value_at + values, head_at = attr_at + attrs;
    if (head_at > size) goto fallback;
    /* first pass: sizes (the headers walked to find each blob's end) */
    Py_ssize_t hp = head_at;
    Py_ssize_t *rec_len = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)n);
    if (rec_len == NULL) { PyBuffer_Release(&buf); return PyErr_NoMemory(); }
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t kl = get_le32(kls + 4 * i), vl = get_le32(vls + 4 * i);
        int16_t al = get_le16(als + 2 * i), hc = get_le16(hcs + 2 * i);
        Py_ssize_t body = 1 + varint_size(get_le64(tss + 8 * i) - base_ts) + varint_size(get_le32(deltas + 4 * i))
                          + varint_size(kl) + (kl > 0 ? kl : 0) + varint_size(vl) + vl
                          + varint_size(hc + (al >= 0 ? 1 : 0));
        if (al >= 0) body += varint_size(ATTR_HEADER_LEN) + ATTR_HEADER_LEN + varint_size(al) + al;
        for (int16_t h = 0; h < hc; h++) {
            if (hp + 2 > size) { PyMem_Free(rec_len); goto fallback; }
            Py_ssize_t nl = (uint16_t)get_le16(p + hp);
            if (hp + 6 + nl > size) { PyMem_Free(rec_len); goto fallback; }
            int32_t hv = get_le32(p + hp + 2 + nl);
            if (hv < 0 || hp + 6 + nl + hv > size) { PyMem_Free(rec_len); goto fallback; }
            body += varint_size(nl) + nl + varint_size(hv) + hv;
            hp += 6 + nl + hv;
        }
        rec_len[i] = body;
        out_size += varint_size(body) + body;
    }
    if (hp != size) { PyMem_Free(rec_len); goto fallback; }
    PyObject *out = PyBytes_FromStringAndSize(NULL, out_size);
    if (out == NULL) { PyMem_Free(rec_len); PyBuffer_Release(&buf); return NULL; }
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out);
    Py_ssize_t kp = key_at, vp = value_at, ap = attr_at;
    hp = head_at;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t kl = get_le32(kls + 4 * i), vl = get_le32(vls + 4 * i);
        int16_t al = get_le16(als + 2 * i), hc = get_le16(hcs + 2 * i);
        o = write_varint(o, rec_len[i]);
        *o++ = 0;
        o = write_varint(o, get_le64(tss + 8 * i) - base_ts);
        o = write_varint(o, get_le32(deltas + 4 * i));
        o = write_varint(o, kl);
        if (kl > 0) { memcpy(o, p + kp, kl); o += kl; kp += kl; }
        o = write_varint(o, vl);
        memcpy(o, p + vp, vl); o += vl; vp += vl;
        o = write_varint(o, hc + (al >= 0 ? 1 : 0));
        if (al >= 0) {
            o = write_varint(o, ATTR_HEADER_LEN);
            memcpy(o, ATTR_HEADER, ATTR_HEADER_LEN); o += ATTR_HEADER_LEN;
            o = write_varint(o, al);
            memcpy(o, p + ap, al); o += al; ap += al;
        }
        for (int16_t h = 0; h < hc; h++) {
            Py_ssize_t nl = (uint16_t)get_le16(p + hp);
            int32_t hv = get_le32(p + hp + 2 + nl);
            o = write_varint(o, nl);
            memcpy(o, p + hp + 2, nl); o += nl;
            o = write_varint(o, hv);
            memcpy(o, p + hp + 6 + nl, hv); o += hv;
            hp += 6 + nl + hv;
        }
    }
    PyMem_Free(rec_len);
    PyBuffer_Release(&buf);
    return out;
fallback:
    PyBuffer_Release(&buf);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"records_to_region", records_to_region, METH_VARARGS,
     "Kafka records -> (metaq records region, first timestamp, max timestamp), or None (see the module doc)."},
    {"region_to_records", region_to_records, METH_VARARGS,
     "A metaq records region -> Kafka records, or None (see the module doc)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "metaq._kafka_speedups",
    "Kafka records <-> metaq records regions, compiled (see src/metaq/_kafka_speedups.c).", -1, methods,
    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kafka_speedups(void) { return PyModule_Create(&module); }
