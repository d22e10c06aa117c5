"""Replication: how a slave follows its master (docs/replication.md).

:mod:`.fetcher` copies one partition (the replica fetcher); :mod:`.slave` runs one per partition of the
master, creates the topics it learns of, and reports the lag. The network-free broker core only sees
:class:`metaq.broker.core.ReplicationView`; :class:`metaq.broker.service.BrokerService` starts this.
"""

from metaq.broker.replication.slave import SlaveReplicator

__all__ = ["SlaveReplicator"]
