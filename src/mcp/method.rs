//! The method catalogue: every MCP method the sidecar knows, each described once (its wire
//! name, the eras it exists in, the param its `Mcp-Name` mirrors, its cache hints, whether it
//! may answer `input_required`, whether its answer is a stream, how its result changes
//! between eras, who answers it, its metric label). Routing, the ladder, translation,
//! rewriting and the metrics read it; a method not listed is forwarded and labelled `other`.
//!
//! Adding a method is one entry in [`catalogue!`] below; its `answer` and `shape` name the
//! special code it needs, if any (a new variant there is matched where it is handled).
//! A lookup is one `match` on the wire name (string compares, no allocation, no hashing);
//! after it a [`Method`] is a `Copy` byte whose entry is an array index.

use crate::mcp::era::Era;

/// The eras a method exists in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Eras {
    pub(crate) legacy: bool,
    pub(crate) modern: bool,
}

impl Eras {
    pub(crate) const BOTH: Eras = Eras {
        legacy: true,
        modern: true,
    };
    /// 2025-11-25 only: 2026-07-28 removed it.
    pub(crate) const LEGACY: Eras = Eras {
        legacy: true,
        modern: false,
    };
    /// 2026-07-28 only: new in it.
    pub(crate) const MODERN: Eras = Eras {
        legacy: false,
        modern: true,
    };

    pub(crate) fn has(self, era: Era) -> bool {
        match era {
            Era::Legacy => self.legacy,
            Era::Modern => self.modern,
        }
    }
}

/// The param a named method's `Mcp-Name` header mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameParam {
    Name,
    Uri,
    /// The tasks extension's methods name their task (`io.modelcontextprotocol/tasks`,
    /// "Streamable HTTP: Routing Headers").
    TaskId,
}

impl NameParam {
    pub(crate) fn key(self) -> &'static str {
        match self {
            NameParam::Name => "name",
            NameParam::Uri => "uri",
            NameParam::TaskId => "taskId",
        }
    }
}

/// The cache hints a complete 2026-07-28 result must carry (top-level, not `_meta`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cache {
    /// None: the result is not cacheable.
    None,
    /// `ttlMs` and `cacheScope`, which the spec requires together.
    TtlAndScope,
}

/// How a method's result changes between the eras, beyond what every result gets (a 2026
/// client: `resultType`, cache hints, server identity; a 2025 client: those removed, and an
/// `input_required` result made an error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Nothing of its own.
    Common,
    /// A tool result: 2026 `structuredContent` may be any JSON; 2025 wants an object.
    ToolResult,
    /// A tool list: 2026 `outputSchema` may be any schema; 2025 wants an object one.
    ToolList,
    /// A notification: there is no result.
    NoResult,
}

/// Who answers a request for the method; each variant but `Upstream` is special code in the
/// method table (`dispatch/table.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The upstream, in its era, back in the client's.
    Upstream,
    /// The sidecar for a 2026 client: the upstream's discovery with the feedback rule.
    Discover,
    /// The sidecar for a 2025 client: per request, no session.
    Initialize,
    /// The sidecar when the upstream speaks 2026 (which has none), else the upstream.
    Ping,
    /// The sidecar when the upstream speaks 2026 (which removed it), else the upstream.
    SetLevel,
    /// The sidecar when the upstream speaks 2025 (which has none), else the upstream.
    Listen,
    /// The sidecar for a feedback tool; the upstream, with the binding's hook, otherwise.
    ToolCall,
    /// The upstream, with the feedback tools appended.
    ToolList,
}

/// One method's description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The JSON-RPC `method`, which is also its metric label (a bounded set: only listed
    /// methods become label values).
    pub(crate) wire: &'static str,
    pub(crate) eras: Eras,
    /// The param a 2026 request's `Mcp-Name` header mirrors.
    pub(crate) name: Option<NameParam>,
    pub(crate) cache: Cache,
    /// Whether a 2026 upstream may answer `resultType: input_required` (MRTR, SEP-2322).
    pub(crate) input_required: bool,
    /// Whether the answer is an open stream relayed as it comes, never read to an end.
    pub(crate) streams: bool,
    pub(crate) shape: Shape,
    pub(crate) answer: Answer,
}

/// What most methods are: in both eras, unnamed, uncached, plain results, forwarded.
const PLAIN: Entry = Entry {
    wire: "",
    eras: Eras::BOTH,
    name: None,
    cache: Cache::None,
    input_required: false,
    streams: false,
    shape: Shape::Common,
    answer: Answer::Upstream,
};

