# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of the per-message wire path: the frame splitter of protocol/frames.py and the
publish / header / ack decoders and deliver / ack / content encoders of protocol/fastcodec.py.

Why: after the pure-Python hot path was trimmed, every message still paid some 25 Python-level steps, a
few of them here (a struct unpack, two slices and a bytes() per frame; struct packs and concatenations per
delivery). This module does the same work with C reads and writes on the buffers, and one copy per frame
(the payload) where the pure parser makes two.

The contract: the same results and the same exceptions (classes of protocol/frame_errors.py, texts, reply
codes, ``FrameError.frames``) as the pure functions, which stay the reference; tests/unit run both, on the
same inputs. Anything off the fast path (an argument that is not exactly ``bytes`` or ``int``, a value out
of its wire range) is handed to the pure function, so that even the odd cases answer as it does.

Not imported directly by the broker: protocol/__init__.py loads it and frames.py / fastcodec.py rebind their
public names to it. Built by setup.py as an optional extension (pure Python when no compiler is found).
"""

cimport cython
from cpython.bytearray cimport (
    PyByteArray_AS_STRING,
    PyByteArray_FromStringAndSize,
    PyByteArray_GET_SIZE,
    PyByteArray_Resize,
)
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport uint8_t, uint64_t
from libc.string cimport memcpy

from protocol import constants as _k
from protocol.frame_errors import BadProtocolHeader, FrameError, check_protocol_header

# The wire numbers, read once from protocol/constants.py (their one definition).
cdef unsigned int FRAME_METHOD = _k.FRAME_METHOD
cdef unsigned int FRAME_HEADER = _k.FRAME_HEADER
cdef unsigned int FRAME_BODY = _k.FRAME_BODY
cdef unsigned int FRAME_HEARTBEAT = _k.FRAME_HEARTBEAT
cdef object FRAME_PUBLISH = _k.FRAME_PUBLISH
cdef unsigned int FRAME_END = _k.FRAME_END
cdef unsigned int FRAME_OVERHEAD = _k.FRAME_OVERHEAD
cdef unsigned int CLASS_BASIC = _k.CLASS_BASIC
cdef unsigned int BASIC_DELIVER = _k.BASIC_DELIVER
cdef unsigned int BASIC_ACK = _k.BASIC_ACK
cdef unsigned int BASIC_NACK = _k.BASIC_NACK
cdef bytes FRAME_END_BYTE = _k.FRAME_END_BYTE
cdef object FRAME_MIN_SIZE = _k.FRAME_MIN_SIZE
cdef uint64_t U32_MAX = 0xFFFFFFFFu


# -- big-endian reads and writes ------------------------------------------------------------------------

cdef inline unsigned int _get_u16(const uint8_t* p) noexcept nogil:
    return (<unsigned int>p[0] << 8) | p[1]


cdef inline uint64_t _get_u32(const uint8_t* p) noexcept nogil:
    return (<uint64_t>p[0] << 24) | (<uint64_t>p[1] << 16) | (<uint64_t>p[2] << 8) | p[3]


cdef inline uint64_t _get_u64(const uint8_t* p) noexcept nogil:
    return (_get_u32(p) << 32) | _get_u32(p + 4)


cdef inline void _put_u16(uint8_t* p, unsigned int v) noexcept nogil:
    p[0] = (v >> 8) & 0xFF
    p[1] = v & 0xFF


cdef inline void _put_u32(uint8_t* p, uint64_t v) noexcept nogil:
    p[0] = (v >> 24) & 0xFF
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF


cdef inline void _put_u64(uint8_t* p, uint64_t v) noexcept nogil:
    _put_u32(p, v >> 32)
    _put_u32(p + 4, v & 0xFFFFFFFFu)


# -- arguments on the fast path ---------------------------------------------------------------------------

cdef inline long _u16(object v) noexcept:
    """``v`` if it is an int of 0..65535, else -1 (the caller then defers to the pure function)."""
    cdef long x
    if type(v) is not int:
        return -1
    try:
        x = v
    except OverflowError:
        return -1
    return x if 0 <= x <= 0xFFFF else -1


cdef inline bint _u64(object v, uint64_t* out) noexcept:
    """Store ``v`` in ``out`` if it is an int of 0..2**64-1; False otherwise."""
    if type(v) is not int:
        return False
    try:
        out[0] = v
    except OverflowError:
        return False
    return True


cdef inline Py_ssize_t _offset(object start) noexcept:
    """``start`` as a buffer offset if it is an int of 0..2**31-1 (no arithmetic on it can overflow), else -1:
    the caller then defers to the pure function, which answers any other value its own way."""
    cdef Py_ssize_t s
    if type(start) is not int:
        return -1
    try:
        s = start
    except OverflowError:
        return -1
    return s if 0 <= s <= 0x7FFFFFFF else -1


cdef object _reference = None


cdef object _pure():
    """protocol.fastcodec.pure, imported on first use: it imports this module, so not at load time."""
    global _reference
    if _reference is None:
        from protocol.fastcodec import pure
        _reference = pure
    return _reference


# -- frames ---------------------------------------------------------------------------------------------

cdef int _check_head(unsigned int frame_type, uint64_t size, long long frame_max) except -1:
    """The checks a frame passes as soon as its 7 header octets are in, in the reference's order."""
    if (frame_type != FRAME_METHOD and frame_type != FRAME_HEADER and frame_type != FRAME_BODY
            and frame_type != FRAME_HEARTBEAT):
        raise FrameError(f"unknown frame type {frame_type}")
    if frame_max and <long long>size + FRAME_OVERHEAD > frame_max:
        raise FrameError(f"frame size {size + FRAME_OVERHEAD} larger than negotiated maximum {frame_max}")
    if frame_type == FRAME_HEARTBEAT and size:
        raise FrameError(f"heartbeat frame with a {size}-byte payload")
    return 0


