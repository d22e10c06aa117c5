"""The metaq broker: the asyncio server that owns the partitions' storage and serves the protocol.

Submodules are imported explicitly (``from metaq.broker.ini import load_config``); this package
imports nothing so that importing one part never drags in the others.
"""
