//! Every target `weir bench --target NAME` takes, by name, as [`SCENARIOS`](crate::scenario::SCENARIOS)
//! lists the scenarios: the CLI offers, checks and describes what this list holds, so a new
//! target is its file and one entry here.

use std::path::PathBuf;

use anyhow::Context;
use weir_server::ConfigFile;
use weir_server::rls::{RulesConfig, SameDomain};

use super::{CellShape, RespCommand, RlsLoad};
use crate::run::TargetSpec;

/// What the command line said that a target may need; each target reads its part.
#[derive(Debug, Clone)]
pub struct TargetOptions {
    /// `--server`: one address or several, comma-separated (`None`: the target's default).
    pub server: Option<String>,
    /// The policies `--config` (or the embedded config) defines.
    pub config: ConfigFile,
    /// `--policy`: the policy every request names.
    pub policy: String,
    /// `--cell`: `BURST,COUNT,PERIOD`, CL.THROTTLE's numbers.
    pub cell: String,
    /// `--domain`: the RLS domain every request names.
    pub domain: String,
    /// `--descriptor`: RLS descriptors, one each.
    pub descriptors: Vec<String>,
    /// `--descriptors-file`: more descriptors, one per line.
    pub descriptors_file: Option<PathBuf>,
    /// `--rls-config`: the reference server's rules (the redis-rls target).
    pub rls_config: Option<PathBuf>,
}

/// A target as the command line names it.
#[derive(Debug, Clone, Copy)]
pub struct NamedTarget {
    /// Its `--target` name.
    pub name: &'static str,
    /// What it measures, in a line (the option's help).
    pub measures: &'static str,
    /// Builds what a run measures from the command line's options.
    pub spec: fn(&TargetOptions) -> anyhow::Result<TargetSpec>,
}

/// Every target, in the order the help lists them.
pub const TARGETS: &[NamedTarget] = &[
    NamedTarget {
        name: "inproc",
        measures: "the library in this process, on --config's policies",
        spec: |options| Ok(TargetSpec::InProcess(Box::new(options.config.clone()))),
    },
    NamedTarget {
        name: "http",
        measures: "servers' HTTP API",
        spec: |options| Ok(TargetSpec::Http(urls(options, "http://127.0.0.1:8080")?)),
    },
    NamedTarget {
        name: "grpc",
        measures: "servers' gRPC API, unary calls",
        spec: |options| Ok(TargetSpec::Grpc(urls(options, "http://127.0.0.1:50051")?)),
    },
    NamedTarget {
        name: "grpc-stream",
        measures: "servers' gRPC API, each client's requests over one stream",
        spec: |options| {
            Ok(TargetSpec::GrpcStream(urls(
                options,
                "http://127.0.0.1:50051",
            )?))
        },
    },
    NamedTarget {
        name: "redis",
        measures: "the baseline: --config's --policy as a Lua script in the Redis at --server",
        spec: |options| {
            let policy = options
                .config
                .policy
                .iter()
                .find(|policy| policy.name == options.policy)
                .with_context(|| format!("no policy {:?} in the config", options.policy))?;
            Ok(TargetSpec::Redis {
                url: redis_url(options),
                policy: Box::new(policy.clone()),
            })
        },
    },
    NamedTarget {
        name: "rls",
        measures: "Envoy's rate limit service: --domain and --descriptor",
        spec: |options| {
            Ok(TargetSpec::Rls {
                servers: urls(options, "http://127.0.0.1:50051")?,
                load: rls_load(options)?,
            })
        },
    },
    NamedTarget {
        name: "redis-rls",
        measures: "the reference rate limit server's Redis calls for the same descriptors, by --rls-config's rules",
        spec: |options| {
            let path = options
                .rls_config
                .as_ref()
                .context("--target redis-rls needs --rls-config (the rules it decides by)")?;
            // Read, not judged: a domain over several files is taken whole.
            let rules = RulesConfig::load(path, SameDomain::Merged).map_err(|errors| {
                let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
                anyhow::anyhow!("{}", list.join("\n"))
            })?;
            Ok(TargetSpec::RedisFixedWindow {
                url: redis_url(options),
                rules: Box::new(rules),
                load: rls_load(options)?,
            })
        },
    },
    NamedTarget {
        name: "resp",
        measures: "Weir's WEIR.ACQUIRE over the Redis protocol",
        spec: |options| {
            Ok(TargetSpec::Resp {
                url: redis_url(options),
                command: RespCommand::Acquire {
                    policy: options.policy.clone(),
                },
            })
        },
    },
    NamedTarget {
        name: "cl-throttle",
        measures: "CL.THROTTLE with --cell's numbers, to Weir or to a Redis with redis-cell",
        spec: |options| {
            Ok(TargetSpec::Resp {
                url: redis_url(options),
                command: RespCommand::Cell(CellShape::parse(&options.cell)?),
            })
        },
    },
    NamedTarget {
        name: "lua-cell",
        measures: "CL.THROTTLE's decision as a Lua script in a plain Redis",
        spec: |options| {
            Ok(TargetSpec::Resp {
                url: redis_url(options),
                command: RespCommand::LuaCell(CellShape::parse(&options.cell)?),
            })
        },
    },
];

