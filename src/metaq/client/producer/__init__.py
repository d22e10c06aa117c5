"""The producer (docs/producer.md): ``Producer`` and what its sends return.

One job per module: ``producer`` the public API, ``placement`` which partition and the one place where a
message joins a batch, ``batches`` the batches and the accumulator, ``lanes`` the per-partition order rule,
``sender`` writing, ``outcomes`` what a batch's outcome does, ``results`` the result types, ``transactions``
the transaction facade.
"""

from metaq.client.producer.producer import Producer, SendCallback
from metaq.client.producer.results import BatchChunk, BatchSendResult, ManySendResult

__all__ = ["BatchChunk", "BatchSendResult", "ManySendResult", "Producer", "SendCallback"]
