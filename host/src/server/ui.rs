//! `/ui`: a static page that runs one prompt under two policies (one after
//! the other, through `/api/generate` with `options.trace_rounds`) and plots
//! draft length and accepted drafts per round for both.
use axum::response::Html;

pub const PAGE: &str = include_str!("ui.html");

pub async fn page() -> Html<&'static str> {
    Html(PAGE)
}
