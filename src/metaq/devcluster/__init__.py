"""A local dev cluster on loopback: a real ZooKeeper and N broker processes (``metaq cluster up``).

Product code for trying cluster mode on one machine (``metaq cluster up``, ``python -m metaq.demo
--brokers N``, ``metaq bench --brokers N``); the test harness (``metaq.testing``) builds on it, never
the reverse.

- :mod:`metaq.devcluster.zookeeper`: Debian's ZooKeeper on a free loopback port.
- :mod:`metaq.devcluster.broker`: a broker's server.ini in ZooKeeper mode; brokers detached from the terminal.
- :mod:`metaq.devcluster.cluster`: :class:`DevCluster`, ZooKeeper plus brokers ``1..N``, started and
  stopped in order.
"""

from metaq.devcluster.broker import DetachedBroker, cluster_server_ini
from metaq.devcluster.cluster import BrokerInfo, DevCluster, DevClusterError
from metaq.devcluster.zookeeper import ZooKeeperServer, ZooKeeperUnavailable

__all__ = ["BrokerInfo", "DetachedBroker", "DevCluster", "DevClusterError", "ZooKeeperServer", "ZooKeeperUnavailable",
           "cluster_server_ini"]
