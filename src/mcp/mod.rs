//! JSON-RPC and MCP wire pieces: reading just enough of a message to route it and to echo its id.

pub mod message;
