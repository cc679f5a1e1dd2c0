//! Subject token escaping: any name becomes one valid token of at most 200 bytes that unescapes to the name
//! (unless the escaped form was over 200 bytes and cut with a hash: that is one-way), and never contains a
//! wildcard or separator.
#![no_main]

use libfuzzer_sys::fuzz_target;
use multipilot_schemas::subject::{cluster_of, escape, is_valid_token, unescape};

fuzz_target!(|data: &[u8]| {
    let name = String::from_utf8_lossy(data);
    let t = escape(&name);
    assert!(is_valid_token(&t), "{t:?}");
    assert!(!t.contains(['.', '*', '>', ' ']));
    assert!(t.len() <= 200, "{} bytes", t.len());
    if !t.contains("~~") {
        assert_eq!(unescape(&t).as_deref(), Some(name.as_ref()));
        let s = multipilot_schemas::subject::heartbeat(&name);
        assert_eq!(cluster_of(&s).as_deref(), Some(name.as_ref()));
    }
    let _ = unescape(&name);
});