cdef int _bad_end(uint8_t octet) except -1:
    raise FrameError(f"bad frame end octet {format(octet, '#04x')}, expected 0xce")


cdef inline bint _frame_fits(unsigned int frame_type, uint64_t size, long long frame_max) noexcept:
    """Whether a frame head passes _check_head (without raising)."""
    if frame_type != FRAME_METHOD and frame_type != FRAME_HEADER and frame_type != FRAME_BODY \
            and frame_type != FRAME_HEARTBEAT:
        return False
    if frame_max and size + FRAME_OVERHEAD > <uint64_t>frame_max:
        return False
    return not (frame_type == FRAME_HEARTBEAT and size)


cdef Py_ssize_t _whole_publish_end(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end, unsigned int channel,
                                   long long frame_max) noexcept:
    """protocol/frames.py's _whole_publish_end: where the single body frame completing a content header that
    starts at ``pos`` ends, both on ``channel``, complete and well-formed; else 0."""
    cdef uint64_t size, body_size
    cdef Py_ssize_t stop
    if end - pos < 7 or p[pos] != FRAME_HEADER or _get_u16(p + pos + 1) != channel:
        return 0
    size = _get_u32(p + pos + 3)
    if size < 12 or not _frame_fits(FRAME_HEADER, size, frame_max) or <uint64_t>(end - pos - 7) <= size:
        return 0
    stop = pos + 7 + <Py_ssize_t>size
    if p[stop] != FRAME_END:
        return 0
    body_size = _get_u64(p + pos + 11)
    pos = stop + 1
    if body_size == 0 or end - pos < 7 or p[pos] != FRAME_BODY or _get_u16(p + pos + 1) != channel:
        return 0
    size = _get_u32(p + pos + 3)
    if size != body_size or not _frame_fits(FRAME_BODY, size, frame_max) or <uint64_t>(end - pos - 7) <= size:
        return 0
    stop = pos + 7 + <Py_ssize_t>size
    if p[stop] != FRAME_END:
        return 0
    return stop + 1


