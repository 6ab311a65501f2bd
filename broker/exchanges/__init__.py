"""Exchanges: the base class, the built-in and stateful types, and the registry of types."""
