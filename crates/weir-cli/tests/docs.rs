//! The docs, run: what `README.md` and `docs/configuration.md` show is read from the Markdown
//! itself and checked against a real `weir serve`, so editing a doc edits its test.
//!
//! - every `toml` block passes `weir check-config`, and each of its policies is applied with
//!   `weir config set` (a `PUT`);
//! - every rules file the Envoy guide shows (`yaml` blocks starting `domain:`, and
//!   `docs/envoy/ratelimit.yaml`) passes `weir check-config --rls-config`;
//! - every `curl` line of the README's first walk-through runs against a server on the
//!   embedded default config, and a line whose comment shows an answer (`{"admitted":true,...}
//!   200`) must print that answer's start and that status; the `weir` commands beside them run
//!   against the same server;
//! - every `weir bench` line of the README runs (for a second, scenarios once) and a `--json`
//!   run reports requests answered without errors;
//! - the command-line synopsis in `docs/configuration.md` names exactly the flags each command's
//!   `--help` lists, both ways;
//! - every `redis-cli` line of `docs/redis.md`'s walk-through runs against a server on the
//!   embedded default config with `--resp`, and prints what its comment shows;
//! - `docs/deployment.md`'s three nodes on one machine run as the block stands (moved to free
//!   ports), and print what its comments show;
//! - every measured figure the other docs quote (a percentage, a ratio like `1.36×`) is one
//!   `docs/benchmarks.md` reports, so a claim cannot drift from its measurement;
//! - every promise of `docs/guarantees.md` names a test that checks it (a test file, or test
//!   function, that exists) or the benchmark that measures it.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{Server, weir};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fenced blocks of `doc` whose info string is `lang`, each with the line it starts on.
fn blocks(doc: &str, lang: &str) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(repo().join(doc)).unwrap();
    let mut found = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        match (&mut current, line.trim_start().strip_prefix("```")) {
            (None, Some(info)) if info.trim() == lang => current = Some((n + 1, String::new())),
            (Some(_), Some(_)) => found.extend(current.take()),
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            _ => {}
        }
    }
    found
}

/// The commands of a shell block: continuation lines joined, each with its trailing comment.
fn commands(block: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in block.lines() {
        let (code, comment) = match line.find(" # ") {
            Some(at) => (&line[..at], line[at + 3..].trim()),
            None => (line, ""),
        };
        let code = code.trim_end();
        if let Some(head) = code.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(code.trim_start());
        out.push((std::mem::take(&mut pending), comment.to_owned()));
    }
    out
}