cdef Py_ssize_t _split(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end, long long frame_max,
                       list frames, bint combine_publish) except -1:
    """Append the complete frames of ``p[pos:end]`` to ``frames``; return where the first incomplete one
    starts (``end`` if none). A frame's payload is copied once, straight into its bytes object. With
    ``combine_publish``, a whole publish is one item (protocol/frames.py's FrameParser says when)."""
    cdef unsigned int frame_type, channel
    cdef uint64_t size
    cdef Py_ssize_t stop, after, header_stop
    while end - pos >= 7:
        frame_type = p[pos]
        channel = _get_u16(p + pos + 1)
        size = _get_u32(p + pos + 3)
        _check_head(frame_type, size, frame_max)
        stop = pos + 7 + <Py_ssize_t>size
        if stop >= end:
            break
        if p[stop] != FRAME_END:
            _bad_end(p[stop])
        if (combine_publish and frame_type == FRAME_METHOD and size >= 4 and p[pos + 7] == 0
                and p[pos + 8] == 60 and p[pos + 9] == 0 and p[pos + 10] == 40):
            after = _whole_publish_end(p, stop + 1, end, channel, frame_max)
            if after:
                header_stop = stop + 8 + <Py_ssize_t>_get_u32(p + stop + 4)
                frames.append((FRAME_PUBLISH, channel, (
                    PyBytes_FromStringAndSize(<const char*>p + pos + 7, size),
                    PyBytes_FromStringAndSize(<const char*>p + stop + 8, header_stop - stop - 8),
                    PyBytes_FromStringAndSize(<const char*>p + header_stop + 8, after - 1 - header_stop - 8))))
                pos = after
                continue
        frames.append((frame_type, channel, PyBytes_FromStringAndSize(<const char*>p + pos + 7, size)))
        pos = stop + 1
    return pos


cdef inline int _append(bytearray buf, const uint8_t* src, Py_ssize_t n) except -1:
    cdef Py_ssize_t have = PyByteArray_GET_SIZE(buf)
    if n:
        PyByteArray_Resize(buf, have + n)
        memcpy(PyByteArray_AS_STRING(buf) + have, src, n)
    return 0


