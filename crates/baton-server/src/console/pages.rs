//! The page frame, the sign-in page and the trees list.

use baton::run::store::TreeMeta;
use maud::{DOCTYPE, Markup, html};

use super::auth::Session;

/// A short age: `42s`, `5m`, `3h`, `2d`.
pub(crate) fn age(now_ms: u64, then_ms: u64) -> String {
    let seconds = now_ms.saturating_sub(then_ms) / 1000;
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m", seconds / 60),
        3600..86_400 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    }
}

/// The status badge of a tree or process status name.
pub(crate) fn badge(status: &str, id: Option<&str>) -> Markup {
    html! {
        span.status.{"status-" (status)} id=[id] { (status.replace('_', " ")) }
    }
}

/// Every page: the header (with the session's scope and sign-out), the
/// skip link and the main region.
pub(crate) fn frame(title: &str, session: Option<&Session>, main: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="color-scheme" content="light dark";
                title { (title) " · Baton console" }
                link rel="stylesheet" href="/assets/console.css";
                script src="/assets/console.js" defer {}
            }
            body {
                a.skip href="#main" { "Skip to content" }
                header.top {
                    a.brand href="/" { "Baton" }
                    @if let Some(session) = session {
                        span.scope { "scope " code { (session.scope.as_str()) } }
                        form.inline method="post" action="/logout" {
                            input type="hidden" name="csrf" value=(session.csrf);
                            button.secondary type="submit" { "Sign out" }
                        }
                    }
                }
                main id="main" tabindex="-1" { (main) }
            }
        }
    }
}

/// The sign-in page: one labelled token field, its nonce, and a message.
pub(crate) fn login(nonce: &str, message: Option<&str>) -> Markup {
    frame(
        "Sign in",
        None,
        html! {
            h1 { "Sign in" }
            p { "Paste an API token of this host (a line of its tokens file). It is kept in an HttpOnly cookie and sees one scope." }
            @if let Some(message) = message {
                p.banner.error role="alert" id="login-error" { (message) }
            }
            form.card method="post" action="/login" {
                input type="hidden" name="csrf" value=(nonce);
                div.field {
                    label for="token" { "API token" }
                    input type="password" id="token" name="token" required minlength="16"
                        autocomplete="current-password" autofocus;
                }
                button type="submit" { "Sign in" }
            }
        },
    )
}

/// The list filters, as posted back in the query.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub(crate) struct ListFilters {
    /// `running`, `waiting`, `needs_attention` or `done`; empty for any.
    #[serde(default)]
    pub(crate) status: String,
    /// Only trees of this program (exact name); empty for any.
    #[serde(default)]
    pub(crate) program: String,
    /// Only trees whose id contains this text.
    #[serde(default)]
    pub(crate) q: String,
}

/// The order trees are listed in: needing attention, then waiting, then
/// running, then done; the most recently changed first within each.
pub(crate) fn rank(status: &str) -> u8 {
    match status {
        "needs_attention" => 0,
        "waiting" => 1,
        "running" => 2,
        _ => 3,
    }
}

const STATUSES: [&str; 4] = ["needs_attention", "waiting", "running", "done"];

/// The trees list.
pub(crate) fn trees(
    session: &Session,
    filters: &ListFilters,
    rows: &[TreeMeta],
    truncated: bool,
    now_ms: u64,
) -> Markup {
    frame(
        "Trees",
        Some(session),
        html! {
            h1 { "Trees" }
            form.filters role="search" method="get" action="/" {
                div.field {
                    label for="filter-status" { "Status" }
                    select id="filter-status" name="status" {
                        option value="" selected[filters.status.is_empty()] { "any" }
                        @for status in STATUSES {
                            option value=(status) selected[filters.status == status] { (status.replace('_', " ")) }
                        }
                    }
                }
                div.field {
                    label for="filter-program" { "Program" }
                    input type="text" id="filter-program" name="program" value=(filters.program) placeholder="demo.pause";
                }
                div.field {
                    label for="filter-q" { "Tree id" }
                    input type="search" id="filter-q" name="q" value=(filters.q) placeholder="p_…";
                }
                button type="submit" { "Filter" }
            }
            @if rows.is_empty() {
                p.empty id="no-trees" { "No trees in scope " code { (session.scope.as_str()) } " match." }
            } @else {
                table.trees id="trees" {
                    caption { (rows.len()) " trees, needing attention and waiting first" }
                    thead { tr { th scope="col" { "Tree" } th scope="col" { "Status" } th scope="col" { "Program" } th scope="col" { "Scope" } th scope="col" { "Age" } th scope="col" { "Updated" } } }
                    tbody {
                        @for meta in rows {
                            @let status = meta.status.as_str();
                            tr data-status=(status) {
                                td { a href={ "/trees/" (meta.tree) } { code { (meta.tree) } } }
                                td { (badge(status, None)) }
                                td { @if let Some(program) = &meta.program { (program.name.as_str()) } @else { "—" } }
                                td { (meta.scope.as_str()) }
                                td { @if let Some(created) = meta.created { (age(now_ms, created.millis())) } @else { "—" } }
                                td { (age(now_ms, meta.updated.millis())) " ago" }
                            }
                        }
                    }
                }
                @if truncated {
                    p.hint { "Only the first page of trees is shown; narrow the filters." }
                }
            }
        },
    )
}

/// A page that says one thing (a missing tree, a refused form).
pub(crate) fn message(session: Option<&Session>, title: &str, text: &str) -> Markup {
    frame(
        title,
        session,
        html! {
            h1 { (title) }
            p.banner.error role="alert" { (text) }
            p { a href="/" { "Back to the trees" } }
        },
    )
}

/// The embedded stylesheet.
pub(crate) const CSS: &str = include_str!("assets/console.css");

/// The embedded script.
pub(crate) const JS: &str = include_str!("assets/console.js");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_in_the_largest_whole_unit() {
        assert_eq!(age(61_000, 0), "1m");
        assert_eq!(age(5_000, 0), "5s");
        assert_eq!(age(0, 5_000), "0s");
        assert_eq!(age(7_200_000, 0), "2h");
        assert_eq!(age(3 * 86_400_000, 0), "3d");
    }

    #[test]
    fn trees_needing_attention_and_waiting_come_first() {
        let mut statuses = ["done", "running", "waiting", "needs_attention"];
        statuses.sort_by_key(|status| rank(status));
        assert_eq!(statuses, ["needs_attention", "waiting", "running", "done"]);
    }
}
