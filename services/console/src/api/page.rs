//! The web UI: the page and its assets, embedded at build time.

use super::*;

// The page

pub(super) const INDEX: &str = include_str!("../ui/index.html");
pub(super) const APP_JS: &str = include_str!("../ui/app.js");
pub(super) const STYLE: &str = include_str!("../ui/style.css");

pub(super) fn asset(body: &'static str, ctype: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, ctype),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

pub(super) async fn index() -> Response {
    asset(INDEX, "text/html; charset=utf-8")
}
pub(super) async fn app_js() -> Response {
    asset(APP_JS, "text/javascript; charset=utf-8")
}
pub(super) async fn style_css() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}
