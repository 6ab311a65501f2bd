"""Numbers of the AMQP 0-9-1 wire format and RabbitMQ's reply codes (amqp-rabbitmq-0.9.1.json)."""

from __future__ import annotations

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
# AMQP 0-9 clients send this one; RabbitMQ serves them as 0-9-1.
PROTOCOL_HEADER_0_9 = b"AMQP\x01\x01\x00\x09"

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
# Not a wire type: what a FrameParser made with ``combine_publish`` returns for a basic.publish whose content
# header and single body frame followed it on the same channel in the same read, as one item whose payload is
# (method payload, header payload, body). protocol/frames.py says when it is made.
FRAME_PUBLISH = 0x100
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
# Frame header (type, channel, size) + frame-end octet.
FRAME_OVERHEAD = 8
# The limit on frames before tuning, and the smallest frame_max the broker itself may be configured with.
FRAME_MIN_SIZE = 4096 * 2
# The smallest frame_max a client may ask for in tune-ok: the spec's minimum, RabbitMQ 3.x's ?FRAME_MIN_SIZE
# (4.1 raised it to 8192, for large OAuth tokens in start-ok; that limit is FRAME_MIN_SIZE above, before tuning).
TUNE_FRAME_MIN = 4096

# Reply codes.
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_TEXTS = {
    REPLY_SUCCESS: "OK", CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE", NO_ROUTE: "NO_ROUTE",
    NO_CONSUMERS: "NO_CONSUMERS", CONNECTION_FORCED: "CONNECTION_FORCED", INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED", NOT_FOUND: "NOT_FOUND", RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED", FRAME_ERROR: "FRAME_ERROR", SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID", CHANNEL_ERROR: "CHANNEL_ERROR", UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR", NOT_ALLOWED: "NOT_ALLOWED", NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}
# Soft errors close the channel; every other error code closes the connection.
SOFT_ERRORS = frozenset({CONTENT_TOO_LARGE, NO_ROUTE, NO_CONSUMERS, ACCESS_REFUSED, NOT_FOUND,
                         RESOURCE_LOCKED, PRECONDITION_FAILED})

# Class ids.
CLASS_CONNECTION = 10
CLASS_CHANNEL = 20
CLASS_ACCESS = 30
CLASS_EXCHANGE = 40
CLASS_QUEUE = 50
CLASS_BASIC = 60
CLASS_CONFIRM = 85
CLASS_TX = 90

# Method ids of the basic class that the fast codec handles.
BASIC_QOS = 10
BASIC_CONSUME = 20
BASIC_CANCEL = 30
BASIC_PUBLISH = 40
BASIC_RETURN = 50
BASIC_DELIVER = 60
BASIC_GET = 70
BASIC_GET_OK = 71
BASIC_GET_EMPTY = 72
BASIC_ACK = 80
BASIC_REJECT = 90
BASIC_RECOVER_ASYNC = 100
BASIC_RECOVER = 110
BASIC_NACK = 120

# Method "index" = class_id << 16 | method_id, as pamqp numbers them.
def method_index(class_id: int, method_id: int) -> int:
    return (class_id << 16) | method_id


IDX_BASIC_PUBLISH = method_index(CLASS_BASIC, BASIC_PUBLISH)
IDX_BASIC_ACK = method_index(CLASS_BASIC, BASIC_ACK)
IDX_BASIC_NACK = method_index(CLASS_BASIC, BASIC_NACK)
IDX_BASIC_REJECT = method_index(CLASS_BASIC, BASIC_REJECT)
