"""What broker and client share to talk to other nodes: server lists, retries, connections, pools, TLS.

The layer sits under ``metaq.broker`` and ``metaq.client`` and over ``metaq.protocol`` (whose sans-IO
codec its connections drive); it imports neither of the packages above it. docs/net.md describes it.

- :mod:`metaq.net.servers`: the one ``servers`` string parser (``host:port[,host:port]``) and its inverse;
- :mod:`metaq.net.retry`: the one retry policy (exponential backoff, jitter, a cap, attempts, a deadline);
- :mod:`metaq.net.codec`: what both connection kinds do with the codec (version agreement, error replies);
- :mod:`metaq.net.connection` and :mod:`metaq.net.pool`: the asyncio connection and its pool;
- :mod:`metaq.net.blocking`: the plain-socket connection and pool (Spark executors, scripts);
- :mod:`metaq.net.discovery`: which server answers as which broker id, and walking the servers;
- :mod:`metaq.net.tls`: the one place TLS contexts are built, client and server side (reloadable).

Nothing is imported here: ``import metaq.net.blocking`` must not pay for asyncio.
"""
