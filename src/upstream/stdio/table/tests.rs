use super::*;

fn budget() -> Arc<MemoryBudget> {
    MemoryBudget::new(1 << 20)
}

fn msg(text: &str) -> RawMap {
    raw::parse_message(text.as_bytes()).unwrap()
}

struct Request {
    notes: mpsc::Receiver<Held>,
    done: oneshot::Receiver<Answer>,
}

fn wait(t: &mut Table, id: u64, client_id: &str, token: Option<&str>, answers: bool) -> Request {
    let (notes_tx, notes) = mpsc::channel(NOTES);
    let (done_tx, done) = oneshot::channel();
    t.insert(
        id,
        Waiting {
            generation: 1,
            seq: id,
            client_id: raw::raw(&serde_json::from_str::<serde_json::Value>(client_id).unwrap()),
            token: token.map(|t| raw::raw(&serde_json::from_str::<serde_json::Value>(t).unwrap())),
            answers,
            notes: notes_tx,
            done: Some(done_tx),
        },
    );
    Request { notes, done }
}

fn text(held: &Held) -> String {
    String::from_utf8(held.0.to_vec()).unwrap()
}

#[test]
fn responses_and_progress_reach_their_own_request_with_the_clients_ids() {
    let b = budget();
    let mut t = Table::default();
    let mut a = wait(&mut t, 1, r#""same""#, Some(r#""tok-a""#), false);
    let mut c = wait(&mut t, 2, r#""same""#, Some("7"), false);
    let progress = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":2,"progress":1}}"#;
    assert_eq!(t.route(1, msg(progress), &b), Routed::Delivered);
    let note = c.notes.try_recv().unwrap();
    assert!(
        text(&note).contains(r#""progressToken":7"#),
        "{}",
        text(&note)
    );
    assert!(a.notes.try_recv().is_err());
    assert_eq!(
        t.route(1, msg(r#"{"jsonrpc":"2.0","id":1,"result":{"x":1}}"#), &b),
        Routed::Delivered
    );
    let answer = a.done.try_recv().unwrap().unwrap();
    assert_eq!(
        text(&answer),
        r#"{"jsonrpc":"2.0","id":"same","result":{"x":1}}"#
    );
    assert_eq!(t.len(), 1);
    // A second answer to the same id finds nobody; so does one from an older child.
    assert!(matches!(
        t.route(1, msg(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#), &b),
        Routed::Dropped(_)
    ));
    assert!(matches!(
        t.route(0, msg(r#"{"jsonrpc":"2.0","id":2,"result":{}}"#), &b),
        Routed::Dropped(_)
    ));
    assert!(c.done.try_recv().is_err(), "still waiting");
}

#[test]
fn a_childs_exit_fails_what_it_was_sent() {
    let mut t = Table::default();
    let mut a = wait(&mut t, 1, "1", None, false);
    t.fail_generation(1, || Error::new(Kind::UpstreamFailed, "gone"));
    assert!(a.done.try_recv().unwrap().is_err());
    assert_eq!(t.len(), 0);
}

#[test]
fn server_requests_go_to_a_client_that_can_answer_and_come_back() {
    let b = budget();
    let mut t = Table::default();
    let mut modern = wait(&mut t, 1, "1", None, false);
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
    let mut legacy = wait(&mut t, 2, r#""l""#, None, true);
    assert_eq!(t.route(1, msg(ask), &b), Routed::Delivered);
    let sent = legacy.notes.try_recv().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&sent.0).unwrap();
    assert_eq!(v["method"], "sampling/createMessage");
    let asked_id = v["id"].as_str().unwrap().to_owned();
    assert!(modern.notes.try_recv().is_err());
    let reply = format!(r#"{{"jsonrpc":"2.0","id":"{asked_id}","result":{{"ok":true}}}}"#);
    let back = t.answer(1, msg(&reply)).unwrap();
    assert_eq!(
        &back[..],
        br#"{"jsonrpc":"2.0","id":5,"result":{"ok":true}}"#
    );
    assert!(t.answer(1, msg(&reply)).is_none(), "answered once");
    // ping is answered by the sidecar.
    let ping = t.route(1, msg(r#"{"jsonrpc":"2.0","id":"p","method":"ping"}"#), &b);
    assert_eq!(
        ping,
        Routed::Reply(Bytes::from(r#"{"jsonrpc":"2.0","id":"p","result":{}}"#))
    );
}

#[test]
fn listen_notifications_find_their_stream_by_subscription_id() {
    let b = budget();
    let mut t = Table::default();
    let mut listen = wait(&mut t, 3, r#""sub-1""#, None, false);
    let note = r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{"_meta":{"io.modelcontextprotocol/subscriptionId":3}}}"#;
    assert_eq!(t.route(1, msg(note), &b), Routed::Delivered);
    let got = listen.notes.try_recv().unwrap();
    assert!(text(&got).contains(r#""io.modelcontextprotocol/subscriptionId":"sub-1""#));
    let stray = r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}"#;
    assert!(matches!(t.route(1, msg(stray), &b), Routed::Dropped(_)));
}

#[test]
fn a_clients_cancel_names_the_child_id_only_when_unambiguous() {
    let mut t = Table::default();
    let _a = wait(&mut t, 1, "9", None, false);
    assert_eq!(t.child_id_of(&raw::raw(&9)), Some(1));
    let _b = wait(&mut t, 2, "9", None, false);
    assert_eq!(t.child_id_of(&raw::raw(&9)), None);
}

#[test]
fn a_full_client_stream_drops_notifications_never_the_response() {
    let b = budget();
    let mut t = Table::default();
    let mut r = wait(&mut t, 1, "1", Some("1"), false);
    let progress = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}"#;
    for _ in 0..NOTES {
        assert_eq!(t.route(1, msg(progress), &b), Routed::Delivered);
    }
    assert!(matches!(t.route(1, msg(progress), &b), Routed::Dropped(_)));
    assert_eq!(
        t.route(1, msg(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#), &b),
        Routed::Delivered
    );
    assert!(r.done.try_recv().unwrap().is_ok());
}
