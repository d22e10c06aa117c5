"""The broker's transaction log (docs/transactions.md).

- :mod:`.format`: the records (kinds, keys, bodies; the layout drawn at its top) and the earlier form;
- :mod:`.replay`: reading a generation back into the live and finished transactions, and what damage cost;
- :mod:`.log`: :class:`TransactionLog`, the generation files: open, appends, checkpoints, verify.

The names below are the package's interface; the modules' other names are theirs.
"""

from metaq.storage.txlog.format import COMMITTED, HOW_CHARS_MAX, ROLLED_BACK
from metaq.storage.txlog.log import CHECKPOINT_BYTES, TransactionLog, list_generations
from metaq.storage.txlog.replay import TxPut, TxState

__all__ = ["CHECKPOINT_BYTES", "COMMITTED", "HOW_CHARS_MAX", "ROLLED_BACK", "TransactionLog", "TxPut", "TxState",
           "list_generations"]
