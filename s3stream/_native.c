/* s3stream._native: the compiled hot path of the object codecs (optional; see s3stream/native.py).
 *
 * Layout: docs/format.md section 2 (data block) and "StreamRecordBatch" (big-endian throughout).
 *
 * Contract with the pure-Python codecs (s3stream/objectformat/block.py, writer.py): every function
 * here either returns exactly what the Python code returns for the same input, or returns None,
 * meaning "let the Python code decide" (it then raises the documented error or, for inputs this
 * module does not take, such as payloads that are not bytes, does the work itself). This module
 * never builds an error message of its own: detection is compiled, description stays in Python,
 * so both implementations raise the same error type, message and position by construction.
 *
 * Records are built without calling StreamRecordBatch.__init__: configure() reads the byte offsets
 * of the class's five slots (member descriptors) once, and the decoder allocates an instance and
 * stores the five fields in those slots, as the Python decoder does through the slot setters.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define DATA_BLOCK_MAGIC 0x5A
#define DATA_BLOCK_HEADER_SIZE 10
#define RECORD_MAGIC 0x22
#define RECORD_HEADER_SIZE 33
#define I32_MAX_ ((int64_t)0x7FFFFFFF)
#define BLOCK_DATA_MAX_BYTES (I32_MAX_ - DATA_BLOCK_HEADER_SIZE)

/* The record class and its slot offsets, in persisted field order. */
static PyTypeObject *record_type = NULL;
static Py_ssize_t slot_offsets[5];
static const char *const slot_names[5] = {"stream_id", "epoch", "base_offset", "count", "payload"};

#define SLOT(obj, k) (*(PyObject **)((char *)(obj) + slot_offsets[k]))

static inline int64_t load_i64(const unsigned char *p) {
    uint64_t v = 0;
    for (int k = 0; k < 8; k++) v = (v << 8) | p[k];
    return (int64_t)v;
}

static inline int32_t load_i32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}

static inline void store_i64(unsigned char *p, int64_t value) {
    uint64_t v = (uint64_t)value;
    for (int k = 7; k >= 0; k--) {
        p[k] = (unsigned char)(v & 0xFF);
        v >>= 8;
    }
}

static inline void store_i32(unsigned char *p, int32_t value) {
    uint32_t v = (uint32_t)value;
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* A Python int as int64; 0 (and no exception) if it is not an int or does not fit. */
static int as_i64(PyObject *obj, int64_t *out) {
    if (!PyLong_Check(obj)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)v;
    return 1;
}

static PyObject *native_configure(PyObject *self, PyObject *cls) {
    (void)self;
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "configure() takes the record class");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    Py_ssize_t offsets[5];
    for (int k = 0; k < 5; k++) {
        PyObject *descr = PyDict_GetItemString(type->tp_dict, slot_names[k]);
        if (descr == NULL && type->tp_base != NULL)
            descr = PyDict_GetItemString(type->tp_base->tp_dict, slot_names[k]);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, slot_names[k]);
            return NULL;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", type->tp_name, slot_names[k]);
            return NULL;
        }
        offsets[k] = member->offset;
    }
    memcpy(slot_offsets, offsets, sizeof offsets);
    Py_INCREF(type);
    Py_XSETREF(record_type, type);
    Py_RETURN_NONE;
}

/* A new record with the five fields (references stolen; NULL fields: a failure, all released). */
static PyObject *new_record(PyObject *fields[5]) {
    for (int k = 0; k < 5; k++) {
        if (fields[k] == NULL) {
            for (int j = 0; j < 5; j++) Py_XDECREF(fields[j]);
            return NULL;
        }
    }
    PyObject *record = record_type->tp_alloc(record_type, 0);
    if (record == NULL) {
        for (int j = 0; j < 5; j++) Py_DECREF(fields[j]);
        return NULL;
    }
    for (int k = 0; k < 5; k++) SLOT(record, k) = fields[k];
    /* Its fields are ints and a bytes object: it cannot be part of a reference cycle, so the cycle
     * collector need not track it (as CPython untracks tuples of such values). A block's thousand
     * records otherwise grow every full collection, which then traverses them all. */
    PyObject_GC_UnTrack(record);
    return record;
}

/* An int object for value, reusing *cache when it holds the same value (new reference). */
static PyObject *cached_int(PyObject **cache, int64_t *cached, int64_t value) {
    if (*cache == NULL || *cached != value) {
        PyObject *fresh = PyLong_FromLongLong(value);
        if (fresh == NULL) return NULL;
        Py_XSETREF(*cache, fresh);
        *cached = value;
    }
    Py_INCREF(*cache);
    return *cache;
}

