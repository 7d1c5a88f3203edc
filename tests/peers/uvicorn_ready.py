"""The HTTP peers' one way to serve: an ASGI app on 127.0.0.1 (port 0 picks a free one),
`READY <port>` printed once uvicorn serves it (the tests wait for that line)."""

from __future__ import annotations

import asyncio
import socket

import uvicorn


class ReadyServer(uvicorn.Server):
    """Prints `READY <port>` once uvicorn has started serving."""

    def __init__(self, config: uvicorn.Config, port: int) -> None:
        super().__init__(config)
        self.ready_port = port

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            print(f"READY {self.ready_port}", flush=True)


def serve(app, port: int, **config) -> None:
    """Serves `app` on 127.0.0.1:`port` until interrupted; `config`: more uvicorn.Config."""
    # Bound here, so that port 0 works and the port is known before uvicorn starts.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    bound = sock.getsockname()[1]
    conf = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False, **config)
    try:
        asyncio.run(ReadyServer(conf, bound).serve(sockets=[sock]))
    except KeyboardInterrupt:
        pass