/// The docs' TLS examples name files under `/etc/weir/tls/`: made here (a CA, and a
/// certificate it signed with its key), and the block pointed at them, so that the check reads
/// real files as the server would.
fn with_test_certificates(block: &str, dir: &Path) -> String {
    const DOCUMENTED: &str = "/etc/weir/tls/";
    if !block.contains(DOCUMENTED) {
        return block.to_owned();
    }
    let tls = dir.join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    std::fs::write(tls.join("ca.crt"), ca.pem()).unwrap();
    std::fs::write(tls.join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(tls.join("tls.key"), key.serialize_pem()).unwrap();
    block.replace(DOCUMENTED, &format!("{}/", tls.display()))
}

#[test]
fn every_toml_block_in_the_docs_is_a_valid_config_that_the_api_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(weir_server::DEFAULT_CONFIG, &dir.path().join("data"));
    let mut checked = 0;
    for doc in ["README.md", "docs/configuration.md", "docs/envoy.md"] {
        for (line, block) in blocks(doc, "toml") {
            let block = with_test_certificates(&block, dir.path());
            let file = dir.path().join(format!("block-{checked}.toml"));
            std::fs::write(&file, &block).unwrap();
            // Paths in the docs' examples are the repository's.
            let output = weir()
                .arg("check-config")
                .arg(&file)
                .current_dir(repo())
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "{doc}:{line}: {}",
                String::from_utf8_lossy(&output.stdout)
            );
            let config: toml::Table = toml::from_str(&block).unwrap();
            let policies = config.get("policy").and_then(|p| p.as_array());
            for policy in policies.into_iter().flatten() {
                let name = policy["name"].as_str().unwrap();
                let output = weir()
                    .args(["config", "set", name])
                    .arg(&file)
                    .args(["--server", &server.http])
                    .output()
                    .unwrap();
                let stderr = String::from_utf8_lossy(&output.stderr);
                // The test's server has no Redis: a policy kept in Redis is refused, by name.
                if policy.get("scope").and_then(|s| s.as_str()) == Some("redis") {
                    assert!(
                        !output.status.success() && stderr.contains("no `[redis]`"),
                        "{doc}:{line}: config set {name}: {stderr}"
                    );
                    continue;
                }
                assert!(
                    output.status.success(),
                    "{doc}:{line}: config set {name}: {stderr}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 1, "no toml block found: the docs moved");
}

#[test]
fn every_rules_file_in_the_docs_loads() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("empty.toml");
    std::fs::write(&config, "").unwrap();
    let mut files: Vec<(String, PathBuf)> = vec![(
        "docs/envoy/ratelimit.yaml".to_owned(),
        repo().join("docs/envoy/ratelimit.yaml"),
    )];
    for (n, (line, block)) in blocks("docs/envoy.md", "yaml").into_iter().enumerate() {
        if block.starts_with("domain:") {
            let file = dir.path().join(format!("rules-{n}.yaml"));
            std::fs::write(&file, &block).unwrap();
            files.push((format!("docs/envoy.md:{line}"), file));
        }
    }
    assert!(files.len() >= 3, "the rules examples moved");
    for (place, file) in files {
        let output = weir()
            .arg("check-config")
            .arg(&config)
            .arg("--rls-config")
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{place}: {}",
            String::from_utf8_lossy(&output.stdout)
        );
    }
}

#[test]
fn the_readme_walk_through_prints_what_its_comments_say() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(weir_server::DEFAULT_CONFIG, &dir.path().join("data"));
    let address = server.http.trim_start_matches("http://").to_owned();
    let walk_through = blocks("README.md", "sh")
        .into_iter()
        .find(|(_, block)| block.contains("curl"))
        .expect("the README's walk-through");
    let mut ran = 0;
    for (command, comment) in commands(&walk_through.1) {
        let mut command = command
            .replace("localhost:8080", &address)
            .replace("cargo run --release --", env!("CARGO_BIN_EXE_weir"));
        if command.starts_with(env!("CARGO_BIN_EXE_weir")) {
            command.push_str(&format!(" --server {}", server.http));
        }
        let output = Command::new("sh").arg("-c").arg(&command).output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{command}: {stdout}");
        assert!(!stdout.trim().is_empty(), "{command} printed nothing");
        // A comment that shows an answer: `{json...} STATUS`.
        if let Some((json, status)) = comment
            .rsplit_once(' ')
            .filter(|(json, status)| json.starts_with('{') && status.parse::<u16>().is_ok())
        {
            let start = json.trim_end_matches("...}").trim_end_matches(",...}");
            let start = start.split("...").next().unwrap();
            let printed = stdout.trim_end();
            assert!(
                printed.starts_with(start) && printed.ends_with(&format!(" {status}")),
                "{command}\n  the README says: {comment}\n  it printed: {printed}"
            );
        }
        ran += 1;
    }
    assert!(
        ran >= 5,
        "the walk-through has fewer commands than it did: {ran}"
    );
}

/// The `--flags` in `text`.
fn flags(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("--") {
        let name: String = text[at + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '-')
            .collect();
        if !name.is_empty() && name != "help" && name != "version" {
            found.insert(format!("--{name}"));
        }
    }
    found
}