@cython.final
cdef class FrameParser:
    """Turns received bytes into frames; the compiled :class:`protocol.frames.PyFrameParser`, same interface
    (``feed``, ``buffered``, writable ``frame_max`` and ``header_received``) and same behaviour.

    The difference is where bytes go. The reference appends every read to its buffer and slices each frame
    out of it. Here a read (``bytes``) that starts on a frame boundary is split where it lies, and only its
    incomplete tail is kept; a frame left incomplete by an earlier read is completed in the buffer with just
    the bytes it lacks, and the rest of the read is again split where it lies.
    """

    cdef bytearray _buf  # _buf[_pos:]: the bytes of an incomplete frame (or of the protocol header)
    cdef Py_ssize_t _pos  # only the generic path leaves it non-zero; the fast path keeps _buf[:_pos] empty
    cdef public long long frame_max
    cdef public bint header_received
    cdef public bint combine_publish

    def __init__(self, frame_max=FRAME_MIN_SIZE, expect_header=True, combine_publish=False):
        self._buf = bytearray()
        self._pos = 0
        self.frame_max = frame_max
        self.header_received = not expect_header
        self.combine_publish = combine_publish

    @property
    def buffered(self):
        """Bytes received but not yet part of a complete frame."""
        return PyByteArray_GET_SIZE(self._buf) - self._pos

    def feed(self, data):
        cdef list frames = []
        cdef const uint8_t* src
        cdef Py_ssize_t n, pos = 0
        if not self.header_received or type(data) is not bytes:
            return self._feed_generic(data, frames)
        src = <const uint8_t*>PyBytes_AS_STRING(data)
        n = PyBytes_GET_SIZE(data)
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        try:
            if PyByteArray_GET_SIZE(self._buf):
                pos = self._complete_pending(src, n, frames)
                if pos < 0:
                    return frames
            pos = _split(src, pos, n, self.frame_max, frames, self.combine_publish)
        except FrameError as exc:
            exc.frames = frames
            self._buf = bytearray()
            self._pos = 0
            raise
        if pos < n:
            self._buf = PyByteArray_FromStringAndSize(<const char*>src + pos, n - pos)
        return frames

    cdef Py_ssize_t _complete_pending(self, const uint8_t* src, Py_ssize_t n, list frames) except -2:
        """Feed the buffered incomplete frame from ``src``: return how many bytes of ``src`` completed it,
        or -1 if all of them went into the buffer and it is still incomplete."""
        cdef bytearray buf = self._buf
        cdef Py_ssize_t have, take, used = 0, total, after, header_stop
        cdef const uint8_t* p
        cdef uint64_t size
        cdef unsigned int channel
        have = PyByteArray_GET_SIZE(buf)
        if have < 7:
            take = min(7 - have, n)
            _append(buf, src, take)
            used = take
            have += take
            if have < 7:
                return -1
        p = <const uint8_t*>PyByteArray_AS_STRING(buf)
        size = _get_u32(p + 3)
        _check_head(p[0], size, self.frame_max)
        total = 7 + <Py_ssize_t>size + 1
        if n - used < total - have:
            _append(buf, src + used, n - used)
            return -1
        _append(buf, src + used, total - have)
        used += total - have
        p = <const uint8_t*>PyByteArray_AS_STRING(buf)
        if p[total - 1] != FRAME_END:
            _bad_end(p[total - 1])
        channel = _get_u16(p + 1)
        if (self.combine_publish and p[0] == FRAME_METHOD and size >= 4 and p[7] == 0 and p[8] == 60
                and p[9] == 0 and p[10] == 40):
            # A publish whose method frame was cut by the previous read: whole if its header and body are
            # here, as the reference (which splits from one buffer) finds it.
            after = _whole_publish_end(src, used, n, channel, self.frame_max)
            if after:
                header_stop = used + 7 + <Py_ssize_t>_get_u32(src + used + 3)
                frames.append((FRAME_PUBLISH, channel, (
                    PyBytes_FromStringAndSize(<const char*>p + 7, size),
                    PyBytes_FromStringAndSize(<const char*>src + used + 7, header_stop - used - 7),
                    PyBytes_FromStringAndSize(<const char*>src + header_stop + 8, after - 1 - header_stop - 8))))
                PyByteArray_Resize(buf, 0)
                return after
        frames.append((p[0], channel, PyBytes_FromStringAndSize(<const char*>p + 7, size)))
        PyByteArray_Resize(buf, 0)
        return used

    cdef list _feed_generic(self, data, list frames):
        """The reference's own algorithm, for the protocol header and for reads that are not ``bytes``."""
        cdef bytearray buf = self._buf
        cdef Py_ssize_t pos = 0
        if self._pos:
            del buf[: self._pos]
            self._pos = 0
        buf += data
        if not self.header_received:
            if not check_protocol_header(buf):
                return frames
            self.header_received = True
            pos = 8
        try:
            pos = _split(<const uint8_t*>PyByteArray_AS_STRING(buf), pos, PyByteArray_GET_SIZE(buf),
                         self.frame_max, frames, self.combine_publish)
        except FrameError as exc:
            exc.frames = frames
            self._buf = bytearray()
            self._pos = 0
            raise
        self._pos = pos
        return frames


# -- basic.publish, content header, ack / nack / reject in ------------------------------------------------

@cython.final
@cython.freelist(64)
cdef class PublishArgs:
    """The arguments of one basic.publish; ``names_raw`` is exchange + routing key as two short strings.
    (The compiled :class:`protocol.fastcodec.PyPublishArgs`: built in C by the decoder, same attributes.)"""

    cdef public object exchange
    cdef public object routing_key
    cdef public object mandatory
    cdef public object immediate
    cdef public object names_raw

    def __init__(self, exchange, routing_key, mandatory, immediate, names_raw):
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate
        self.names_raw = names_raw


cdef object _utf8(const uint8_t* p, Py_ssize_t n):
    """The text of ``n`` UTF-8 bytes, or None if they are not UTF-8."""
    try:
        return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    except UnicodeDecodeError:
        return None


