use std::net::SocketAddr;

use super::*;

fn budget() -> Arc<MemoryBudget> {
    MemoryBudget::new(1 << 20)
}

fn msg(text: &str) -> RawMap {
    raw::parse_message(text.as_bytes()).unwrap()
}

/// A client: with a bearer token, or none (then its connection's port tells it apart).
fn client(token: Option<&str>, port: u16) -> Caller {
    let mut h = http::HeaderMap::new();
    if let Some(t) = token {
        h.insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    let ip = std::net::IpAddr::from([127, 0, 0, 1]);
    Caller::decide(None, &h, ip, SocketAddr::new(ip, port))
}

struct Request {
    notes: mpsc::Receiver<Held>,
    done: oneshot::Receiver<Answer>,
}

fn wait_as(
    t: &mut RequestTable,
    key: Key,
    owner: Caller,
    client_id: &str,
    token: Option<&str>,
    relay: ServerRequests,
) -> Request {
    let (notes_tx, notes) = mpsc::channel(NOTES);
    let (done_tx, done) = oneshot::channel();
    t.insert(
        key,
        Waiting {
            generation: 1,
            seq: u64::try_from(key).unwrap(),
            owner,
            client_id: raw::raw(&serde_json::from_str::<serde_json::Value>(client_id).unwrap()),
            token: token.map(|t| raw::raw(&serde_json::from_str::<serde_json::Value>(t).unwrap())),
            relay,
            notes: notes_tx,
            done: Some(done_tx),
            asked: Vec::new(),
        },
    );
    Request { notes, done }
}

fn wait(
    t: &mut RequestTable,
    key: Key,
    client_id: &str,
    token: Option<&str>,
    relay: ServerRequests,
) -> Request {
    wait_as(t, key, client(None, 1), client_id, token, relay)
}

fn text(held: &Held) -> String {
    String::from_utf8(held.0.to_vec()).unwrap()
}

/// A message from the child naming key `k` as its id.
fn response(k: Key, result: &str) -> RawMap {
    msg(&format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{result}}}"#,
        key_json(k)
    ))
}

#[test]
fn keys_are_random_and_read_back_only_in_their_own_form() {
    let (a, b) = (fresh_key(), fresh_key());
    assert_ne!(a, b);
    assert_eq!(key_of(&key_raw(a)), Some(a));
    assert_eq!(key_json(1).len(), 34);
    for not_ours in [
        "1",
        r#""1""#,
        r#""ABCDEF0123456789ABCDEF0123456789""#,
        "null",
    ] {
        assert_eq!(
            key_of(&RawValue::from_string(not_ours.to_owned()).unwrap()),
            None,
            "{not_ours}"
        );
    }
}

