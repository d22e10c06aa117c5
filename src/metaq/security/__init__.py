"""Who a connection is: SCRAM-SHA-256 (sans-IO), hashed credentials, principals (docs/security.md).

- :mod:`metaq.security.scram`: the SCRAM-SHA-256 exchange (RFC 5802 / RFC 7677) as two small state
  machines, bytes in and bytes out, no I/O; the client side runs in :mod:`metaq.net` connections, the
  server side in the broker's SASL handlers.
- :mod:`metaq.security.credentials`: stored credentials (salt, iterations, StoredKey, ServerKey: never a
  password) and the users file of an embedded broker.
- :mod:`metaq.security.principal`: principal names (``User:alice``), from SCRAM or a client certificate.

It sits below ``metaq.net`` and above ``metaq.protocol``; nothing here opens a socket.
"""
