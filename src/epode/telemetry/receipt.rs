//! Judging Epode's answer to a batch: a receipt that accounts for it, a rejection (not
//! retried) or a failure worth retrying (408, 429, 5xx, with the `Retry-After` asked for).

use std::time::Duration;

use serde_json::Value;

use crate::epode::client::Answer;

/// A delivery's verdict, judged from the answer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Delivery {
    /// A 202 whose receipt accounts for the batch: Epode stored `accepted` events and dropped
    /// `dropped` (not retried: a dropped event is one Epode will not take).
    Receipt { accepted: u64, dropped: u64 },
    /// The status or the receipt says the batch is bad; not retried. `reported` is the
    /// receipt's counts when it has them but they do not account for the batch.
    Rejected {
        reason: String,
        reported: Option<(u64, u64)>,
    },
    Retryable {
        reason: String,
        retry_after: Option<Duration>,
    },
}

/// A receipt is a 202 with integer `accepted` + `dropped` that account for the batch.
pub(super) fn judge(answer: &Answer, batch_len: usize) -> Delivery {
    let rejected = |reason: String, reported| Delivery::Rejected { reason, reported };
    match answer.status {
        202 => {
            let receipt = answer.json().unwrap_or(Value::Null);
            let (Some(accepted), Some(dropped)) = (
                receipt.get("accepted").and_then(Value::as_u64),
                receipt.get("dropped").and_then(Value::as_u64),
            ) else {
                return rejected("malformed receipt".to_owned(), None);
            };
            let n = batch_len as u64;
            if accepted.checked_add(dropped) != Some(n) {
                // Counts each within the batch are shown as reported; others are garbage.
                let reported = (accepted <= n && dropped <= n).then_some((accepted, dropped));
                return rejected(format!(
                    "the receipt ({accepted} accepted, {dropped} dropped) does not account for the {batch_len} events sent"
                ), reported);
            }
            Delivery::Receipt { accepted, dropped }
        }
        s if crate::error::transient(s) => Delivery::Retryable {
            reason: format!("HTTP {}", answer.status),
            retry_after: answer
                .headers
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs),
        },
        s => rejected(format!("HTTP {s}"), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, body: &str) -> Answer {
        Answer {
            status,
            headers: Default::default(),
            body: bytes::Bytes::from(body.to_owned()),
        }
    }

    #[test]
    fn receipts_are_judged() {
        assert_eq!(
            judge(&answer(202, r#"{"accepted":3,"dropped":0}"#), 3),
            Delivery::Receipt {
                accepted: 3,
                dropped: 0
            }
        );
        // A partial receipt: the accepted events are delivered, only the dropped ones lost.
        assert_eq!(
            judge(&answer(202, r#"{"accepted":2,"dropped":1}"#), 3),
            Delivery::Receipt {
                accepted: 2,
                dropped: 1
            }
        );
        assert_eq!(
            judge(&answer(202, r#"{"accepted":2,"dropped":0}"#), 3),
            Delivery::Rejected {
                reason:
                    "the receipt (2 accepted, 0 dropped) does not account for the 3 events sent"
                        .into(),
                reported: Some((2, 0))
            }
        );
        assert!(matches!(
            judge(
                &answer(202, r#"{"accepted":18446744073709551615,"dropped":1}"#),
                3
            ),
            Delivery::Rejected { reported: None, .. }
        ));
        assert!(matches!(
            judge(&answer(202, "ok"), 3),
            Delivery::Rejected { .. }
        ));
        assert!(matches!(
            judge(&answer(202, r#"{"accepted":"3","dropped":0}"#), 3),
            Delivery::Rejected { .. }
        ));
        assert!(matches!(
            judge(&answer(200, r#"{"accepted":3,"dropped":0}"#), 3),
            Delivery::Rejected { .. }
        ));
        for s in [408, 429, 500, 503] {
            assert!(
                matches!(judge(&answer(s, ""), 3), Delivery::Retryable { .. }),
                "{s}"
            );
        }
        for s in [400, 401, 413] {
            assert!(
                matches!(judge(&answer(s, ""), 3), Delivery::Rejected { .. }),
                "{s}"
            );
        }
        let mut a = answer(429, "");
        a.headers
            .insert(reqwest::header::RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(
            judge(&a, 1),
            Delivery::Retryable {
                reason: "HTTP 429".into(),
                retry_after: Some(Duration::from_secs(2))
            }
        );
    }
}
