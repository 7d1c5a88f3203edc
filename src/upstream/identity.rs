//! The server identity clients see (`serverInfo`): the upstream's own, as it last described
//! itself (a 2026 discovery's `_meta`, a 2025 handshake's `serverInfo`), with the configured
//! name and version over it. Shared by every worker; the `ResultPlan` puts it on results.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::config::Config;

/// The identity an upstream without one is shown under when the configuration names only
/// part of it.
fn placeholder() -> Value {
    json!({"name": "mcp-server", "version": "0"})
}

pub(crate) struct ServerIdentity {
    /// `EPODE_SIDECAR_SERVER_NAME` / `_VERSION`: forced over what the upstream says.
    name: Option<String>,
    version: Option<String>,
    /// The upstream's identity as last seen, and the one shown for it, made once each time
    /// it changes (every 2026 result's plan shares it: no copy per request).
    last_seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    upstream: Option<Value>,
    shown: Option<Arc<Value>>,
}

/// The identity to show, and whether it is forced over what results carry.
pub(crate) struct Shown {
    pub(crate) info: Option<Arc<Value>>,
    pub(crate) forced: bool,
}

impl ServerIdentity {
    pub(crate) fn new(config: &Config) -> Self {
        ServerIdentity {
            name: config.server_name.clone(),
            version: config.server_version.clone(),
            last_seen: Mutex::new(Seen::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.last_seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the upstream's identity when it gave one (an object).
    pub(crate) fn remember(&self, info: Option<&Value>) {
        if let Some(info) = info.filter(|i| i.is_object()) {
            let mut seen = self.lock();
            if seen.upstream.as_ref() != Some(info) {
                seen.shown = self.over(Some(info.clone()));
                seen.upstream = Some(info.clone());
            }
        }
    }

    fn forced(&self) -> bool {
        self.name.is_some() || self.version.is_some()
    }

    /// The identity clients see: `upstream` (or the one last seen), with the configured
    /// name/version over it.
    pub(crate) fn shown(&self, upstream: Option<Value>) -> Shown {
        let info = match upstream {
            Some(upstream) => self.over(Some(upstream)),
            None => {
                let mut seen = self.lock();
                if seen.shown.is_none() && self.forced() {
                    seen.shown = self.over(None);
                }
                seen.shown.clone()
            }
        };
        Shown {
            info,
            forced: self.forced(),
        }
    }

    /// `base` with the configured name and version over it.
    fn over(&self, base: Option<Value>) -> Option<Arc<Value>> {
        if !self.forced() {
            return base.map(Arc::new);
        }
        let mut info = base.filter(Value::is_object).unwrap_or_else(placeholder);
        if let Some(n) = &self.name {
            info["name"] = Value::from(n.as_str());
        }
        if let Some(v) = &self.version {
            info["version"] = Value::from(v.as_str());
        }
        Some(Arc::new(info))
    }

    /// The identity a 2025 client's `initialize` result carries (always one).
    pub(crate) fn for_initialize(&self, upstream: Option<Value>) -> Value {
        self.shown(upstream)
            .info
            .map_or_else(placeholder, |i| Value::clone(&i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(name: Option<&str>, version: Option<&str>) -> ServerIdentity {
        ServerIdentity {
            name: name.map(str::to_owned),
            version: version.map(str::to_owned),
            last_seen: Mutex::new(Seen::default()),
        }
    }

    #[test]
    fn the_configured_name_goes_over_the_upstreams() {
        let plain = identity(None, None);
        assert!(plain.shown(None).info.is_none());
        plain.remember(Some(&json!("not an object")));
        assert!(plain.shown(None).info.is_none());
        plain.remember(Some(&json!({"name": "up", "version": "1"})));
        let shown = plain.shown(None);
        assert_eq!(shown.info.unwrap()["name"], "up");
        assert!(!shown.forced);
        let named = identity(Some("mine"), None);
        named.remember(Some(&json!({"name": "up", "version": "1"})));
        let shown = named.shown(None);
        assert!(shown.forced);
        assert_eq!(
            *shown.info.unwrap(),
            json!({"name": "mine", "version": "1"})
        );
        // What is shown follows the upstream when it describes itself anew (the shown identity
        // is made once per change, not per request).
        plain.remember(Some(&json!({"name": "up", "version": "2"})));
        assert_eq!(plain.shown(None).info.unwrap()["version"], "2");
        named.remember(Some(&json!({"name": "up", "version": "2"})));
        assert_eq!(
            *named.shown(None).info.unwrap(),
            json!({"name": "mine", "version": "2"})
        );
        assert_eq!(
            identity(None, Some("2")).for_initialize(None),
            json!({"name": "mcp-server", "version": "2"})
        );
        assert_eq!(
            plain.for_initialize(Some(json!({"name": "x", "version": "9"})))["name"],
            "x"
        );
    }
}