def decode_basic_publish(args, start=0):
    """The method's arguments from offset ``start``: reserved short, exchange, routing key, bits."""
    cdef Py_ssize_t s = _offset(start)
    if s < 0 or type(args) is not bytes:
        return _pure().decode_basic_publish(args, start)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(args)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(args)
    cdef Py_ssize_t i = s + 3, q
    cdef unsigned int length, bits
    cdef object exchange = "", routing_key
    # The reference reads the names with slices (cut short by the end of the buffer, not failing) and
    # fails on the next index read; so does this, with the same order of errors.
    if i - 1 >= n:
        raise FrameError("basic.publish: truncated method frame")
    length = p[i - 1]
    if length:
        exchange = _utf8(p + i, min(<Py_ssize_t>length, n - i))
        if exchange is None:
            raise FrameError("basic.publish: short string is not UTF-8")
    i += length
    if i >= n:
        raise FrameError("basic.publish: truncated method frame")
    length = p[i]
    routing_key = _utf8(p + i + 1, min(<Py_ssize_t>length, n - i - 1))
    if routing_key is None:
        raise FrameError("basic.publish: short string is not UTF-8")
    q = i + 1 + length
    if q >= n:
        raise FrameError("basic.publish: truncated method frame")
    bits = p[q]
    cdef PublishArgs out = PublishArgs.__new__(PublishArgs)
    out.exchange = exchange
    out.routing_key = routing_key
    out.mandatory = True if bits & 1 else False
    out.immediate = True if bits & 2 else False
    out.names_raw = PyBytes_FromStringAndSize(<const char*>p + s + 2, q - s - 2)
    return out


cdef inline const uint8_t* _tag_bits(args, Py_ssize_t s, str method) except NULL:
    """Where a delivery tag + bits octet start in ``args`` (bytes), or FrameError if fewer than 9 bytes."""
    if PyBytes_GET_SIZE(args) - s < 9:
        raise FrameError(f"{method}: truncated method frame")
    return <const uint8_t*>PyBytes_AS_STRING(args) + s


def decode_ack(args, start=0):
    """basic.ack → (delivery_tag, multiple)."""
    cdef Py_ssize_t s = _offset(start)
    if s < 0 or type(args) is not bytes:
        return _pure().decode_ack(args, start)
    cdef const uint8_t* p = _tag_bits(args, s, "basic.ack")
    return _get_u64(p), (p[8] & 1) != 0


def decode_nack(args, start=0):
    """basic.nack → (delivery_tag, multiple, requeue)."""
    cdef Py_ssize_t s = _offset(start)
    if s < 0 or type(args) is not bytes:
        return _pure().decode_nack(args, start)
    cdef const uint8_t* p = _tag_bits(args, s, "basic.nack")
    return _get_u64(p), (p[8] & 1) != 0, (p[8] & 2) != 0


def decode_reject(args, start=0):
    """basic.reject → (delivery_tag, requeue)."""
    cdef Py_ssize_t s = _offset(start)
    if s < 0 or type(args) is not bytes:
        return _pure().decode_reject(args, start)
    cdef const uint8_t* p = _tag_bits(args, s, "basic.reject")
    return _get_u64(p), (p[8] & 1) != 0


def decode_content_header(payload):
    """Check a content header's class and return its body size. The properties stay raw in ``payload``."""
    if type(payload) is not bytes:
        return _pure().decode_content_header(payload)
    if PyBytes_GET_SIZE(payload) < 12:
        raise FrameError("content header frame too short")
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(payload)
    cdef unsigned int class_id = _get_u16(p)
    if class_id != CLASS_BASIC:
        raise FrameError(f"content header for class {class_id}, expected {CLASS_BASIC}")
    return _get_u64(p + 4)


# -- deliver, ack, nack, content out ----------------------------------------------------------------------

cdef inline bytes _new_bytes(Py_ssize_t n, uint8_t** out):
    cdef bytes b = PyBytes_FromStringAndSize(NULL, n)
    out[0] = <uint8_t*>PyBytes_AS_STRING(b)
    return b


cdef inline void _put_frame_head(uint8_t* w, unsigned int frame_type, unsigned int channel,
                                 uint64_t size) noexcept nogil:
    w[0] = frame_type
    _put_u16(w + 1, channel)
    _put_u32(w + 3, size)


cdef inline bytes _tag_bits_frame(long channel, unsigned int method_id, uint64_t tag, unsigned int bits):
    """A basic method frame whose arguments are a delivery tag and one octet of bits (ack, nack)."""
    cdef uint8_t* w
    cdef bytes out = _new_bytes(21, &w)
    _put_frame_head(w, FRAME_METHOD, channel, 13)
    _put_u16(w + 7, CLASS_BASIC)
    _put_u16(w + 9, method_id)
    _put_u64(w + 11, tag)
    w[19] = bits
    w[20] = FRAME_END
    return out


