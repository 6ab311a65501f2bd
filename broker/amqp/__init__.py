"""AMQP 0-9-1 connections and channels: the reader and its guards, the channel and its pure parts."""
