//! The alert router's inputs from people: label matchers (CLI, API) and the routing file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use multipilot_alerts::matcher::Matcher;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(m) = Matcher::parse(s) {
        // what parses prints back to the same matcher
        let again = Matcher::parse(&m.to_string()).expect("a printed matcher parses");
        assert_eq!(again, m);
    }
    if let Ok(r) = serde_yaml::from_str::<multipilot_alerts::Routing>(s) {
        let _ = r.validate();
    }
});