/// What `--target name` measures, built from `options`.
pub fn spec(name: &str, options: &TargetOptions) -> anyhow::Result<TargetSpec> {
    let Some(target) = TARGETS.iter().find(|target| target.name == name) else {
        let names: Vec<&str> = TARGETS.iter().map(|target| target.name).collect();
        anyhow::bail!("--target must be one of {}, not {name:?}", names.join(", "));
    };
    (target.spec)(options)
}

/// `--server`'s addresses, or `default`; each a URL, since an HTTP or gRPC client is given one
/// (a bare address is told so before any request, rather than failing each one with the client
/// library's words).
fn urls(options: &TargetOptions, default: &str) -> anyhow::Result<Vec<String>> {
    let servers: Vec<String> = options
        .server
        .as_deref()
        .unwrap_or(default)
        .split(',')
        .map(|server| server.trim().to_owned())
        .filter(|server| !server.is_empty())
        .collect();
    for server in &servers {
        if !(server.starts_with("http://") || server.starts_with("https://")) {
            anyhow::bail!(
                "--server `{server}` has no scheme: give a URL, e.g. --server http://{server}"
            );
        }
    }
    Ok(servers)
}

/// `--server` as one Redis URL, or a local Redis's.
fn redis_url(options: &TargetOptions) -> String {
    options
        .server
        .clone()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned())
}

/// The RLS load: `--domain` and every descriptor, `--descriptor`'s then the file's.
fn rls_load(options: &TargetOptions) -> anyhow::Result<RlsLoad> {
    let mut descriptors = options.descriptors.clone();
    if let Some(file) = &options.descriptors_file {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        descriptors.extend(
            text.lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with('#'))
                .map(str::to_owned),
        );
    }
    RlsLoad::parse(&options.domain, &descriptors)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(server: Option<&str>) -> TargetOptions {
        TargetOptions {
            server: server.map(str::to_owned),
            config: weir_server::load_config(None, &weir_server::Overrides::default()).unwrap(),
            policy: "getpage".to_owned(),
            cell: "100,1000,1".to_owned(),
            domain: String::new(),
            descriptors: Vec::new(),
            descriptors_file: None,
            rls_config: None,
        }
    }

    #[test]
    fn every_name_is_taken_once() {
        let mut names: Vec<&str> = TARGETS.iter().map(|target| target.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "{names:?}");
    }

    #[test]
    fn a_target_is_built_by_its_name() {
        let http = spec("http", &options(Some("http://a:1, http://b:2"))).unwrap();
        assert_eq!(
            http,
            TargetSpec::Http(vec!["http://a:1".to_owned(), "http://b:2".to_owned()])
        );
        let cell = spec("cl-throttle", &options(None)).unwrap();
        assert!(
            matches!(&cell, TargetSpec::Resp { url, command: RespCommand::Cell(_) }
                if url == "redis://127.0.0.1:6379"),
            "{cell:?}"
        );
    }

    #[test]
    fn a_wrong_name_or_a_bare_address_is_told_what_is_wrong() {
        let error = spec("htp", &options(None)).unwrap_err().to_string();
        assert!(
            error.contains("not \"htp\"") && error.contains("grpc-stream"),
            "{error}"
        );
        let error = spec("grpc", &options(Some("127.0.0.1:50051")))
            .unwrap_err()
            .to_string();
        assert!(error.contains("has no scheme"), "{error}");
        let error = spec("redis-rls", &options(None)).unwrap_err().to_string();
        assert!(error.contains("needs --rls-config"), "{error}");
        let mut unknown = options(None);
        unknown.policy = "nope".to_owned();
        let error = spec("redis", &unknown).unwrap_err().to_string();
        assert!(error.contains("no policy \"nope\""), "{error}");
    }
}