cdef inline Py_ssize_t _put_deliver(uint8_t* w, long ch, bytes consumer_tag_raw, uint64_t tag, bint redelivered,
                                    bytes names_raw):
    """Write the basic.deliver frame at ``w`` (11 + its arguments + 1 bytes, the caller's to have checked);
    returns its length."""
    cdef Py_ssize_t ct = PyBytes_GET_SIZE(consumer_tag_raw), nr = PyBytes_GET_SIZE(names_raw)
    cdef Py_ssize_t args_len = ct + 9 + nr
    _put_frame_head(w, FRAME_METHOD, ch, args_len + 4)
    _put_u16(w + 7, CLASS_BASIC)
    _put_u16(w + 9, BASIC_DELIVER)
    memcpy(w + 11, PyBytes_AS_STRING(consumer_tag_raw), ct)
    _put_u64(w + 11 + ct, tag)
    w[11 + ct + 8] = 1 if redelivered else 0
    memcpy(w + 11 + ct + 9, PyBytes_AS_STRING(names_raw), nr)
    w[11 + args_len] = FRAME_END
    return 11 + args_len + 1


def encode_basic_deliver(channel, consumer_tag_raw, delivery_tag, redelivered, names_raw):
    """basic.deliver; ``consumer_tag_raw`` and ``names_raw`` (exchange + routing key) are short strings."""
    cdef long ch = _u16(channel)
    cdef uint64_t tag
    if (ch < 0 or type(consumer_tag_raw) is not bytes or type(names_raw) is not bytes
            or not _u64(delivery_tag, &tag)):
        return _pure().encode_basic_deliver(channel, consumer_tag_raw, delivery_tag, redelivered, names_raw)
    cdef Py_ssize_t ct = PyBytes_GET_SIZE(consumer_tag_raw), nr = PyBytes_GET_SIZE(names_raw)
    cdef Py_ssize_t args_len = ct + 9 + nr
    if <uint64_t>args_len + 4 > U32_MAX:
        return _pure().encode_basic_deliver(channel, consumer_tag_raw, delivery_tag, redelivered, names_raw)
    cdef uint8_t* w
    cdef bytes out = _new_bytes(11 + args_len + 1, &w)
    _put_deliver(w, ch, consumer_tag_raw, tag, redelivered, names_raw)
    return out


def encode_basic_ack(channel, delivery_tag, multiple):
    cdef long ch = _u16(channel)
    cdef uint64_t tag
    if ch < 0 or not _u64(delivery_tag, &tag):
        return _pure().encode_basic_ack(channel, delivery_tag, multiple)
    return _tag_bits_frame(ch, BASIC_ACK, tag, 1 if multiple else 0)


def encode_basic_nack(channel, delivery_tag, multiple, requeue=False):
    cdef long ch = _u16(channel)
    cdef uint64_t tag
    if ch < 0 or not _u64(delivery_tag, &tag):
        return _pure().encode_basic_nack(channel, delivery_tag, multiple, requeue)
    return _tag_bits_frame(ch, BASIC_NACK, tag, (1 if multiple else 0) | (2 if requeue else 0))


cdef inline bytes _frame_head(unsigned int frame_type, unsigned int channel, uint64_t size):
    cdef uint8_t* w
    cdef bytes out = _new_bytes(7, &w)
    _put_frame_head(w, frame_type, channel, size)
    return out


