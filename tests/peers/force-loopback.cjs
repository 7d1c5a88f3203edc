// Preload for Node servers that bind every interface (e.g. server-everything,
// whose Express app calls app.listen(PORT)):
//   node -r /path/to/tests/peers/force-loopback.cjs server.js ...
// Every TCP net.Server.listen() (http.Server inherits it) is forced onto
// 127.0.0.1, whatever host the program asked for (none, '::', '0.0.0.0', ...).
// Unix-socket paths and handles are left alone.
// With FORCE_LOOPBACK_READY=1 it also prints `READY <port>` on stdout once such
// a server is listening (useful with PORT=0, where the program cannot tell).
'use strict';
const net = require('node:net');

const HOST = '127.0.0.1';
const origListen = net.Server.prototype.listen;

function isPort(v) {
  return typeof v === 'number' || (typeof v === 'string' && /^\d+$/.test(v));
}

net.Server.prototype.listen = function forcedLoopbackListen(...args) {
  const cb = typeof args[args.length - 1] === 'function' ? args.pop() : undefined;
  const first = args[0];
  let opts;
  if (first === undefined || first === null) {
    opts = { port: 0, host: HOST }; // listen() / listen(cb): random port
  } else if (isPort(first)) {
    // listen(port[, host][, backlog])
    opts = { port: Number(first), host: HOST };
    const rest = args.slice(1);
    if (typeof rest[0] === 'string' || rest[0] === undefined || rest[0] === null) rest.shift();
    if (typeof rest[0] === 'number') opts.backlog = rest[0];
  } else if (typeof first === 'object' && !('path' in first) && !('fd' in first) && !('_handle' in first) && !('handle' in first)) {
    opts = { ...first, host: HOST }; // listen(options)
    if (opts.port === undefined) opts.port = 0;
  } else {
    // Unix socket path, handle or fd: not a TCP interface choice.
    return cb ? origListen.call(this, ...args, cb) : origListen.apply(this, args);
  }
  if (process.env.FORCE_LOOPBACK_READY) {
    this.once('listening', () => process.stdout.write(`READY ${this.address().port}\n`));
  }
  return cb ? origListen.call(this, opts, cb) : origListen.call(this, opts);
};
