"""Fleet state: several ``tokenfair gateway`` replicas sharing tenant state through Redis.

``model`` (what crosses the store boundary), ``scripts`` (the Lua scripts that are the only
writers of the Redis state), ``redis_store`` / ``local_store`` (the two implementations of
one store interface), ``client`` (healthy / degraded mode, journal and resync, heartbeats),
``gateway`` (the gateway whose dispatch asks the store), ``status`` (the fleet view).
"""