#[test]
fn the_documented_synopsis_and_help_name_the_same_flags() {
    let (_, synopsis) = blocks("docs/configuration.md", "")
        .into_iter()
        .find(|(_, block)| block.starts_with("weir serve"))
        .expect("the command-line synopsis in docs/configuration.md");
    // Each command's lines: a line starting with `weir` and the indented lines after it.
    let mut documented: Vec<(String, String)> = Vec::new();
    for line in synopsis.lines() {
        match line.strip_prefix("weir ") {
            Some(rest) => {
                let command: Vec<&str> = rest
                    .split_whitespace()
                    .take_while(|word| word.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
                    .collect();
                documented.push((command.join(" "), rest.to_owned()));
            }
            None => documented
                .last_mut()
                .expect("a command first")
                .1
                .push_str(line),
        }
    }
    let mut compared = 0;
    for (command, usage) in documented {
        // `config get [NAME] | set NAME FILE | delete NAME`: the flags are the subcommands'.
        let command = if command == "config get" {
            command
        } else {
            command.replace(" scenario rate-accuracy", " scenario")
        };
        let help = weir()
            .args(command.split_whitespace())
            .arg("--help")
            .output()
            .unwrap();
        assert!(help.status.success(), "weir {command} --help");
        let help = flags(&String::from_utf8_lossy(&help.stdout));
        assert_eq!(
            flags(&usage),
            help,
            "`weir {command}`: docs/configuration.md's synopsis and --help differ"
        );
        compared += 1;
    }
    assert!(compared >= 6, "the synopsis lost commands: {compared}");
}

#[test]
fn every_bench_example_in_the_readme_runs() {
    let dir = tempfile::tempdir().unwrap();
    let rules = repo().join("docs/envoy/ratelimit.yaml");
    let server = Server::start_full(
        weir_server::DEFAULT_CONFIG,
        &dir.path().join("data"),
        &[],
        &["--rls-config", &rules.display().to_string()],
    );
    let examples: Vec<String> = blocks("README.md", "sh")
        .into_iter()
        .flat_map(|(_, block)| commands(&block))
        .map(|(command, _)| command)
        .filter(|command| command.starts_with("cargo run --release -- bench"))
        .collect();
    assert!(examples.len() >= 5, "the README's bench examples moved");
    let runs: Vec<_> = examples
        .into_iter()
        .map(|example| {
            let mut args: Vec<String> = example
                .split_whitespace()
                .skip(4)
                .map(|arg| match arg {
                    "http://127.0.0.1:8080" => server.http.clone(),
                    "run.svg" => dir.path().join("run.svg").display().to_string(),
                    "10s" => "1s".to_owned(),
                    other => other.to_owned(),
                })
                .collect();
            if args.contains(&"scenario".to_owned()) {
                args.extend(
                    ["--duration", "1s", "--warmup", "0s", "--runs", "1"].map(String::from),
                );
            } else {
                if !args.contains(&"--duration".to_owned()) {
                    args.extend(["--duration", "1s"].map(String::from));
                }
                args.extend(["--warmup", "0s"].map(String::from));
                let on_grpc = ["grpc", "rls"]
                    .iter()
                    .any(|t| args.contains(&(*t).to_owned()));
                if on_grpc && !args.contains(&"--server".to_owned()) {
                    args.extend(["--server".to_owned(), server.grpc.clone()]);
                }
            }
            let child = weir()
                .args(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            (example, args, child)
        })
        .collect();
    for (example, args, child) in runs {
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{example}\n  ran as: weir {}\n  {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        if args.contains(&"--json".to_owned()) && !args.contains(&"scenario".to_owned()) {
            let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
            let answered =
                report["admitted"].as_u64().unwrap() + report["refused"].as_u64().unwrap();
            assert!(answered > 0 && report["errors"] == 0, "{example}: {report}");
        }
    }
    assert!(
        dir.path().join("run.svg").exists(),
        "the --plot example drew nothing"
    );
}

#[test]
fn the_redis_walk_through_prints_what_it_says() {
    let cli_here = Command::new("redis-cli")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !cli_here {
        assert!(
            std::env::var_os("WEIR_REQUIRE_REDIS").is_none(),
            "redis-cli is required here"
        );
        eprintln!("skipping: redis-cli is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_full(
        weir_server::DEFAULT_CONFIG,
        &dir.path().join("data"),
        &[],
        &["--resp", "127.0.0.1:0"],
    );
    let resp = server.resp.clone().expect("--resp was given");
    let (host, port) = resp.rsplit_once(':').unwrap();
    let (line, walk_through) = blocks("docs/redis.md", "sh")
        .into_iter()
        .find(|(_, block)| block.contains("redis-cli"))
        .expect("the Redis guide's walk-through");
    let mut ran = 0;
    for (command, comment) in commands(&walk_through) {
        let Some(args) = command.strip_prefix("redis-cli -p 6380 ") else {
            continue;
        };
        let output = Command::new("redis-cli")
            .args(["-h", host, "-p", port])
            .args(args.split_whitespace())
            .output()
            .unwrap();
        assert!(output.status.success(), "{command}: {output:?}");
        let printed = String::from_utf8_lossy(&output.stdout)
            .lines()
            .collect::<Vec<_>>()
            .join(" ");
        // A lease id is drawn: a comment shows an empty one where the reply has one.
        let printed = match printed.split_once(" lease ") {
            Some((head, tail)) if !tail.starts_with(' ') => {
                let rest = tail.split_once(' ').map_or("", |(_, rest)| rest);
                format!("{head} lease  {rest}")
            }
            _ => printed,
        };
        assert_eq!(
            printed.trim(),
            comment,
            "docs/redis.md (block at line {line}): {command}"
        );
        ran += 1;
    }
    assert!(
        ran >= 8,
        "the walk-through has fewer commands than it did: {ran}"
    );
}

/// The table of `weir serve`'s environment variables in docs/configuration.md names the flag
/// each stands for, as `weir serve --help` does: neither can gain or lose one alone.
#[test]
fn the_documented_environment_variables_are_the_ones_serve_reads() {
    let doc = std::fs::read_to_string(repo().join("docs/configuration.md")).unwrap();
    let documented: BTreeSet<(String, String)> = doc
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let flag = cells.get(1)?.strip_prefix("`--")?.strip_suffix('`')?;
            let variable = cells.get(2)?.strip_prefix("`WEIR_")?;
            let variable = variable.split('`').next()?;
            Some((format!("--{flag}"), format!("WEIR_{variable}")))
        })
        .collect();
    let help = weir().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    // clap writes each flag, its text, then `[env: NAME=]` on the flag's last line.
    let mut from_help = BTreeSet::new();
    let mut flag = None;
    for line in help.lines() {
        if let Some(name) = line.trim_start().strip_prefix("--") {
            flag = name.split([' ', '<']).next().map(|f| format!("--{f}"));
        }
        if let (Some(at), Some(flag)) = (line.find("[env: "), &flag) {
            let name = line[at + 6..].split('=').next().unwrap().to_owned();
            from_help.insert((flag.clone(), name));
        }
    }
    assert!(from_help.len() >= 11, "{help}");
    assert_eq!(documented, from_help);
}

/// A port free for TCP and UDP alike on loopback now (the gossip address is UDP), other than
/// those in `taken`.
fn free_port(taken: &BTreeSet<u16>) -> u16 {
    loop {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = tcp.local_addr().unwrap().port();
        if !taken.contains(&port) && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

#[test]
fn the_three_node_walk_through_prints_what_its_comments_say() {
    if std::process::Command::new("jq")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("WEIR_REQUIRE_CURL").is_none(),
            "jq is required here"
        );
        eprintln!("skipping: jq is not installed");
        return;
    }
    let (line, block) = blocks("docs/deployment.md", "sh")
        .into_iter()
        .find(|(_, block)| block.contains("--node-id a"))
        .expect("the three-node walk-through in docs/deployment.md");
    // Every address the block names, moved to a free port of its own.
    let mut documented = BTreeSet::new();
    for piece in block.split("127.0.0.1:").skip(1) {
        let digits: String = piece.chars().take_while(char::is_ascii_digit).collect();
        documented.insert(digits.parse::<u16>().unwrap());
    }
    assert!(documented.len() >= 9, "{documented:?}");
    let mut script = block.clone();
    let mut taken = BTreeSet::new();
    for port in &documented {
        let free = free_port(&taken);
        taken.insert(free);
        script = script.replace(&format!("127.0.0.1:{port}"), &format!("127.0.0.1:{free}"));
    }
    let dir = tempfile::tempdir().unwrap();
    let binaries = Path::new(env!("CARGO_BIN_EXE_weir")).parent().unwrap();
    let path = format!(
        "{}:{}",
        binaries.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new("timeout");
    command
        .args(["120", "bash", "-e", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("WEIR_") {
            command.env_remove(name);
        }
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "docs/deployment.md:{line}: {output:?}"
    );
    let mut checked = 0;
    for (command, comment) in commands(&block) {
        if comment.is_empty() {
            continue;
        }
        assert!(
            stdout.contains(&comment),
            "docs/deployment.md:{line}: `{command}` should print `{comment}`; the block printed:\n{stdout}"
        );
        checked += 1;
    }
    assert!(
        checked >= 2,
        "the walk-through shows fewer answers than it did"
    );
}

/// The counters the docs name for `GET /v1/cluster` are the ones a node answers with, and the
/// migration guide's claim that RLS counts are handed over names one of them: a counter renamed
/// or dropped in the code fails here, not in an operator's dashboard.
#[tokio::test]
async fn the_documented_cluster_counters_are_the_ones_a_node_reports() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(weir_server::DEFAULT_CONFIG, &dir.path().join("data"));
    let live: serde_json::Value = reqwest::get(server.url("/v1/cluster"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let live = live["counters"]
        .as_object()
        .expect("counters in /v1/cluster");
    let text = std::fs::read_to_string(repo().join("docs/configuration.md")).unwrap();
    let row = text
        .lines()
        .find(|line| line.starts_with("| `GET /v1/cluster`"))
        .expect("the /v1/cluster row of the API table");
    let listed = row
        .split("counters: {")
        .nth(1)
        .and_then(|rest| rest.split('}').next())
        .expect("the counters the row lists");
    let documented: BTreeSet<&str> = listed.split(',').map(str::trim).collect();
    let answered: BTreeSet<&str> = live.keys().map(String::as_str).collect();
    assert_eq!(
        documented, answered,
        "docs/configuration.md against a live node"
    );
    let envoy = std::fs::read_to_string(repo().join("docs/envoy.md")).unwrap();
    let named = "rate_buckets_handed_over";
    assert!(envoy.contains(named) && answered.contains(named), "{named}");
}

/// The measured figures of `line`: percentages (`26 %`, `2.8–3.5 %`) and ratios written against
/// their number (`1.36×`, `0.42–0.48×`); `50 × seconds`, a product, is not one. Ranges are
/// written with a hyphen.
fn figures(line: &str) -> Vec<String> {
    let chars: Vec<char> = line.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts = chars[i].is_ascii_digit()
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || matches!(chars[i - 1], '.' | '_')));
        if !starts {
            i += 1;
            continue;
        }
        let number = |from: usize| {
            let mut end = from;
            while end < chars.len() && (chars[end].is_ascii_digit() || chars[end] == '.') {
                end += 1;
            }
            end
        };
        let mut end = number(i);
        if end + 1 < chars.len()
            && matches!(chars[end], '–' | '-')
            && chars[end + 1].is_ascii_digit()
        {
            end = number(end + 1);
        }
        let figure: String = chars[i..end].iter().collect::<String>().replace('–', "-");
        match (chars.get(end), chars.get(end + 1)) {
            (Some('%'), _) | (Some(' '), Some('%')) => found.push(format!("{figure} %")),
            (Some('×'), _) => found.push(format!("{figure}×")),
            _ => {}
        }
        i = end.max(i + 1);
    }
    found
}

#[test]
fn figures_are_told_from_products() {
    assert_eq!(
        figures(
            "cost 26 % at 1M keys, 1.36× slower, 2.8–3.5 % over; within `10 + 50 × seconds`, 3%"
        ),
        ["26 %", "1.36×", "2.8-3.5 %", "3 %"]
    );
}

#[test]
fn every_figure_the_docs_quote_is_one_the_benchmarks_report() {
    let bench = std::fs::read_to_string(repo().join("docs/benchmarks.md")).unwrap();
    let reported: BTreeSet<String> = bench.lines().flat_map(figures).collect();
    let mut docs = vec![repo().join("README.md")];
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") && !path.ends_with("benchmarks.md") {
            docs.push(path);
        }
    }
    let mut unreported = Vec::new();
    for doc in docs {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (n, line) in text.lines().enumerate() {
            for figure in figures(line) {
                if !reported.contains(&figure) {
                    let name = doc.file_name().unwrap().to_string_lossy().into_owned();
                    unreported.push(format!("{name}:{}: {figure}", n + 1));
                }
            }
        }
    }
    assert!(
        unreported.is_empty(),
        "figures docs/benchmarks.md does not report:\n{}",
        unreported.join("\n")
    );
}