/* decode_block(buf, pos, stream_id, start_offset, end_offset, record_count, size_bytes, exact)
 *   -> (records, gapless, payload_bytes_each) | None
 *
 * The Python decoder's checks (block.decode_block_gapless), in the same order of acceptance; None
 * wherever it would raise. payload_bytes_each is the common payload length when the records differ
 * only in their base offsets, continue each other and have a positive count (decode.py's fast path
 * accepts exactly those blocks when `exact`: the buffer is a bytes object holding only the block). */
static PyObject *native_decode_block(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *buf_obj;
    Py_ssize_t pos;
    PyObject *o_stream, *o_start, *o_end, *o_count, *o_size;
    int exact;
    if (!PyArg_ParseTuple(args, "OnOOOOOp", &buf_obj, &pos, &o_stream, &o_start, &o_end, &o_count, &o_size,
                          &exact))
        return NULL;
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "s3stream._native is not configured");
        return NULL;
    }
    int64_t stream, start_offset, end_offset, record_count, size;
    if (!as_i64(o_stream, &stream) || !as_i64(o_start, &start_offset) || !as_i64(o_end, &end_offset) ||
        !as_i64(o_count, &record_count) || !as_i64(o_size, &size))
        Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(buf_obj, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL;
    PyObject *records = NULL;
    PyObject *c_stream = NULL, *c_epoch = NULL, *c_count = NULL;
    int64_t v_stream = 0, v_epoch = 0, v_count = 0;
    const unsigned char *data = (const unsigned char *)view.buf;
    Py_ssize_t len = view.len;
    if (pos < 0 || pos > len || size < DATA_BLOCK_HEADER_SIZE || (int64_t)(len - pos) < size) goto fallback;
    const unsigned char *block = data + pos;
    if ((signed char)block[0] != (signed char)DATA_BLOCK_MAGIC) goto fallback;
    if ((int64_t)load_i32(block + 2) != record_count) goto fallback;
    if ((int64_t)load_i32(block + 6) != size - DATA_BLOCK_HEADER_SIZE) goto fallback;
    /* record_count equals an i32 here */
    int64_t cursor = DATA_BLOCK_HEADER_SIZE;
    int64_t end = size;
    int64_t last_header = end - RECORD_HEADER_SIZE;
    __int128 expected = start_offset;
    int gapless = 1;
    int alike = 1;
    int32_t first_length = 0;
    int64_t first_epoch = 0;
    int32_t first_count = 0;
    Py_ssize_t n = record_count > 0 ? (Py_ssize_t)record_count : 0;
    /* every record takes at least its header: more than fit is damage (and no giant tuple) */
    if (n > (size - DATA_BLOCK_HEADER_SIZE) / RECORD_HEADER_SIZE) goto fallback;
    records = PyTuple_New(n);
    if (records == NULL) goto error;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (cursor > last_header) goto fallback;
        const unsigned char *h = block + cursor;
        signed char magic = (signed char)h[0];
        int64_t stream_id = load_i64(h + 1);
        int64_t epoch = load_i64(h + 9);
        int64_t base_offset = load_i64(h + 17);
        int32_t count = load_i32(h + 25);
        int32_t length = load_i32(h + 29);
        if (magic != RECORD_MAGIC || stream_id != stream || count < 0 || length < 0) goto fallback;
        int64_t start = cursor + RECORD_HEADER_SIZE;
        int64_t stop = start + length;
        if ((__int128)base_offset != expected) {
            /* the first record must start at the entry's start offset; later ones may leave a gap */
            if (i == 0 || (__int128)base_offset < expected) goto fallback;
            gapless = 0;
        }
        if (stop > end) goto fallback;
        if (i == 0) {
            first_length = length;
            first_epoch = epoch;
            first_count = count;
        } else if (length != first_length || epoch != first_epoch || count != first_count) {
            alike = 0;
        }
        PyObject *fields[5];
        fields[0] = cached_int(&c_stream, &v_stream, stream_id);
        fields[1] = cached_int(&c_epoch, &v_epoch, epoch);
        fields[2] = PyLong_FromLongLong(base_offset);
        fields[3] = cached_int(&c_count, &v_count, count);
        fields[4] = PyBytes_FromStringAndSize((const char *)block + start, (Py_ssize_t)length);
        PyObject *record = new_record(fields);
        if (record == NULL) goto error;
        PyTuple_SET_ITEM(records, i, record);
        cursor = stop;
        expected = (__int128)base_offset + count;
    }
    if (cursor != end) goto fallback;
    if (expected != (__int128)end_offset) goto fallback;
    PyObject *each;
    if (exact && n > 0 && alike && gapless && first_count > 0 && start_offset >= 0 && pos == 0 &&
        (int64_t)len == size && PyBytes_CheckExact(buf_obj))
        each = PyLong_FromLong(first_length);
    else
        each = Py_NewRef(Py_None);
    if (each == NULL) goto error;
    result = Py_BuildValue("(NON)", records, gapless ? Py_True : Py_False, each);
    records = NULL;
    goto done;
