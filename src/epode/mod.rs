//! Talking to Epode: the API client, the Ask-once consent cache (a read-through view of what
//! Epode remembers) and the telemetry queue that delivers confirmed events in the background.

pub(crate) mod client;
pub(crate) mod consent;
pub(crate) mod telemetry;

#[cfg(test)]
mod protocol_tests {
    use sha2::{Digest, Sha256};

    const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/protocol/epode-v1");

    /// The vendored protocol files are the pinned commit's, unchanged: each file's SHA-256 is
    /// the one `PINNED` records for it at that commit (`git show <commit>:<path> | sha256sum`
    /// in Epode's repository), every JSON file here is listed, and the licence names the same
    /// commit.
    #[test]
    fn the_vendored_protocol_files_are_the_pinned_commits() {
        let pinned = std::fs::read_to_string(format!("{DIR}/PINNED")).unwrap();
        let commit = pinned
            .lines()
            .find_map(|l| l.strip_prefix("commit "))
            .expect("a commit line");
        assert_eq!(commit.len(), 40, "{commit}");
        let mut listed = Vec::new();
        for line in pinned
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with("commit "))
        {
            let [sum, there, here] = line.split(' ').collect::<Vec<_>>()[..] else {
                panic!("a line of PINNED: {line}");
            };
            assert!(there.starts_with("protocol/v1/"), "{line}");
            let bytes = std::fs::read(format!("{DIR}/{here}")).unwrap();
            let got = hex(&Sha256::digest(&bytes));
            assert_eq!(got, sum, "{here} differs from {there} at {commit}");
            listed.push(here.to_owned());
        }
        let mut json: Vec<String> = std::fs::read_dir(DIR)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".json"))
            .collect();
        json.sort();
        listed.sort();
        assert_eq!(json, listed, "every vendored file is pinned");
        let licence = std::fs::read_to_string(format!("{DIR}/LICENSE")).unwrap();
        assert!(
            licence.contains(&format!("commit {}", &commit[..7])),
            "LICENSE names {commit}"
        );
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