/// Every file under `dir` (recursively), by file name, with its text.
fn sources(dir: &Path, found: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if !path.ends_with("target") {
                sources(&path, found);
            }
        } else if path
            .extension()
            .is_some_and(|e| e == "rs" || e == "py" || e == "sh")
        {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            found.push((name, std::fs::read_to_string(&path).unwrap_or_default()));
        }
    }
}

#[test]
fn every_guarantee_names_the_test_that_checks_it() {
    let text = std::fs::read_to_string(repo().join("docs/guarantees.md")).unwrap();
    let mut files = Vec::new();
    sources(&repo().join("crates"), &mut files);
    sources(&repo().join("bench"), &mut files);
    // A test named in a promise: a test file, `file.rs`, or a test function, `a_test_name`
    // (in backquotes, with at least two underscores: a sentence's words, not a setting).
    let names_a_test = |promise: &str| {
        promise.split('`').skip(1).step_by(2).any(|quoted| {
            let file = quoted.rsplit('/').next().unwrap_or(quoted);
            let is_file = [".rs", ".py", ".sh"].iter().any(|e| file.ends_with(e))
                && files.iter().any(|(name, _)| name == file);
            let is_function = quoted.matches('_').count() >= 2
                && quoted
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
                && files
                    .iter()
                    .any(|(_, code)| code.contains(&format!("fn {quoted}(")));
            let is_bench = quoted.starts_with("weir bench") || quoted.starts_with("cargo bench");
            is_file || is_function || is_bench
        })
    };
    let mut promises = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line.starts_with("- **") || line.starts_with('#') || line.trim().is_empty() {
            promises.extend(current.take());
        }
        if line.starts_with("- **") {
            current = Some(line.to_owned());
        } else if let Some(promise) = current.as_mut() {
            promise.push(' ');
            promise.push_str(line.trim());
        }
    }
    promises.extend(current);
    assert!(promises.len() >= 30, "{} promises", promises.len());
    let unchecked: Vec<String> = promises
        .iter()
        .filter(|promise| !names_a_test(promise))
        .map(|promise| promise.chars().take(80).collect())
        .collect();
    assert!(
        unchecked.is_empty(),
        "promises of docs/guarantees.md that name no test:\n{}",
        unchecked.join("\n")
    );
}