fallback:
    result = Py_NewRef(Py_None);
    goto done;
error:
    result = NULL;
done:
    Py_XDECREF(records);
    Py_XDECREF(c_stream);
    Py_XDECREF(c_epoch);
    Py_XDECREF(c_count);
    PyBuffer_Release(&view);
    return result;
}

/* The five fields of a record batch that the writer takes as is: exact class, int fields in range,
 * a bytes payload. 0 (no exception) otherwise. */
struct fields {
    int64_t stream_id, epoch, base_offset, count;
    PyObject *payload;
};

static int read_fields(PyObject *record, struct fields *f) {
    if (Py_TYPE(record) != record_type) return 0;
    for (int k = 0; k < 5; k++)
        if (SLOT(record, k) == NULL) return 0;
    f->payload = SLOT(record, 4);
    return as_i64(SLOT(record, 0), &f->stream_id) && as_i64(SLOT(record, 1), &f->epoch) &&
           as_i64(SLOT(record, 2), &f->base_offset) && as_i64(SLOT(record, 3), &f->count) &&
           PyBytes_CheckExact(f->payload);
}

/* check_batches(batches: list, last_stream, last_end, payload_max) -> bool
 *
 * True when every batch is a StreamRecordBatch (exactly) with a bytes payload and passes the
 * writer's checks (ObjectWriter._validate: ranges and (stream id, offset) order); False otherwise
 * (the Python check then raises, or accepts what this function does not take). */
static PyObject *native_check_batches(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *batches;
    long long last_stream, last_end, payload_max;
    if (!PyArg_ParseTuple(args, "O!LLL", &PyList_Type, &batches, &last_stream, &last_end, &payload_max))
        return NULL;
    if (record_type == NULL) Py_RETURN_FALSE;
    Py_ssize_t n = PyList_GET_SIZE(batches);
    for (Py_ssize_t i = 0; i < n; i++) {
        struct fields f;
        if (!read_fields(PyList_GET_ITEM(batches, i), &f)) Py_RETURN_FALSE;
        if (f.stream_id < 0 || f.base_offset < 0) Py_RETURN_FALSE;
        if (f.count < 1 || f.count > I32_MAX_ || f.base_offset > INT64_MAX - f.count) Py_RETURN_FALSE;
        if (PyBytes_GET_SIZE(f.payload) > payload_max) Py_RETURN_FALSE;
        if (f.stream_id < last_stream || (f.stream_id == last_stream && f.base_offset < last_end))
            Py_RETURN_FALSE;
        last_stream = f.stream_id;
        last_end = f.base_offset + f.count;
    }
    Py_RETURN_TRUE;
}

/* encode_run(scratch: bytearray, batches: list, i, n, stream_id, block_bytes, start_offset,
 *            payload_bytes, threshold) -> (encoded_bytes, next_i, payload_bytes, last_end)
 *
 * Encodes batches[i:n] (already accepted by check_batches) into the open data block of stream
 * `stream_id` that holds `block_bytes` bytes (its header included) and `payload_bytes` payload
 * bytes, starting at `start_offset`: each record while it belongs to that block (same stream, the
 * block's data stays <= BLOCK_DATA_MAX_BYTES, its offset span <= I32_MAX), stopping after the one
 * that brings the payload bytes to `threshold` (the writer then cuts the block). The encoded bytes
 * (the records' headers and payloads back to back, exactly what ObjectWriter._encode_from writes)
 * go to scratch[:encoded_bytes]; scratch only grows, so a writer reusing it touches its pages once. */
