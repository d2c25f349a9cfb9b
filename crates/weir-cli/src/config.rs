//! `weir config get|set|delete|revert`: a policy read or changed on a running server.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use weir_server::Client;

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigAction {
    /// Prints a policy (or every policy) as JSON.
    Get {
        /// The policy; none: every policy.
        name: Option<String>,
    },
    /// Creates or replaces a policy from a JSON or TOML file (`-` for standard input).
    Set {
        /// The policy.
        name: String,
        /// The policy's fields.
        file: PathBuf,
    },
    /// Deletes a policy.
    Delete {
        /// The policy.
        name: String,
    },
    /// Drops the changes made over the API to a policy: the config file's version runs again
    /// (or none, if the file has none).
    Revert {
        /// The policy.
        name: String,
    },
}

/// The policy `name` as `weir config set` reads it from `file`: one policy's fields (JSON or
/// TOML), or a config file's shape (`[[policy]]` tables), from which the one named `name` is
/// taken.
pub(crate) fn read_policy(name: &str, file: &PathBuf) -> anyhow::Result<serde_json::Value> {
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let value = match serde_json::from_str(&text) {
        Ok(json) => json,
        Err(_) => {
            let toml: toml::Value = toml::from_str(&text)
                .with_context(|| format!("{} is neither JSON nor TOML", file.display()))?;
            serde_json::to_value(toml)?
        }
    };
    policy_named(name, value).with_context(|| format!("in {}", file.display()))
}

/// `value` itself if it is one policy; the entry named `name` if it is a config file's shape.
pub(crate) fn policy_named(
    name: &str,
    value: serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let Some(policies) = value.get("policy").and_then(|p| p.as_array()) else {
        return Ok(value);
    };
    let names: Vec<&str> = policies
        .iter()
        .filter_map(|p| p.get("name").and_then(|n| n.as_str()))
        .collect();
    policies
        .iter()
        .find(|p| p.get("name").and_then(|n| n.as_str()) == Some(name))
        .cloned()
        .with_context(|| {
            format!(
                "no [[policy]] named {name:?} (the file has {})",
                if names.is_empty() {
                    "none with a name".to_owned()
                } else {
                    names.join(", ")
                }
            )
        })
}

pub(crate) async fn config(action: ConfigAction, client: Client) -> anyhow::Result<()> {
    let body = match action {
        ConfigAction::Get { name: Some(name) } => {
            let body = client.get(&format!("/v1/policies/{name}")).await?;
            // Where it comes from, beside the policy (standard output stays the policy's JSON,
            // for `config set`).
            let list = client.get("/v1/policies").await?;
            if let Some(listed) = list["policies"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["policy"]["name"] == name.as_str())
            {
                eprintln!("{}", source_line(&name, listed));
            }
            body
        }
        ConfigAction::Get { name: None } => client.get("/v1/policies").await?,
        ConfigAction::Set { name, file } => {
            client
                .put(&format!("/v1/policies/{name}"), &read_policy(&name, &file)?)
                .await?
        }
        ConfigAction::Delete { name } => client.delete(&format!("/v1/policies/{name}")).await?,
        ConfigAction::Revert { name } => {
            let body = client
                .delete(&format!("/v1/policies/{name}/override"))
                .await?;
            if body.is_null() {
                eprintln!(
                    "policy {name:?} reverted: the config file has none of that name, so none runs now"
                );
                return Ok(());
            }
            eprintln!("policy {name:?} reverted: the config file's version runs now");
            body
        }
    };
    println!("{}", serde_json::to_string_pretty(&body)?);
    Ok(())
}

/// Where policy `name` comes from, as `GET /v1/policies` lists it (`listed`), in a sentence.
fn source_line(name: &str, listed: &serde_json::Value) -> String {
    match (listed["source"].as_str(), listed["overrides_file"] == true) {
        (Some("api"), true) => format!(
            "source: api, in place of the config file's policy {name:?} (`weir config revert {name}` runs the file's again)"
        ),
        (Some(source), _) => format!("source: {source}"),
        (None, _) => "source: not said (a server older than this command)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_set_takes_one_policy_or_picks_it_from_a_config_file() {
        let one = serde_json::json!({"name": "p", "strict": {"qps": 5}});
        assert_eq!(policy_named("p", one.clone()).unwrap(), one);
        let file: toml::Value = toml::from_str(
            "[server]\nhttp = \"127.0.0.1:8080\"\n[[policy]]\nname = \"a\"\nstrict = { qps = 1 }\n[[policy]]\nname = \"p\"\nstrict = { qps = 5 }\n",
        )
        .unwrap();
        let file = serde_json::to_value(file).unwrap();
        assert_eq!(
            policy_named("p", file.clone()).unwrap(),
            serde_json::json!({"name": "p", "strict": {"qps": 5}})
        );
        let missing = policy_named("z", file).unwrap_err().to_string();
        assert_eq!(missing, "no [[policy]] named \"z\" (the file has a, p)");
    }
}
