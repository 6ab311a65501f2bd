"""AMQP errors as the broker raises them: the reply code decides whether the channel or the connection closes."""

from __future__ import annotations

from protocol.constants import REPLY_TEXTS, SOFT_ERRORS


class AMQPError(Exception):
    """An error to report to the client with ``channel.close`` (soft codes) or ``connection.close`` (hard).

    ``text`` is RabbitMQ's wording without the ``CODE_NAME -`` prefix; :attr:`reply_text` adds it.
    ``class_id``/``method_id`` name the failing method; left as None, the reader fills in the method of
    the frame being handled.
    """

    def __init__(self, reply_code: int, text: str, class_id: int | None = None, method_id: int | None = None
                 ) -> None:
        super().__init__(text)
        self.reply_code = reply_code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id

    @property
    def is_soft(self) -> bool:
        return self.reply_code in SOFT_ERRORS

    @property
    def reply_text(self) -> str:
        """``CODE_NAME - text``, cut as RabbitMQ cuts it to fit a short string: past 255 octets, the first
        252 and "..." (``rabbit_binary_generator:amqp_exception_explanation``), so a reader sees it was cut."""
        full = f"{REPLY_TEXTS.get(self.reply_code, 'ERROR')} - {self.text}"
        raw = full.encode()
        if len(raw) <= 255:
            return full
        return raw[:252].decode(errors="ignore") + "..."