static PyObject *native_encode_run(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *scratch, *batches;
    Py_ssize_t i, n;
    long long stream, block_bytes, start_offset, payload_bytes, threshold;
    if (!PyArg_ParseTuple(args, "O!O!nnLLLLL", &PyByteArray_Type, &scratch, &PyList_Type, &batches, &i, &n,
                          &stream, &block_bytes, &start_offset, &payload_bytes, &threshold))
        return NULL;
    if (record_type == NULL || i < 0 || n > PyList_GET_SIZE(batches)) {
        PyErr_SetString(PyExc_ValueError, "encode_run: bad arguments");
        return NULL;
    }
    /* pass 1: how many records go into this block, and their encoded size */
    Py_ssize_t j = i;
    int64_t total = 0;
    int64_t last_end = -1;
    int64_t bytes_in_block = block_bytes;
    int64_t payload = payload_bytes;
    while (j < n) {
        struct fields f;
        if (!read_fields(PyList_GET_ITEM(batches, j), &f)) {
            PyErr_SetString(PyExc_TypeError, "encode_run: a batch check_batches did not accept");
            return NULL;
        }
        int64_t length = PyBytes_GET_SIZE(f.payload);
        if (f.stream_id != stream ||
            bytes_in_block + length + (RECORD_HEADER_SIZE - DATA_BLOCK_HEADER_SIZE) > BLOCK_DATA_MAX_BYTES ||
            f.base_offset + f.count - start_offset > I32_MAX_)
            break;
        bytes_in_block += RECORD_HEADER_SIZE + length;
        total += RECORD_HEADER_SIZE + length;
        payload += length;
        last_end = f.base_offset + f.count;
        j++;
        if (payload >= threshold) break;
    }
    if (PyByteArray_GET_SIZE(scratch) < total && PyByteArray_Resize(scratch, (Py_ssize_t)total) < 0)
        return NULL;
    unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(scratch);
    for (Py_ssize_t k = i; k < j; k++) {
        struct fields f;
        read_fields(PyList_GET_ITEM(batches, k), &f);
        Py_ssize_t length = PyBytes_GET_SIZE(f.payload);
        p[0] = RECORD_MAGIC;
        store_i64(p + 1, f.stream_id);
        store_i64(p + 9, f.epoch);
        store_i64(p + 17, f.base_offset);
        store_i32(p + 25, (int32_t)f.count);
        store_i32(p + 29, (int32_t)length);
        memcpy(p + RECORD_HEADER_SIZE, PyBytes_AS_STRING(f.payload), (size_t)length);
        p += RECORD_HEADER_SIZE + length;
    }
    return Py_BuildValue("(LnLL)", (long long)total, j, (long long)payload, (long long)last_end);
}

/* encode_columns_run(scratch, bases, payloads, end, i, n, stream_id, epoch, block_bytes,
 *                    start_offset, payload_bytes, threshold)
 *   -> (encoded_bytes, next_i, payload_bytes, last_end, deferred)
 *
 * encode_run for records [i, n) of one stream given as columns (ObjectWriter._encode_columns):
 * record k is (stream_id, epoch, bases[k], end_k - bases[k], payloads[k]) with end_k = bases[k + 1],
 * or `end` for the last one. `bases` is a buffer of native int64 (array('q')), `payloads` a list.
 * Stops before record k when it does not belong to the open block (deferred false: the writer cuts
 * the block), or when it fails the writer's checks or is not plain (a count out of range, a payload
 * too large or not bytes; deferred true: the Python loop takes over at k and raises or encodes it). */