/// The catalogue: `Variant = "wire/name" { field: value, ... }`, the rest as [`PLAIN`].
macro_rules! catalogue {
    ($($variant:ident = $wire:literal { $($field:ident: $value:expr),* $(,)? }),* $(,)?) => {
        /// A method the sidecar knows.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Method {
            $($variant,)*
        }

        /// The entries, in [`Method`]'s order.
        static ENTRIES: &[Entry] = &[$(Entry { wire: $wire, $($field: $value,)* ..PLAIN },)*];

        impl Method {
            /// Every method, in the catalogue's order.
            #[cfg(test)]
            pub(crate) const ALL: &'static [Method] = &[$(Method::$variant,)*];

            /// The method of a wire name; `None` for one the sidecar does not know.
            pub(crate) fn from_wire(wire: &str) -> Option<Method> {
                match wire {
                    $($wire => Some(Method::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

catalogue! {
    Initialize = "initialize" { eras: Eras::LEGACY, answer: Answer::Initialize },
    Ping = "ping" { eras: Eras::LEGACY, answer: Answer::Ping },
    ServerDiscover = "server/discover" {
        eras: Eras::MODERN, cache: Cache::TtlAndScope, answer: Answer::Discover,
    },
    ToolsList = "tools/list" {
        cache: Cache::TtlAndScope, shape: Shape::ToolList, answer: Answer::ToolList,
    },
    ToolsCall = "tools/call" {
        name: Some(NameParam::Name), input_required: true, shape: Shape::ToolResult,
        answer: Answer::ToolCall,
    },
    PromptsList = "prompts/list" { cache: Cache::TtlAndScope },
    PromptsGet = "prompts/get" { name: Some(NameParam::Name), input_required: true },
    ResourcesList = "resources/list" { cache: Cache::TtlAndScope },
    ResourcesRead = "resources/read" {
        name: Some(NameParam::Uri), cache: Cache::TtlAndScope, input_required: true,
    },
    ResourcesTemplatesList = "resources/templates/list" { cache: Cache::TtlAndScope },
    ResourcesSubscribe = "resources/subscribe" { eras: Eras::LEGACY },
    ResourcesUnsubscribe = "resources/unsubscribe" { eras: Eras::LEGACY },
    CompletionComplete = "completion/complete" {},
    LoggingSetLevel = "logging/setLevel" { eras: Eras::LEGACY, answer: Answer::SetLevel },
    SubscriptionsListen = "subscriptions/listen" {
        eras: Eras::MODERN, streams: true, answer: Answer::Listen,
    },
    NotificationsInitialized = "notifications/initialized" {
        eras: Eras::LEGACY, shape: Shape::NoResult,
    },
    NotificationsCancelled = "notifications/cancelled" { shape: Shape::NoResult },
    NotificationsProgress = "notifications/progress" { shape: Shape::NoResult },
    NotificationsRootsListChanged = "notifications/roots/list_changed" {
        eras: Eras::LEGACY, shape: Shape::NoResult,
    },
    // 2025-11-25 core, a 2026-07-28 extension (`io.modelcontextprotocol/tasks`): in 2026 a
    // request names its task in `Mcp-Name`. Their results pass as the upstream wrote them.
    TasksGet = "tasks/get" { name: Some(NameParam::TaskId) },
    TasksUpdate = "tasks/update" { name: Some(NameParam::TaskId) },
    TasksCancel = "tasks/cancel" { name: Some(NameParam::TaskId) },
}

impl Method {
    pub(crate) fn entry(self) -> &'static Entry {
        &ENTRIES[self as usize]
    }

    pub(crate) fn wire(self) -> &'static str {
        self.entry().wire
    }

    /// Its metric label.
    pub(crate) fn label(self) -> &'static str {
        self.entry().wire
    }

    /// Whether 2026-07-28 removed it: a 2026 client asking for it gets 404 / -32601.
    pub(crate) fn removed_in_modern(self) -> bool {
        let eras = self.entry().eras;
        eras.has(Era::Legacy) && !eras.has(Era::Modern)
    }

    pub(crate) fn is_cacheable(self) -> bool {
        self.entry().cache != Cache::None
    }

    /// The key of the param its `Mcp-Name` header mirrors.
    pub(crate) fn name_key(self) -> Option<&'static str> {
        self.entry().name.map(NameParam::key)
    }
}

/// The metric label of a wire name: its own when the catalogue lists it, else `other` (any
/// client can invent method names; they must not become series).
/// The change notices a server sends when its lists or a resource changed: 2025 sends them on
/// a session's streams, 2026 only on `subscriptions/listen` streams, each opted into there
/// (`toolsListChanged`, `promptsListChanged`, `resourcesListChanged`, `resourceSubscriptions`).
pub(crate) const CHANGE_NOTICES: [&str; 4] = [
    "notifications/tools/list_changed",
    "notifications/prompts/list_changed",
    "notifications/resources/list_changed",
    "notifications/resources/updated",
];

/// Whether `method` is one of the [`CHANGE_NOTICES`].
pub(crate) fn is_change_notice(method: &str) -> bool {
    CHANGE_NOTICES.contains(&method)
}

/// A request's method as it travels below the front door: its wire name, and its catalogue
/// entry looked up once there (`None` for a method the catalogue does not list). Nothing
/// below parses the name again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Called<'a> {
    pub(crate) wire: &'a str,
    pub(crate) listed: Option<Method>,
}

impl Called<'static> {
    /// One of the catalogue's methods (the sidecar's own requests).
    pub(crate) fn of(method: Method) -> Called<'static> {
        Called {
            wire: method.wire(),
            listed: Some(method),
        }
    }
}

