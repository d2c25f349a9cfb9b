//! `weir top`: the keys being held back, as a table that refreshes in place like top(1).

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::time::Duration;

use serde_json::Value;

use crate::client::Client;

/// What to show.
#[derive(Debug, Clone)]
pub struct TopOptions {
    /// Gather every node's rows (`scope=cluster`).
    pub cluster: bool,
    /// The sort column.
    pub sort: Option<String>,
    /// Only this policy.
    pub policy: Option<String>,
    /// Refresh every second until interrupted.
    pub watch: bool,
    /// At most this many rows.
    pub limit: usize,
}

fn number(value: &Value) -> String {
    match value.as_f64() {
        Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
        None => "-".to_owned(),
    }
}

/// `text` safe to print on an operator's terminal: keys and kinds come from clients, and a key
/// holding `ESC ] 0 ; … BEL` or `ESC [ 2 J` would retitle or clear the terminal, a newline
/// would break the table, and a bidirectional override would reorder what is shown. Each such
/// character is shown as its Rust escape (`\u{1b}`, `\n`); a backslash is doubled, so an escape
/// shown is never ambiguous with a key that spells one.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || bidi || c == '\\' {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// Renders rows as a plain table.
pub fn render(rows: &[Value]) -> String {
    let header = [
        "NODE",
        "POLICY",
        "KEY",
        "KIND",
        "LIMIT",
        "QPS",
        "IN_FLIGHT",
        "WAITERS",
    ];
    let cells: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            [
                printable(r["node_id"].as_str().unwrap_or("")),
                printable(r["policy"].as_str().unwrap_or("")),
                printable(r["key"].as_str().unwrap_or("")),
                printable(r["kind"].as_str().unwrap_or("")),
                number(&r["qps_limit"]),
                number(&r["current_qps"]),
                number(&r["in_flight"]),
                number(&r["waiters"]),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..8)
        .map(|i| {
            cells
                .iter()
                .map(|c| c[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let line = |out: &mut String, cols: &[&str]| {
        let row: Vec<String> = cols
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i >= 4 {
                    format!("{c:>w$}", w = widths[i])
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", row.join("  ").trim_end());
    };
    line(&mut out, &header);
    for row in &cells {
        let cols: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&mut out, &cols);
    }
    if cells.is_empty() {
        out.push_str("(no key is being held back)\n");
    }
    out
}

/// The members `/v1/cluster` lists, on one line: each with its state, how long a member not
/// alive has gone unseen, and whether it has no vote in the policy log.
pub fn render_members(view: &Value) -> String {
    let members = view["members"].as_array().cloned().unwrap_or_default();
    let each: Vec<String> = members
        .iter()
        .map(|m| {
            let mut text = format!(
                "{} {}",
                printable(m["id"].as_str().unwrap_or("?")),
                printable(m["state"].as_str().unwrap_or("?"))
            );
            if let Some(ms) = m["unseen_for_ms"].as_u64() {
                let _ = write!(text, " (unseen {} s)", ms / 1000);
            }
            if m["votes"] == Value::Bool(false) && view["policy_log"].is_object() {
                text.push_str(" (no vote)");
            }
            text
        })
        .collect();
    format!("members: {}\n", each.join(", "))
}

/// The query string for `options`, each value percent-encoded (a policy name may hold `&`).
fn throttles_query(options: &TopOptions) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("limit", &options.limit.to_string());
    if options.cluster {
        query.append_pair("scope", "cluster");
    }
    if let Some(sort) = &options.sort {
        query.append_pair("sort", sort);
    }
    if let Some(policy) = &options.policy {
        query.append_pair("policy", policy);
    }
    query.finish()
}

/// Runs `weir top` against `client`.
pub async fn run(client: &Client, options: &TopOptions) -> anyhow::Result<()> {
    let query = format!("/v1/throttles?{}", throttles_query(options));
    let tty = std::io::stdout().is_terminal();
    loop {
        let body = client.get(&query).await?;
        let rows = body["rows"].as_array().cloned().unwrap_or_default();
        let mut table = String::new();
        if options.cluster {
            // Who answers, and who the cluster is waiting for: a paused member has no rows.
            table.push_str(&render_members(&client.get("/v1/cluster").await?));
        }
        table.push_str(&render(&rows));
        let mut stdout = std::io::stdout();
        if options.watch && tty {
            // Clear the screen and home the cursor, then redraw.
            let _ = write!(stdout, "\x1b[2J\x1b[H");
        }
        let _ = write!(stdout, "{table}");
        let _ = stdout.flush();
        if !options.watch {
            return Ok(());
        }
        if !tty {
            let _ = writeln!(stdout);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn members_render_with_their_state_and_how_long_one_has_gone_unseen() {
        let view = json!({
            "policy_log": {},
            "members": [
                {"id": "n1", "state": "alive", "votes": true},
                {"id": "n2", "state": "leaving", "votes": false},
                {"id": "n3", "state": "suspect", "votes": true, "unseen_for_ms": 12_400},
            ]
        });
        assert_eq!(
            render_members(&view),
            "members: n1 alive, n2 leaving (no vote), n3 suspect (unseen 12 s)\n"
        );
    }

    #[test]
    fn rows_render_as_an_aligned_table() {
        let rows = vec![json!({
            "node_id": "local", "policy": "tables", "key": "orders", "kind": "scan",
            "qps_limit": 10.0, "current_qps": 42.25, "in_flight": 0, "waiters": 3
        })];
        let table = render(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0],
            "NODE   POLICY  KEY     KIND  LIMIT   QPS  IN_FLIGHT  WAITERS"
        );
        assert_eq!(
            lines[1],
            "local  tables  orders  scan     10  42.2          0        3"
        );
        assert!(render(&[]).contains("no key is being held back"));
    }

    #[test]
    fn the_query_encodes_what_it_is_given() {
        let options = TopOptions {
            cluster: true,
            sort: Some("key".into()),
            policy: Some("a&b=c d".into()),
            watch: false,
            limit: 5,
        };
        assert_eq!(
            throttles_query(&options),
            "limit=5&scope=cluster&sort=key&policy=a%26b%3Dc+d"
        );
    }

    #[test]
    fn client_supplied_text_cannot_drive_the_terminal() {
        let hostile = "a\u{1b}]0;owned\u{7}\u{1b}[2J\nb\u{9b}c\u{202e}d\\u{1b}";
        let rows = vec![json!({
            "node_id": "n", "policy": "p", "key": hostile, "kind": "k\r",
            "qps_limit": 1.0, "current_qps": 1.0, "in_flight": 0, "waiters": 0
        })];
        let table = render(&rows);
        assert_eq!(
            table.lines().count(),
            2,
            "one row stays one line: {table:?}"
        );
        assert!(
            !table.chars().any(|c| c.is_control() && c != '\n'),
            "{table:?}"
        );
        assert!(
            table.contains(r"a\u{1b}]0;owned\u{7}\u{1b}[2J\nb\u{9b}c\u{202e}d\\u{1b}"),
            "{table:?}"
        );
        assert!(table.contains(r"k\r"), "{table:?}");
    }
}