static PyObject *native_encode_columns_run(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *scratch, *bases_obj, *payloads, *end_obj;
    Py_ssize_t i, n;
    long long stream, epoch, block_bytes, start_offset, payload_bytes, threshold, payload_max;
    if (!PyArg_ParseTuple(args, "O!OO!OnnLLLLLLL", &PyByteArray_Type, &scratch, &bases_obj, &PyList_Type,
                          &payloads, &end_obj, &i, &n, &stream, &epoch, &block_bytes, &start_offset,
                          &payload_bytes, &threshold, &payload_max))
        return NULL;
    int64_t end;
    int deferred = 0;
    Py_buffer view;
    if (PyObject_GetBuffer(bases_obj, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear(); /* not a buffer (a list of ints): the Python loop */
        return Py_BuildValue("(nnLLO)", (Py_ssize_t)0, i, payload_bytes, (long long)-1, Py_True);
    }
    const int64_t *bases = (const int64_t *)view.buf;
    Py_ssize_t count_total = view.itemsize == 8 ? view.len / 8 : 0;
    int plain = view.itemsize == 8 && view.format != NULL &&
                (strcmp(view.format, "q") == 0 || strcmp(view.format, "l") == 0 || strcmp(view.format, "=q") == 0);
    if (!plain || !as_i64(end_obj, &end) || i < 0 || n > count_total || n > PyList_GET_SIZE(payloads)) {
        PyBuffer_Release(&view);
        return Py_BuildValue("(nnLLO)", (Py_ssize_t)0, i, payload_bytes, (long long)-1, Py_True);
    }
    /* pass 1: how many records go into this block */
    Py_ssize_t j = i;
    int64_t total = 0, bytes_in_block = block_bytes, payload = payload_bytes, last_end = -1;
    while (j < n) {
        PyObject *item = PyList_GET_ITEM(payloads, j);
        int64_t base = bases[j];
        int64_t end_k = j + 1 < count_total ? bases[j + 1] : end;
        __int128 batch_count = (__int128)end_k - base;
        if (!PyBytes_CheckExact(item) || batch_count < 1 || batch_count > I32_MAX_ ||
            PyBytes_GET_SIZE(item) > payload_max) {
            deferred = 1;
            break;
        }
        int64_t length = PyBytes_GET_SIZE(item);
        if (bytes_in_block + length + (RECORD_HEADER_SIZE - DATA_BLOCK_HEADER_SIZE) > BLOCK_DATA_MAX_BYTES ||
            (__int128)end_k - start_offset > I32_MAX_)
            break;
        bytes_in_block += RECORD_HEADER_SIZE + length;
        total += RECORD_HEADER_SIZE + length;
        payload += length;
        last_end = end_k;
        j++;
        if (payload >= threshold) break;
    }
    if (PyByteArray_GET_SIZE(scratch) < total && PyByteArray_Resize(scratch, (Py_ssize_t)total) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(scratch);
    for (Py_ssize_t k = i; k < j; k++) {
        PyObject *item = PyList_GET_ITEM(payloads, k);
        Py_ssize_t length = PyBytes_GET_SIZE(item);
        int64_t end_k = k + 1 < count_total ? bases[k + 1] : end;
        p[0] = RECORD_MAGIC;
        store_i64(p + 1, stream);
        store_i64(p + 9, epoch);
        store_i64(p + 17, bases[k]);
        store_i32(p + 25, (int32_t)(end_k - bases[k]));
        store_i32(p + 29, (int32_t)length);
        memcpy(p + RECORD_HEADER_SIZE, PyBytes_AS_STRING(item), (size_t)length);
        p += RECORD_HEADER_SIZE + length;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(LnLLO)", (long long)total, j, (long long)payload, (long long)last_end,
                         deferred ? Py_True : Py_False);
}

/* ---------------------------------------------------------------------------------------------
 * Kafka RecordBatch v2 records (docs/spark-sink.md "Payload format"; spark_sink/kafka_codec.py). */

/* Kafka's signed varint: zigzag, then 7 bits per byte, low groups first. Returns its length; writes
 * it at p when p is not NULL. */
static inline Py_ssize_t put_varint(unsigned char *p, int64_t n) {
    uint64_t z = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    Py_ssize_t k = 0;
    while (z >= 0x80) {
        if (p) p[k] = (unsigned char)((z & 0x7F) | 0x80);
        z >>= 7;
        k++;
    }
    if (p) p[k] = (unsigned char)z;
    return k + 1;
}

/* One record's header list as kafka_codec._encode_headers writes it, at p (NULL: only measure).
 * -1 (no exception) for a list this function does not take: the Python encoder then does the batch. */
static Py_ssize_t put_headers(unsigned char *p, PyObject *hdrs) {
    if (hdrs == Py_None) {
        if (p) p[0] = 0;
        return 1;
    }
    if (!PyList_CheckExact(hdrs) && !PyTuple_CheckExact(hdrs)) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(hdrs);
    PyObject **items = PySequence_Fast_ITEMS(hdrs);
    Py_ssize_t at = put_varint(p, n);
    for (Py_ssize_t h = 0; h < n; h++) {
        PyObject *pair = items[h];
        if ((!PyTuple_CheckExact(pair) && !PyList_CheckExact(pair)) || PySequence_Fast_GET_SIZE(pair) != 2)
            return -1;
        PyObject *key = PySequence_Fast_ITEMS(pair)[0];
        PyObject *value = PySequence_Fast_ITEMS(pair)[1];
        if (!PyUnicode_CheckExact(key) || (value != Py_None && !PyBytes_CheckExact(value))) return -1;
        Py_ssize_t key_len;
        const char *key_utf8 = PyUnicode_AsUTF8AndSize(key, &key_len);
        if (key_utf8 == NULL) { /* not encodable (lone surrogates): Python raises its own error */
            PyErr_Clear();
            return -1;
        }
        at += put_varint(p ? p + at : NULL, key_len);
        if (p) memcpy(p + at, key_utf8, (size_t)key_len);
        at += key_len;
        if (value == Py_None) {
            at += put_varint(p ? p + at : NULL, -1);
        } else {
            Py_ssize_t value_len = PyBytes_GET_SIZE(value);
            at += put_varint(p ? p + at : NULL, value_len);
            if (p) memcpy(p + at, PyBytes_AS_STRING(value), (size_t)value_len);
            at += value_len;
        }
    }
    return at;
}

/* One record (length, attributes, timestamp delta, offset delta, key, value, headers) at p (NULL:
 * only measure). -1 (no exception) when it holds something this function does not take. */
static Py_ssize_t put_record(unsigned char *p, Py_ssize_t i, PyObject *key, PyObject *value, int64_t tsd,
                             PyObject *hdrs) {
    if ((key != Py_None && !PyBytes_CheckExact(key)) || (value != Py_None && !PyBytes_CheckExact(value)))
        return -1;
    /* a header list that is empty or None is the single byte 0 */
    if (hdrs != Py_None && (PyList_CheckExact(hdrs) || PyTuple_CheckExact(hdrs)) &&
        PySequence_Fast_GET_SIZE(hdrs) == 0)
        hdrs = Py_None;
    Py_ssize_t hdr_len = put_headers(NULL, hdrs);
    if (hdr_len < 0) return -1;
    Py_ssize_t key_len = key == Py_None ? 0 : PyBytes_GET_SIZE(key);
    Py_ssize_t value_len = value == Py_None ? 0 : PyBytes_GET_SIZE(value);
    int64_t body_len = 1 + put_varint(NULL, tsd) + put_varint(NULL, (int64_t)i) +
                       put_varint(NULL, key == Py_None ? -1 : key_len) + key_len +
                       put_varint(NULL, value == Py_None ? -1 : value_len) + value_len + hdr_len;
    Py_ssize_t size = put_varint(NULL, body_len) + (Py_ssize_t)body_len;
    if (p == NULL) return size;
    Py_ssize_t at = put_varint(p, body_len);
    p[at++] = 0; /* attributes */
    at += put_varint(p + at, tsd);
    at += put_varint(p + at, (int64_t)i);
    at += put_varint(p + at, key == Py_None ? -1 : key_len);
    if (key_len) memcpy(p + at, PyBytes_AS_STRING(key), (size_t)key_len);
    at += key_len;
    at += put_varint(p + at, value == Py_None ? -1 : value_len);
    if (value_len) memcpy(p + at, PyBytes_AS_STRING(value), (size_t)value_len);
    at += value_len;
    at += put_headers(p + at, hdrs);
    return at;
}

/* kafka_records(keys: list, values: list, timestamps_ms: list, headers: list | None, first_ts,
 *               header_size) -> bytearray | None
 *
 * `header_size` zero bytes (the batch header, filled in by the caller), then the records with offset
 * deltas 0, 1, ...: the bytes kafka_codec.encode_batch's loop joins. The caller has checked the
 * counts and lengths. None (no exception) for anything else than lists of bytes/None, int
 * timestamps whose deltas fit 64 bits, and header lists of (str, bytes/None) pairs: the Python
 * loop then encodes the batch (or raises its error). */
static PyObject *native_kafka_records(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *keys, *values, *timestamps, *headers, *first_obj;
    int64_t first_ts;
    Py_ssize_t header_size;
    if (!PyArg_ParseTuple(args, "OOOOOn", &keys, &values, &timestamps, &headers, &first_obj, &header_size))
        return NULL;
    if (!as_i64(first_obj, &first_ts)) Py_RETURN_NONE;
    if (!PyList_CheckExact(keys) || !PyList_CheckExact(values) || !PyList_CheckExact(timestamps) ||
        (headers != Py_None && !PyList_CheckExact(headers)) || header_size < 0)
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(values);
    if (PyList_GET_SIZE(keys) != n || PyList_GET_SIZE(timestamps) != n ||
        (headers != Py_None && PyList_GET_SIZE(headers) != n))
        Py_RETURN_NONE;
    /* pass 1: check and measure (the lists cannot change meanwhile: no Python code runs) */
    int64_t total = header_size;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t ts;
        if (!as_i64(PyList_GET_ITEM(timestamps, i), &ts)) Py_RETURN_NONE;
        __int128 delta = (__int128)ts - first_ts;
        if (delta < INT64_MIN || delta > INT64_MAX) Py_RETURN_NONE;
        PyObject *hdrs = headers == Py_None ? Py_None : PyList_GET_ITEM(headers, i);
        Py_ssize_t size =
            put_record(NULL, i, PyList_GET_ITEM(keys, i), PyList_GET_ITEM(values, i), (int64_t)delta, hdrs);
        if (size < 0) Py_RETURN_NONE;
        total += size;
        if (total > PY_SSIZE_T_MAX / 2) Py_RETURN_NONE;
    }
    PyObject *out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL) return NULL;
    unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(out);
    memset(p, 0, (size_t)header_size);
    p += header_size;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t ts;
        as_i64(PyList_GET_ITEM(timestamps, i), &ts);
        PyObject *hdrs = headers == Py_None ? Py_None : PyList_GET_ITEM(headers, i);
        p += put_record(p, i, PyList_GET_ITEM(keys, i), PyList_GET_ITEM(values, i), (int64_t)(ts - first_ts),
                        hdrs);
    }
    return out;
}

