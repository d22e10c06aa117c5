"""The Kafka-protocol listener: a transport beside TCP and HTTP on the broker core (docs/kafka.md).

:mod:`.listener` (connections, ports), :mod:`.apis` (each Kafka API as core requests), :mod:`.errors`
(metaq's codes as Kafka's). The codec is in :mod:`metaq.protocol.kafka`.
"""
