"""Every method the fast codec does not handle, decoded and encoded by pamqp.

These are the rare methods (handshake, declares, binds, qos, consume, tx, confirm.select, closes), where
correctness matters and a few microseconds do not.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import base, commands, decode, encode

from protocol.constants import FRAME_METHOD
from protocol.frames import FrameError, encode_frame
from protocol.properties import decode_field_table

_INDEX = struct.Struct(">I")
_FIXED_SIZES = {"octet": 1, "short": 2, "long": 4, "longlong": 8, "timestamp": 8}


class UnknownMethod(FrameError):
    """A class or method id the protocol does not define: the connection is closed with 503 COMMAND_INVALID."""


def method_index(payload: bytes) -> int:
    """The class id << 16 | method id that opens a method frame's payload."""
    if len(payload) < 4:
        raise FrameError("method frame shorter than its class and method id")
    index: int = _INDEX.unpack_from(payload, 0)[0]
    return index


def decode_method(payload: bytes) -> base.Frame:
    """A method frame's payload → the pamqp method object."""
    index = method_index(payload)
    cls: type[base.Frame] | None = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise UnknownMethod(f"unknown method class {index >> 16} method {index & 0xFFFF}", 503)
    try:
        return _unmarshal(cls, payload, 4)
    except Exception as exc:  # FrameError from the checks, ValueError, UnicodeDecodeError from pamqp  # noqa: BLE001
        raise FrameError(f"malformed {cls.name} method frame: {exc}") from None


def _unmarshal(cls: type[base.Frame], data: bytes, pos: int) -> base.Frame:
    """pamqp's ``Frame.unmarshal`` with every length checked against the bytes there are.

    pamqp's string and table decoders slice without checking, so a payload cut inside its last string
    decoded to a shorter string. Bits pack as pamqp (and the spec) have it: consecutive bit fields share
    octets, low bit first, a new octet after eight and after the last bit of a run. Bytes after the last
    field are ignored.
    """
    method = cls()
    size = len(data)
    bit = 0  # position of the next bit in the octet at ``pos``; 0 when not inside a run of bits
    for name in cls.__slots__:
        kind = cls.amqp_type(name)
        if kind == "bit":
            if bit == 8:
                pos += 1
                bit = 0
            if pos >= size:
                raise FrameError(f"cut before its {name} bit")
            setattr(method, name, decode.by_type(data[pos : pos + 1], "bit", bit)[1])
            bit += 1
            continue
        if bit:
            pos += 1
            bit = 0
        length = _FIXED_SIZES.get(kind)
        if length is None:
            if kind == "shortstr":
                if pos >= size:
                    raise FrameError(f"cut before its {name} field")
                length = 1 + data[pos]
            elif kind == "longstr" or kind == "table":
                if pos + 4 > size:
                    raise FrameError(f"cut inside the length of its {name} field")
                length = 4 + _INDEX.unpack_from(data, pos)[0]
            else:
                raise FrameError(f"field {name} has unsupported type {kind}")
        end = pos + length
        if end > size:
            raise FrameError(f"cut inside its {name} field")
        value: object
        if kind == "table":
            # Checked and decoded in one linear pass (pamqp's table decoder is quadratic in the entries).
            value = decode_field_table(data, pos, end, strict_keys=True)
        else:
            consumed, value = decode.by_type(data[pos:end], kind)
            if consumed != length:
                raise FrameError(f"field {name} decoded to {consumed} bytes, not {length}")
        setattr(method, name, value)
        pos = end
    return method


_DEFAULTS: dict[str, Any] = {"bit": False, "octet": 0, "short": 0, "long": 0, "longlong": 0,
                             "shortstr": "", "longstr": "", "table": {}, "timestamp": 0}


def method_frame(channel: int, cls: type[base.Frame], **values: Any) -> bytes:
    """Encode a method frame from its field values (missing ones take the type's zero value).

    pamqp's constructors and ``marshal`` validate names against the client-side rules of the spec
    (e.g. queue names limited to ``[a-zA-Z0-9-_.:]``), which RabbitMQ does not enforce and a server must
    not impose on names its clients chose, so fields are encoded here with pamqp's primitives instead.
    """
    parts: list[bytes] = [_INDEX.pack(cls.index)]
    bits = 0
    nbits = 0
    for name in cls.__slots__:
        kind = cls.amqp_type(name)
        value = values.get(name, _DEFAULTS.get(kind))
        if kind == "bit":
            if nbits == 8:
                parts.append(bytes([bits]))
                bits = nbits = 0
            if value:
                bits |= 1 << nbits
            nbits += 1
            continue
        if nbits:
            parts.append(bytes([bits]))
            bits = nbits = 0
        parts.append(encode.by_type(value, kind))
    if nbits:
        parts.append(bytes([bits]))
    return encode_frame(FRAME_METHOD, channel, b"".join(parts))


def encode_method(channel: int, method: base.Frame) -> bytes:
    """A method frame for a pamqp method object, complete with frame header and end octet."""
    return method_frame(channel, type(method), **{name: getattr(method, name) for name in method.__slots__})


def method_ids(method: base.Frame) -> tuple[int, int]:
    """(class id, method id) of a pamqp method, as a channel.close or connection.close reports them."""
    return method.index >> 16, method.index & 0xFFFF