/* A varint at body[*pos] as kafka_codec.decode_varint reads it (bounded by the body's end, not the
 * record's). 0 when it would raise (truncated, or longer than 10 bytes). */
static inline int get_varint(const unsigned char *body, Py_ssize_t end, Py_ssize_t *pos, int64_t *out) {
    uint64_t z = 0;
    int shift = 0;
    for (;;) {
        if (*pos >= end) return 0;
        unsigned char b = body[(*pos)++];
        z |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) break;
        shift += 7;
        if (shift > 63) return 0;
    }
    *out = (int64_t)((z >> 1) ^ (~(z & 1) + 1));
    return 1;
}

/* A nullable byte string (varint length, -1 null) ending by limit, as kafka_codec._nullable_bytes;
 * *out is a new reference (None for null). 0 when it would raise; -1 on a Python error. */
static int get_nullable(const unsigned char *body, Py_ssize_t end, Py_ssize_t *pos, Py_ssize_t limit,
                        PyObject **out) {
    int64_t length;
    if (!get_varint(body, end, pos, &length)) return 0;
    if (length == -1) {
        *out = Py_NewRef(Py_None);
        return 1;
    }
    if (length < 0 || (__int128)*pos + length > limit) return 0;
    *out = PyBytes_FromStringAndSize((const char *)body + *pos, (Py_ssize_t)length);
    if (*out == NULL) return -1;
    *pos += (Py_ssize_t)length;
    return 1;
}

