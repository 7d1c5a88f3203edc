//! The customer-context tools' calls (`binding::CustomerContext` answers them): the client's
//! capabilities and a retry's answers read from the call, and, for a 2025 client whose
//! session declared elicitation, the permission question asked on its call's event stream as
//! a 2026 upstream's question is (the upstream's mirror), each retry answered here again.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Response};
use serde_json::{json, Value};

use crate::binding::CustomerContext;
use crate::body::Body;
use crate::error::Error;
use crate::frontdoor::Request;
use crate::mcp::era::Era;
use crate::mcp::method::Method;
use crate::mcp::version::META_CLIENT_CAPABILITIES;
use crate::upstream::{AsksAgain, Client, RequestContext, Upstream};

/// Answers one of the two tools, for a client of either era.
pub(super) async fn answer(
    customer: &Arc<CustomerContext>,
    upstream: &Upstream,
    req: &Request<'_>,
    client: &Client<'_>,
    ctx: RequestContext<'_>,
) -> Result<Response<Body>, Error> {
    let name = req.rpc.name().unwrap_or_default();
    let params: Value = req
        .rpc
        .params_raw
        .and_then(|p| serde_json::from_str(p.get()).ok())
        .unwrap_or_default();
    let args = params
        .get("arguments")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let (capabilities, legacy) = match req.era {
        Era::Modern => (
            params
                .get("_meta")
                .and_then(|m| m.get(META_CLIENT_CAPABILITIES))
                .cloned(),
            false,
        ),
        // A 2025 client is asked only on a stream, with its session's capabilities.
        Era::Legacy => (upstream.askable_legacy_client(client), true),
    };
    let responses = params.get("inputResponses");
    // With auth on, a handle placed in another caller's result is refused.
    let bound = req.principal.as_ref().map(|p| p.caller);
    let result = customer
        .call_tool(&name, &args, (capabilities.as_ref(), responses), bound)
        .await;
    if legacy && result.get("resultType").and_then(Value::as_str) == Some("input_required") {
        let again = Arc::new(AskedHere {
            customer: customer.clone(),
            capabilities,
            bound,
        });
        return upstream.ask_legacy_client(client, req.bytes, ctx, result, again);
    }
    Ok(ctx.local_result(result))
}

/// A 2025 client's retry of a customer-context tool, with the answers to its question.
struct AskedHere {
    customer: Arc<CustomerContext>,
    capabilities: Option<Value>,
    bound: Option<crate::caller::CallerKey>,
}

impl AsksAgain for AskedHere {
    fn call_again(
        self: Arc<Self>,
        _headers: HeaderMap,
        _caller: crate::upstream::Caller,
        _method: (String, Option<Method>),
        body: Bytes,
    ) -> Pin<Box<dyn Future<Output = Result<Value, Error>> + Send>> {
        Box::pin(async move {
            let call: Value = serde_json::from_slice(&body).unwrap_or_default();
            let params = &call["params"];
            let name = params["name"].as_str().unwrap_or_default();
            let args = params
                .get("arguments")
                .cloned()
                .unwrap_or_else(|| json!({}));
            let result = self
                .customer
                .call_tool(
                    name,
                    &args,
                    (self.capabilities.as_ref(), params.get("inputResponses")),
                    self.bound,
                )
                .await;
            Ok(json!({"jsonrpc": "2.0", "id": call["id"], "result": result}))
        })
    }
}