def encode_content(channel, header_payload, body, frame_max):
    """The content header frame (its payload as received) and the body frames, each at most ``frame_max``
    bytes in all (0 = no limit); a body larger than one frame is cut into views of it, not copies."""
    cdef long ch = _u16(channel)
    cdef uint64_t fm
    if (ch < 0 or type(header_payload) is not bytes or type(body) is not bytes or not _u64(frame_max, &fm)
            or 0 < fm <= <uint64_t>FRAME_OVERHEAD):
        return _pure().encode_content(channel, header_payload, body, frame_max)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(body), start
    cdef uint64_t chunk = fm - FRAME_OVERHEAD if fm else <uint64_t>size
    if <uint64_t>PyBytes_GET_SIZE(header_payload) > U32_MAX or <uint64_t>size > U32_MAX:
        return _pure().encode_content(channel, header_payload, body, frame_max)
    cdef list out = [_frame_head(FRAME_HEADER, ch, PyBytes_GET_SIZE(header_payload)), header_payload,
                     FRAME_END_BYTE]
    if not size:
        return out
    if <uint64_t>size <= chunk:
        out.append(_frame_head(FRAME_BODY, ch, size))
        out.append(body)
        out.append(FRAME_END_BYTE)
        return out
    view = memoryview(body)
    for start in range(0, size, <Py_ssize_t>chunk):
        piece = view[start : start + <Py_ssize_t>chunk]
        out.append(_frame_head(FRAME_BODY, ch, len(piece)))
        out.append(piece)
        out.append(FRAME_END_BYTE)
    return out


cdef Py_ssize_t SMALL_DELIVERY = 4096  # protocol/fastcodec.py's SMALL_DELIVERY


def encode_delivery_into(list out not None, channel, consumer_tag_raw, delivery_tag, redelivered, names_raw,
                         header_payload, body, frame_max):
    """basic.deliver and its content frames appended to ``out``: one piece for a small body in one frame."""
    cdef long ch = _u16(channel)
    cdef uint64_t tag, fm
    if (ch < 0 or type(consumer_tag_raw) is not bytes or type(names_raw) is not bytes
            or type(header_payload) is not bytes or type(body) is not bytes or not _u64(delivery_tag, &tag)
            or not _u64(frame_max, &fm) or 0 < fm <= <uint64_t>FRAME_OVERHEAD):
        _pure().encode_delivery_into(out, channel, consumer_tag_raw, delivery_tag, redelivered, names_raw,
                                     header_payload, body, frame_max)
        return
    cdef Py_ssize_t ct = PyBytes_GET_SIZE(consumer_tag_raw), nr = PyBytes_GET_SIZE(names_raw)
    cdef Py_ssize_t hl = PyBytes_GET_SIZE(header_payload), size = PyBytes_GET_SIZE(body)
    cdef Py_ssize_t args_len = ct + 9 + nr
    if (size > SMALL_DELIVERY or (fm and <uint64_t>size > fm - FRAME_OVERHEAD) or <uint64_t>hl > U32_MAX
            or <uint64_t>args_len + 4 > U32_MAX):
        out.append(encode_basic_deliver(channel, consumer_tag_raw, delivery_tag, redelivered, names_raw))
        out.extend(encode_content(channel, header_payload, body, frame_max))
        return
    cdef Py_ssize_t deliver_len = 11 + args_len + 1, header_len = 7 + hl + 1
    cdef uint8_t* w
    cdef bytes piece = _new_bytes(deliver_len + header_len + (7 + size + 1 if size else 0), &w)
    w += _put_deliver(w, ch, consumer_tag_raw, tag, redelivered, names_raw)
    _put_frame_head(w, FRAME_HEADER, ch, hl)
    memcpy(w + 7, PyBytes_AS_STRING(header_payload), hl)
    w[7 + hl] = FRAME_END
    if size:
        w += header_len
        _put_frame_head(w, FRAME_BODY, ch, size)
        memcpy(w + 7, PyBytes_AS_STRING(body), size)
        w[7 + size] = FRAME_END
    out.append(piece)


def build_content_header(body_size, properties_raw):
    """A content header payload for basic from already-encoded flags + property list."""
    cdef uint64_t size
    if type(properties_raw) is not bytes or not _u64(body_size, &size):
        return _pure().build_content_header(body_size, properties_raw)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(properties_raw)
    cdef uint8_t* w
    cdef bytes out = _new_bytes(12 + n, &w)
    _put_u16(w, CLASS_BASIC)
    _put_u16(w + 2, 0)
    _put_u64(w + 4, size)
    memcpy(w + 12, PyBytes_AS_STRING(properties_raw), n)
    return out