#[test]
fn responses_and_progress_reach_their_own_request_with_the_clients_ids() {
    let b = budget();
    let mut t = RequestTable::default();
    let mut a = wait(
        &mut t,
        1,
        r#""same""#,
        Some(r#""tok-a""#),
        ServerRequests::Withheld,
    );
    let mut c = wait(&mut t, 2, r#""same""#, Some("7"), ServerRequests::Withheld);
    let progress = format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{},"progress":1}}}}"#,
        key_json(2)
    );
    assert_eq!(t.route(1, msg(&progress), &b), Routed::Delivered);
    let note = c.notes.try_recv().unwrap();
    assert!(
        text(&note).contains(r#""progressToken":7"#),
        "{}",
        text(&note)
    );
    assert!(a.notes.try_recv().is_err());
    assert_eq!(t.route(1, response(1, r#"{"x":1}"#), &b), Routed::Delivered);
    let answer = a.done.try_recv().unwrap().unwrap();
    assert_eq!(
        text(&answer),
        r#"{"jsonrpc":"2.0","id":"same","result":{"x":1}}"#
    );
    assert_eq!(t.len(), 1);
    // A second answer to the same id finds nobody; so does one from an older child, and one
    // naming a number (the sidecar's ids are never numbers).
    assert!(matches!(
        t.route(1, response(1, "{}"), &b),
        Routed::Dropped(_)
    ));
    assert!(matches!(
        t.route(0, response(2, "{}"), &b),
        Routed::Dropped(_)
    ));
    assert!(matches!(
        t.route(1, msg(r#"{"jsonrpc":"2.0","id":2,"result":{}}"#), &b),
        Routed::Dropped(_)
    ));
    assert!(c.done.try_recv().is_err(), "still waiting");
}

#[test]
fn a_childs_exit_fails_what_it_was_sent() {
    let mut t = RequestTable::default();
    let mut a = wait(&mut t, 1, "1", None, ServerRequests::Withheld);
    t.fail_generation(1, || Error::new(ErrorKind::UpstreamFailed, "gone"));
    assert!(a.done.try_recv().unwrap().is_err());
    assert_eq!(t.len(), 0);
}

#[test]
fn server_requests_go_to_the_one_client_that_can_answer_and_come_back_only_from_it() {
    let b = budget();
    let mut t = RequestTable::default();
    let mut modern = wait(&mut t, 1, "1", None, ServerRequests::Withheld);
    // Only a 2026 client waits: the child is told at once.
    let ask = r#"{"jsonrpc":"2.0","id":5,"method":"sampling/createMessage","params":{}}"#;
    match t.route(1, msg(ask), &b) {
        Routed::Reply(bytes) => {
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(v["id"], 5);
            assert_eq!(v["error"]["code"], -32603);
        }
        other => panic!("{other:?}"),
    }
    let alice = client(Some("alice"), 2);
    let mut legacy = wait_as(&mut t, 2, alice, r#""l""#, None, ServerRequests::Relayed);
    assert_eq!(t.route(1, msg(ask), &b), Routed::Delivered);
    let sent = legacy.notes.try_recv().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&sent.0).unwrap();
    assert_eq!(v["method"], "sampling/createMessage");
    let asked_id = v["id"].as_str().unwrap().to_owned();
    assert!(asked_id.len() > 40, "unguessable: {asked_id}");
    assert!(modern.notes.try_recv().is_err());
    let reply = format!(r#"{{"jsonrpc":"2.0","id":"{asked_id}","result":{{"ok":true}}}}"#);
    // Another client cannot answer it, even knowing the id; nor a client without credentials.
    for stranger in [client(Some("mallory"), 2), client(None, 2)] {
        assert!(matches!(
            t.answer(1, msg(&reply), &stranger),
            FromClient::Ignored(_)
        ));
    }
    // Its own client can, from any connection.
    let back = t.answer(1, msg(&reply), &client(Some("alice"), 9));
    assert_eq!(
        back,
        FromClient::Write(Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":5,"result":{"ok":true}}"#
        ))
    );
    assert!(
        matches!(t.answer(1, msg(&reply), &alice), FromClient::Ignored(_)),
        "answered once"
    );
    let guessed = r#"{"jsonrpc":"2.0","id":"epode-sidecar-srv-1","result":{}}"#;
    assert!(matches!(
        t.answer(1, msg(guessed), &alice),
        FromClient::Ignored(_)
    ));
    // ping is answered by the sidecar.
    let ping = t.route(1, msg(r#"{"jsonrpc":"2.0","id":"p","method":"ping"}"#), &b);
    assert_eq!(
        ping,
        Routed::Reply(Bytes::from(r#"{"jsonrpc":"2.0","id":"p","result":{}}"#))
    );
}

#[test]
fn a_server_request_is_asked_of_nobody_when_two_clients_could_have_caused_it() {
    let b = budget();
    let mut t = RequestTable::default();
    let mut a1 = wait_as(
        &mut t,
        1,
        client(Some("a"), 1),
        "1",
        None,
        ServerRequests::Relayed,
    );
    let mut a2 = wait_as(
        &mut t,
        2,
        client(Some("a"), 2),
        "2",
        None,
        ServerRequests::Relayed,
    );
    let ask = r#"{"jsonrpc":"2.0","id":5,"method":"elicitation/create","params":{}}"#;
    // Two requests of one client: the newest carries it.
    assert_eq!(t.route(1, msg(ask), &b), Routed::Delivered);
    assert!(a2.notes.try_recv().is_ok() && a1.notes.try_recv().is_err());
    // A second client's request is open too: nobody is asked, the child hears why.
    let mut other = wait_as(
        &mut t,
        3,
        client(None, 7),
        "3",
        None,
        ServerRequests::Relayed,
    );
    match t.route(1, msg(ask), &b) {
        Routed::Reply(bytes) => {
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            let m = v["error"]["message"].as_str().unwrap();
            assert!(
                m.contains("more than one client") && m.contains("per-client"),
                "{m}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(other.notes.try_recv().is_err() && a2.notes.try_recv().is_err());
}

#[test]
fn listen_notifications_find_their_stream_by_subscription_id() {
    let b = budget();
    let mut t = RequestTable::default();
    let mut listen = wait(&mut t, 3, r#""sub-1""#, None, ServerRequests::Withheld);
    let note = format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{{"_meta":{{"io.modelcontextprotocol/subscriptionId":{}}}}}}}"#,
        key_json(3)
    );
    assert_eq!(t.route(1, msg(&note), &b), Routed::Delivered);
    let got = listen.notes.try_recv().unwrap();
    assert!(text(&got).contains(r#""io.modelcontextprotocol/subscriptionId":"sub-1""#));
    let stray = r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}"#;
    assert!(matches!(t.route(1, msg(stray), &b), Routed::Dropped(_)));
}

#[test]
fn a_clients_cancel_reaches_only_its_own_request() {
    let mut t = RequestTable::default();
    let alice = client(Some("alice"), 1);
    let anon = client(None, 2);
    let _a = wait_as(&mut t, 1, alice, "9", None, ServerRequests::Withheld);
    let _b = wait_as(&mut t, 2, anon, "9", None, ServerRequests::Withheld);
    assert_eq!(t.cancel_target(&raw::raw(&9), &alice), Some(1));
    assert_eq!(
        t.cancel_target(&raw::raw(&9), &client(Some("alice"), 5)),
        Some(1),
        "the same credentials on another connection"
    );
    assert_eq!(t.cancel_target(&raw::raw(&9), &anon), Some(2));
    assert_eq!(
        t.cancel_target(&raw::raw(&9), &client(None, 3)),
        None,
        "no credentials, another connection"
    );
    assert_eq!(
        t.cancel_target(&raw::raw(&9), &client(Some("bob"), 1)),
        None
    );
    let _c = wait_as(&mut t, 3, alice, "9", None, ServerRequests::Withheld);
    assert_eq!(t.cancel_target(&raw::raw(&9), &alice), None, "ambiguous");
}

#[test]
fn a_full_client_stream_drops_notifications_never_the_response() {
    let b = budget();
    let mut t = RequestTable::default();
    let mut r = wait(&mut t, 1, "1", Some("1"), ServerRequests::Withheld);
    let progress = format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progressToken":{},"progress":1}}}}"#,
        key_json(1)
    );
    for _ in 0..NOTES {
        assert_eq!(t.route(1, msg(&progress), &b), Routed::Delivered);
    }
    assert!(matches!(t.route(1, msg(&progress), &b), Routed::Dropped(_)));
    assert_eq!(t.route(1, response(1, "{}"), &b), Routed::Delivered);
    assert!(r.done.try_recv().unwrap().is_ok());
}
