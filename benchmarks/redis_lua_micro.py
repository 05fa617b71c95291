"""Micro-benchmark: what one ``redis.call`` costs inside a Lua script on the embedded
redis-server (the figures behind docs/runtime.md's per-command costs).

    python benchmarks/redis_lua_micro.py

The server is first filled with 560,000 keys (``DEBUG POPULATE``), about what 100 k queries
leave in Redis; each script runs 1,000 calls of one command, 5 times, and the server's own
time per call (``INFO commandstats``) is printed per command, in microseconds.
"""

from __future__ import annotations

from knnmon.connection import connect
from knnmon.redis_server import EmbeddedRedis

SCRIPTS = {
    "EXISTS (call overhead)": "for i=1,1000 do redis.call('EXISTS','x') end",
    "XADD": "for i=1,1000 do redis.call('XADD','s','MAXLEN','~',1000000,'*','qid','q'..i,'entered','a b',"
            "'left','c','version',i) end",
    "ZADD new key": "for i=1,1000 do redis.call('ZADD','z'..ARGV[1]..i, 1.5, 'o1', 2.5, 'o2') end",
    "ZADD existing key": "for i=1,1000 do redis.call('ZADD','z'..ARGV[1]..i, 3.5, 'o3') end",
    "HSET new key": "for i=1,1000 do redis.call('HSET','h'..ARGV[1]..i,'lon','1.2345','lat','2.345','t','123456',"
                    "'keywords','a b c') end",
    "HINCRBY": "for i=1,1000 do redis.call('HINCRBY','h'..ARGV[1]..i,'refs',1) end",
}


def main() -> None:
    with EmbeddedRedis() as server:
        r = connect(server.url)
        r.execute_command("DEBUG", "POPULATE", 560_000)
        for name, src in SCRIPTS.items():
            script = r.register_script(src)
            r.config_resetstat()
            for j in range(5):
                script(args=[f"x{j}"])
            us = r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"] / 1000
            print(f"{name:24s} {us:.2f} us per call")


if __name__ == "__main__":
    main()
