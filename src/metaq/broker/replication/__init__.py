"""Replication: how a slave follows its master (docs/replication.md).

:mod:`.slave_config` reads a slave's ``async_slave.properties`` (plain data, which the network-free core
holds too); :mod:`.fetcher` copies one partition (the replica fetcher); :mod:`.slave` runs one per
partition of the master, creates the topics it learns of, and reports the lag; :mod:`.master` and
:mod:`.ha` are the master's side and the replica group's epochs. The network-free broker core only sees
:class:`metaq.broker.core.ReplicationView`; :class:`metaq.broker.service.BrokerService` starts this.
Nothing is imported here, so that the core importing :mod:`.slave_config` pulls in no networking.
"""
