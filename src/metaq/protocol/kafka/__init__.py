"""Kafka's wire protocol, sans-IO: what metaq's Kafka listener (:mod:`metaq.kafka`) decodes and encodes.

- :mod:`.codec`: frames, request and response headers, the schemas of every API version served (kio's
  classes, generated from Kafka's own message specifications), and the table of what is served.
- :mod:`.records`: Kafka record batches (magic 2) to metaq record batches and back.
- :mod:`.consumer`: the consumer protocol's subscription and assignment bytes (JoinGroup/SyncGroup).
"""
