"""A dead letter's provenance: the header the broker writes on every message of a dead-letter topic.

What it says and why a redrive trusts it (and nothing else of a dead letter): :mod:`metaq.broker.dead_letters`,
docs/consumers.md#dead-letters. Shared by the broker, which writes it, and the client's redrive, which reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

PROVENANCE: Final = "metaq-dlq-provenance"
"""The broker's header on every dead letter (see the module docstring)."""
H_TOPIC: Final = "dlq-original-topic"
H_PARTITION: Final = "dlq-original-partition"
H_OFFSET: Final = "dlq-original-offset"
H_MESSAGE_ID: Final = "dlq-original-message-id"
EXACT: Final = "exact"
UNVERIFIED: Final = "unverified"
ANONYMOUS: Final = "User:ANONYMOUS"


@dataclass(frozen=True, slots=True)
class Provenance:
    """What a :data:`PROVENANCE` header says."""

    writer: str
    topic: str
    partition: str
    offset: int
    copy: str
    may_produce: bool

    def header_value(self) -> bytes:
        return (f"v1;writer={self.writer};topic={self.topic};partition={self.partition};offset={self.offset};"
                f"copy={self.copy};may-produce={'yes' if self.may_produce else 'no'}").encode()

    @classmethod
    def parse(cls, value: bytes | str) -> Provenance | None:
        """The provenance of a header value; None when it is not one this version writes."""
        text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray, memoryview)) else value
        version, _, rest = text.partition(";")
        if version != "v1":
            return None
        fields = dict(part.partition("=")[::2] for part in rest.split(";"))
        try:
            return cls(fields["writer"], fields["topic"], fields["partition"], int(fields["offset"]), fields["copy"],
                       fields["may-produce"] == "yes")
        except (KeyError, ValueError):
            return None

    @property
    def redrivable(self) -> bool:
        """Whether a redrive may send it back to :attr:`topic` (see the module docstring)."""
        return self.copy == EXACT or self.may_produce
