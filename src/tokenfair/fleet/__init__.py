"""Fleet state: several ``tokenfair gateway`` replicas sharing tenant state through Redis.

``model`` (what crosses the store boundary), ``scripts`` (the Lua scripts that are the only
writers of the Redis state), ``redis_store`` / ``local_store`` (the two implementations of
one store interface), ``client`` (healthy / degraded mode, journal and resync, heartbeats),
``gateway`` (the gateway whose dispatch asks the store), ``status`` (the fleet view);
the slow path off the dispatch: ``sync_scripts`` / ``sync`` (the shared view read every
heartbeat, the fleet's shares of recent service), ``contract_sync`` (the live contract),
``door`` (the door's 429 and headers from the fleet's bucket), ``gateway_sync`` (the loop
that ties them to a gateway); ``bench`` / ``bench_latency``.
"""
