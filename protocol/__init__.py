"""AMQP 0-9-1 wire protocol, sans-IO: bytes in, frames out; values in, bytes out. No asyncio, no broker state."""