#define CHECK_GOT(got)            \
    do {                          \
        if ((got) < 0) goto error; \
        goto fallback;            \
    } while (0)

/* kafka_decode_records(body: bytes, count, base, first_ts, append_time | None)
 *   -> (offsets, timestamps, keys, values, headers) | None
 *
 * kafka_codec._decode_records: the same five lists, or None wherever it would raise (the Python
 * loop then raises its error) or where a value leaves 64 bits (the Python loop computes it). */
static PyObject *native_kafka_decode_records(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *body_obj, *count_obj, *base_obj, *first_obj, *append_time;
    if (!PyArg_ParseTuple(args, "O!OOOO", &PyBytes_Type, &body_obj, &count_obj, &base_obj, &first_obj,
                          &append_time))
        return NULL;
    int64_t count, base, first_ts;
    if (!as_i64(count_obj, &count) || !as_i64(base_obj, &base) || !as_i64(first_obj, &first_ts))
        Py_RETURN_NONE;
    const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(body_obj);
    Py_ssize_t end = PyBytes_GET_SIZE(body_obj);
    Py_ssize_t n = count > 0 ? (Py_ssize_t)count : 0;
    /* a record that parses takes at least 7 bytes (its length, attributes and five varints) */
    if (n > end / 7) Py_RETURN_NONE;
    PyObject *lists[5] = {PyList_New(n), PyList_New(n), PyList_New(n), PyList_New(n), PyList_New(n)};
    PyObject *result = NULL;
    for (int k = 0; k < 5; k++)
        if (lists[k] == NULL) goto error;
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t length, ts_delta, offset_delta, header_count;
        if (!get_varint(body, end, &pos, &length)) goto fallback;
        if (length < 0 || (__int128)pos + length > end) goto fallback;
        Py_ssize_t record_end = pos + (Py_ssize_t)length;
        pos += 1; /* attributes: unused */
        if (!get_varint(body, end, &pos, &ts_delta) || !get_varint(body, end, &pos, &offset_delta))
            goto fallback;
        PyObject *key, *value;
        int got = get_nullable(body, end, &pos, record_end, &key);
        if (got <= 0) CHECK_GOT(got);
        PyList_SET_ITEM(lists[2], i, key);
        got = get_nullable(body, end, &pos, record_end, &value);
        if (got <= 0) CHECK_GOT(got);
        PyList_SET_ITEM(lists[3], i, value);
        if (!get_varint(body, end, &pos, &header_count)) goto fallback;
        if (header_count < 0 || header_count > (int64_t)record_end - pos) goto fallback;
        PyObject *record_headers = PyList_New((Py_ssize_t)header_count);
        if (record_headers == NULL) goto error;
        PyList_SET_ITEM(lists[4], i, record_headers);
        for (Py_ssize_t h = 0; h < (Py_ssize_t)header_count; h++) {
            PyObject *hkey, *hvalue;
            got = get_nullable(body, end, &pos, record_end, &hkey);
            if (got <= 0) CHECK_GOT(got);
            if (hkey == Py_None) {
                Py_DECREF(hkey);
                goto fallback;
            }
            got = get_nullable(body, end, &pos, record_end, &hvalue);
            if (got <= 0) {
                Py_DECREF(hkey);
                CHECK_GOT(got);
            }
            PyObject *text = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(hkey), PyBytes_GET_SIZE(hkey), "strict");
            Py_DECREF(hkey);
            if (text == NULL) {
                Py_DECREF(hvalue);
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto error;
                PyErr_Clear();
                goto fallback;
            }
            PyObject *pair = PyTuple_Pack(2, text, hvalue);
            Py_DECREF(text);
            Py_DECREF(hvalue);
            if (pair == NULL) goto error;
            PyList_SET_ITEM(record_headers, h, pair);
        }
        if (pos != record_end) goto fallback;
        __int128 offset = (__int128)base + offset_delta;
        if (offset < INT64_MIN || offset > INT64_MAX) goto fallback;
        PyObject *o = PyLong_FromLongLong((long long)offset);
        if (o == NULL) goto error;
        PyList_SET_ITEM(lists[0], i, o);
        PyObject *t;
        if (append_time == Py_None) {
            __int128 ts = (__int128)first_ts + ts_delta;
            if (ts < INT64_MIN || ts > INT64_MAX) goto fallback;
            t = PyLong_FromLongLong((long long)ts);
            if (t == NULL) goto error;
        } else {
            t = Py_NewRef(append_time);
        }
        PyList_SET_ITEM(lists[1], i, t);
    }
    if (pos != end) goto fallback;
    result = PyTuple_Pack(5, lists[0], lists[1], lists[2], lists[3], lists[4]);
    goto done;
fallback:
    result = Py_NewRef(Py_None);
    goto done;
error:
    result = NULL;
done:
    /* lists of a fallback may hold NULL items: PyList dealloc skips them */
    for (int k = 0; k < 5; k++) Py_XDECREF(lists[k]);
    return result;
}

static PyMethodDef native_methods[] = {
    {"configure", native_configure, METH_O, "Register the record class (reads its slot offsets)."},
    {"decode_block", native_decode_block, METH_VARARGS, "Decode one data block, or None (see module)."},
    {"check_batches", native_check_batches, METH_VARARGS, "Whether the writer may encode these batches here."},
    {"encode_run", native_encode_run, METH_VARARGS, "Encode a run of batches into the open data block."},
    {"encode_columns_run", native_encode_columns_run, METH_VARARGS, "encode_run for one stream's columns."},
    {"kafka_decode_records", native_kafka_decode_records, METH_VARARGS, "A batch's record columns, or None."},
    {"kafka_records", native_kafka_records, METH_VARARGS, "A Kafka RecordBatch v2's records, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "s3stream._native",
    "The compiled hot path of the object codecs (see s3stream.native).", -1, native_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&native_module); }
