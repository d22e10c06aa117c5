"""A local dev cluster on loopback: a real ZooKeeper and N broker processes (``metaq cluster up``).

Product code for trying cluster mode on one machine; the test harness (``metaq.testing``) builds on it.
"""