impl Called<'_> {
    /// Its metric label: the catalogue's, or `other`.
    pub(crate) fn label(self) -> &'static str {
        label(self.listed)
    }
}

pub(crate) fn label(method: Option<Method>) -> &'static str {
    method.map_or("other", Method::label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_entry_is_found_by_its_wire_name_and_labelled_uniquely() {
        assert_eq!(Method::ALL.len(), ENTRIES.len());
        let mut labels = HashSet::new();
        for (i, m) in Method::ALL.iter().enumerate() {
            assert_eq!(*m as usize, i);
            assert_eq!(Method::from_wire(m.wire()), Some(*m), "{}", m.wire());
            assert!(labels.insert(m.label()), "label {} twice", m.label());
            assert_ne!(m.label(), "other");
            assert!(
                m.entry().eras.legacy || m.entry().eras.modern,
                "{}",
                m.wire()
            );
        }
        assert_eq!(Method::from_wire("tools/lists"), None);
        assert_eq!(Method::from_wire(""), None);
        assert_eq!(label(Method::from_wire("x/y")), "other");
    }

    #[test]
    fn entries_agree_with_the_spec() {
        for m in Method::ALL {
            let e = m.entry();
            let notification = e.wire.starts_with("notifications/");
            assert_eq!(e.shape == Shape::NoResult, notification, "{}", e.wire);
            // 2026-07-28 §7: input_required only on tools/call, prompts/get, resources/read;
            // each of them is named.
            if e.input_required {
                assert!(e.name.is_some(), "{}", e.wire);
            }
            // A notification has no answer, so nothing to cache, name, or answer here.
            if notification {
                assert_eq!(e.cache, Cache::None);
                assert_eq!(e.name, None);
                assert_eq!(e.answer, Answer::Upstream);
                assert!(!e.input_required && !e.streams);
            }
            // Cache hints are 2026 fields: a method with them exists there.
            if e.cache != Cache::None {
                assert!(e.eras.modern, "{}", e.wire);
            }
        }
        let named: Vec<_> = Method::ALL
            .iter()
            .filter_map(|m| m.name_key().map(|k| (m.wire(), k)))
            .collect();
        assert_eq!(
            named,
            [
                ("tools/call", "name"),
                ("prompts/get", "name"),
                ("resources/read", "uri"),
                // The tasks extension's routing headers.
                ("tasks/get", "taskId"),
                ("tasks/update", "taskId"),
                ("tasks/cancel", "taskId")
            ]
        );
        let mrtr: Vec<_> = Method::ALL
            .iter()
            .filter(|m| m.entry().input_required)
            .map(|m| m.wire())
            .collect();
        assert_eq!(mrtr, ["tools/call", "prompts/get", "resources/read"]);
        let removed: Vec<_> = Method::ALL
            .iter()
            .filter(|m| m.removed_in_modern())
            .map(|m| m.wire())
            .collect();
        // 2026-07-28 §"Removed" (and `notifications/initialized`, which a stateless front
        // accepts and drops in either era).
        assert_eq!(
            removed,
            [
                "initialize",
                "ping",
                "resources/subscribe",
                "resources/unsubscribe",
                "logging/setLevel",
                "notifications/initialized",
                "notifications/roots/list_changed",
            ]
        );
        let cacheable: Vec<_> = Method::ALL
            .iter()
            .filter(|m| m.is_cacheable())
            .map(|m| m.wire())
            .collect();
        assert_eq!(
            cacheable,
            [
                "server/discover",
                "tools/list",
                "prompts/list",
                "resources/list",
                "resources/read",
                "resources/templates/list",
            ]
        );
        let streams: Vec<_> = Method::ALL
            .iter()
            .filter(|m| m.entry().streams)
            .map(|m| m.wire())
            .collect();
        assert_eq!(streams, ["subscriptions/listen"]);
    }
}
