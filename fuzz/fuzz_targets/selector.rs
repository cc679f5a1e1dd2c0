//! The console's label selector (`kubectl -l` syntax: `a=b,c!=d,e in (x,y),!f`): any text gives a selector
//! or an error, never a panic, and matching never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use multipilot_console::selector::Selector;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(sel) = Selector::parse(s) {
        let labels = [("app", "web"), ("tier", "front"), ("", "")];
        let _ = sel.matches(|k| labels.iter().find(|(n, _)| *n == k).map(|(_, v)| *v));
        let _ = sel.is_empty();
    }
});
