"""Backends: the namespaces ``xp`` that ops compute with (``cpu``, ``tensor``) and the interface they share."""

from etl.backends.protocol import Array, Backend, KeyCounterProtocol, LookupTablesProtocol, ValueTableProtocol

__all__ = ["Array", "Backend", "KeyCounterProtocol", "LookupTablesProtocol", "ValueTableProtocol"]
