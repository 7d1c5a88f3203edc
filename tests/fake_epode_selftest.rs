#[path = "support/fake_epode.rs"]
mod fake_epode;

use fake_epode::*;

#[test]
fn starts() {
    let fake = FakeEpode::start(FakeConfig::default());
    assert!(fake.url().starts_with("http://127.0.0.1:"));
}
