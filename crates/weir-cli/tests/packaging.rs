//! The deployment files in `deploy/`, held to the binary they deploy, so neither can drift:
//!
//! - every `WEIR_*` variable the Dockerfile, the systemd unit (and its env file), the Kubernetes
//!   manifests and docs/deployment.md name is one `weir serve --help` lists, or one of the two
//!   secrets; every `--flag` of their `weir serve` command lines is one it lists;
//! - the manifests parse as YAML and hang together: probes on `/readyz` and `/healthz` at the
//!   HTTP port, container ports equal to the ports in the addresses the environment gives,
//!   Services aimed at ports the container has, the pod's IP behind the advertised gossip and
//!   gRPC addresses, one join seed per replica by the headless Service's names, the config
//!   mounted as a directory from the ConfigMap (so its `..data` swap is seen), the data dir on
//!   the claim, secrets from the Secret, a grace period covering the drain;
//! - the ConfigMap's weir.toml passes `weir check-config`; the example Secret's placeholders are
//!   ones the server refuses;
//! - the Dockerfile builds `-p weir-cli`, runs as a user that is not root, keeps the data dir
//!   as a VOLUME, exposes the ports it configures and checks `/healthz`;
//! - `systemd-analyze verify` accepts the unit, and `systemd-analyze security` rates it well
//!   sandboxed (skipped, saying so, where systemd-analyze is missing).

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::weir;
use yaml_rust2::{Yaml, YamlLoader};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

const SECRETS: [&str; 2] = ["WEIR_ADMIN_TOKEN", "WEIR_CLUSTER_SECRET"];

/// Secrets `weir serve` reads that a deployment may leave out: the data token guards the data
/// plane only where the operator wants it (and the Redis port beyond loopback).
const OPTIONAL_SECRETS: [&str; 1] = ["WEIR_DATA_TOKEN"];

/// The files that name `WEIR_*` variables for an operator to set.
const DEPLOYMENT_FILES: [&str; 9] = [
    "deploy/Dockerfile",
    "deploy/systemd/weir.service",
    "deploy/systemd/weir.env.example",
    "deploy/kubernetes/configmap.yaml",
    "deploy/kubernetes/secret.example.yaml",
    "deploy/kubernetes/services.yaml",
    "deploy/kubernetes/statefulset.yaml",
    "deploy/kubernetes/pdb.yaml",
    "docs/deployment.md",
];

/// `weir serve --help`: its `--flags` and the variables of its `[env: NAME=]` notes.
fn serve_help() -> (BTreeSet<String>, BTreeSet<String>) {
    let help = weir().args(["serve", "--help"]).output().unwrap();
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let mut flags = BTreeSet::new();
    let mut variables = BTreeSet::new();
    for line in help.lines() {
        if let Some(name) = line.trim_start().strip_prefix("--") {
            flags.insert(format!("--{}", name.split([' ', '<']).next().unwrap()));
        }
        if let Some(at) = line.find("[env: ") {
            variables.insert(line[at + 6..].split('=').next().unwrap().to_owned());
        }
    }
    // A parse that finds nothing would let every check below pass.
    assert!(flags.len() >= 11 && variables.len() >= 11, "{help}");
    (flags, variables)
}

/// Every `WEIR_NAME` in `text` (`WEIR_*`, the family, is not a name).
fn weir_variables(text: &str) -> BTreeSet<String> {
    text.match_indices("WEIR_")
        .map(|(at, _)| {
            text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect::<String>()
        })
        .filter(|name| name != "WEIR_")
        .collect()
}

/// The `--flags` following `weir serve` on each line of `text` that runs it.
fn serve_command_flags(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for line in text.lines() {
        let Some(at) = line.find("weir serve") else {
            continue;
        };
        // The command ends at a comment or at the next command of a pipeline.
        let command = line[at..].split(['#', '|', ';']).next().unwrap();
        for word in command.split_whitespace() {
            if let Some(name) = word.strip_prefix("--") {
                let name = name.split('=').next().unwrap();
                found.push((line.trim().to_owned(), format!("--{name}")));
            }
        }
    }
    found
}

#[test]
fn the_deployment_files_name_only_variables_and_flags_weir_serve_takes() {
    let (flags, variables) = serve_help();
    let mut named = BTreeSet::new();
    let mut commands = 0;
    for file in DEPLOYMENT_FILES {
        let text = read(file);
        for variable in weir_variables(&text) {
            assert!(
                variables.contains(&variable)
                    || SECRETS.contains(&variable.as_str())
                    || OPTIONAL_SECRETS.contains(&variable.as_str()),
                "{file} names {variable}, which `weir serve` does not read ({variables:?})"
            );
            named.insert(variable);
        }
        for (line, flag) in serve_command_flags(&text) {
            assert!(
                flags.contains(&flag),
                "{file}: `{line}` gives {flag}, which `weir serve --help` does not list"
            );
            commands += 1;
        }
    }
    // The files do configure through the environment, and the guide shows flags: a scan that
    // found nothing would prove nothing.
    for variable in ["WEIR_HTTP", "WEIR_GOSSIP", "WEIR_JOIN", "WEIR_CONFIG"]
        .iter()
        .chain(&SECRETS)
    {
        assert!(named.contains(*variable), "no file names {variable}");
    }
    assert!(
        commands >= 3,
        "docs/deployment.md shows few `weir serve` flags"
    );

    // The command lines themselves: `weir serve` with no flags, everything from the
    // environment (whose variables were just checked).
    let unit = read("deploy/systemd/weir.service");
    assert_eq!(
        directives(&unit, "ExecStart"),
        ["/usr/local/bin/weir serve"]
    );
    let dockerfile = read("deploy/Dockerfile");
    assert_eq!(
        dockerfile_instructions(&dockerfile, "ENTRYPOINT"),
        [r#"["weir", "serve"]"#]
    );
    assert!(dockerfile_instructions(&dockerfile, "CMD").is_empty());
    let statefulset = &documents("deploy/kubernetes/statefulset.yaml")[0];
    let container = &statefulset["spec"]["template"]["spec"]["containers"][0];
    assert!(
        container["command"].is_badvalue() && container["args"].is_badvalue(),
        "the StatefulSet's container should run the image's `weir serve` as it is"
    );
}

// --- Kubernetes ------------------------------------------------------------------------------

/// The YAML documents of `path`, each required to be a mapping with a `kind`.
fn documents(path: &str) -> Vec<Yaml> {
    let docs = YamlLoader::load_from_str(&read(path))
        .unwrap_or_else(|e| panic!("{path} is not YAML: {e}"));
    assert!(!docs.is_empty(), "{path} holds no document");
    for doc in &docs {
        assert!(
            doc["apiVersion"].as_str().is_some() && doc["kind"].as_str().is_some(),
            "{path}: a document without apiVersion and kind"
        );
    }
    docs
}

/// Every document of every manifest.
fn manifests() -> Vec<Yaml> {
    let dir = repo().join("deploy/kubernetes");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".yaml") || name.ends_with(".yml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    files
        .iter()
        .flat_map(|name| documents(&format!("deploy/kubernetes/{name}")))
        .collect()
}

fn of_kind<'a>(docs: &'a [Yaml], kind: &str) -> Vec<&'a Yaml> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

fn one_of_kind<'a>(docs: &'a [Yaml], kind: &str) -> &'a Yaml {
    let found = of_kind(docs, kind);
    assert_eq!(found.len(), 1, "one {kind} expected");
    found[0]
}

fn string(yaml: &Yaml) -> &str {
    yaml.as_str()
        .unwrap_or_else(|| panic!("a string expected: {yaml:?}"))
}

fn list(yaml: &Yaml) -> &[Yaml] {
    yaml.as_vec()
        .map(Vec::as_slice)
        .unwrap_or_else(|| panic!("a list expected: {yaml:?}"))
}

/// The port of an address such as `$(POD_IP):7946` or `0.0.0.0:8080`.
fn port_of(address: &str) -> i64 {
    address
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {address}"))
}

/// The StatefulSet's container environment, in order: (name, value or None if from a source).
fn env_of(container: &Yaml) -> Vec<(String, &Yaml)> {
    list(&container["env"])
        .iter()
        .map(|e| (string(&e["name"]).to_owned(), e))
        .collect()
}

fn env_value<'a>(env: &'a [(String, &Yaml)], name: &str) -> &'a str {
    env.iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, e)| e["value"].as_str())
        .unwrap_or_else(|| panic!("the container sets no value for {name}"))
}

#[test]
fn the_manifests_parse_and_hang_together() {
    let docs = manifests();
    let statefulset = one_of_kind(&docs, "StatefulSet");
    let spec = &statefulset["spec"];
    let name = string(&statefulset["metadata"]["name"]);
    let replicas = spec["replicas"].as_i64().unwrap();
    assert_eq!(replicas, 3);
    assert_eq!(string(&spec["podManagementPolicy"]), "Parallel");
    let labels = &spec["template"]["metadata"]["labels"];
    assert_eq!(&spec["selector"]["matchLabels"], labels);
    let pod = &spec["template"]["spec"];
    let containers = list(&pod["containers"]);
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    let env = env_of(container);

    // Ports: each named port is the port of the address the environment gives it.
    let ports: Vec<(String, i64, String)> = list(&container["ports"])
        .iter()
        .map(|p| {
            (
                string(&p["name"]).to_owned(),
                p["containerPort"].as_i64().unwrap(),
                p["protocol"].as_str().unwrap_or("TCP").to_owned(),
            )
        })
        .collect();
    let port = |name: &str| {
        ports
            .iter()
            .find(|(n, _, _)| n == name)
            .unwrap_or_else(|| panic!("no container port named {name}: {ports:?}"))
    };
    for (variable, port_name, protocol) in [
        ("WEIR_HTTP", "http", "TCP"),
        ("WEIR_GRPC", "grpc", "TCP"),
        ("WEIR_GOSSIP", "gossip", "UDP"),
    ] {
        let (_, number, proto) = port(port_name);
        assert_eq!(
            port_of(env_value(&env, variable)),
            *number,
            "{variable} and the container port {port_name}"
        );
        assert_eq!(proto, protocol, "the container port {port_name}");
    }

    // Probes: readiness is /readyz, liveness /healthz, both on the HTTP port.
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(string(&get["path"]), path, "{probe}");
        let target = &get["port"];
        assert!(
            target.as_str() == Some("http") || target.as_i64() == Some(port("http").1),
            "{probe} is not on the HTTP port: {target:?}"
        );
    }

    // The advertised addresses are the pod's own IP, which the downward API gives, defined
    // before its use: Kubernetes expands $(VAR) only from variables listed earlier.
    let position = |n: &str| {
        env.iter()
            .position(|(name, _)| name == n)
            .unwrap_or_else(|| panic!("the container's environment has no {n}"))
    };
    assert_eq!(
        string(&env[position("POD_IP")].1["valueFrom"]["fieldRef"]["fieldPath"]),
        "status.podIP"
    );
    assert_eq!(
        string(&env[position("WEIR_NODE_ID")].1["valueFrom"]["fieldRef"]["fieldPath"]),
        "metadata.name"
    );
    for variable in ["WEIR_GOSSIP", "WEIR_GRPC"] {
        assert!(
            env_value(&env, variable).starts_with("$(POD_IP):"),
            "{variable} is advertised to the peers: it must be the pod's IP"
        );
        assert!(position("POD_IP") < position(variable));
    }
    assert_eq!(env_value(&env, "WEIR_LOG_FORMAT"), "json");

    // The seeds: each replica by the headless Service's stable name, at the gossip port.
    let service_name = string(&spec["serviceName"]);
    let gossip_port = port("gossip").1;
    let seeds: Vec<&str> = env_value(&env, "WEIR_JOIN").split(',').collect();
    let expected: Vec<String> = (0..replicas)
        .map(|i| format!("{name}-{i}.{service_name}:{gossip_port}"))
        .collect();
    assert_eq!(seeds, expected);

    // Services: the headless one is the StatefulSet's, lists unready pods (a node must find
    // its peers before it is of use) and carries gossip over UDP; every Service selects the
    // pods and aims at ports the container has, by the same protocol.
    let services = of_kind(&docs, "Service");
    assert!(services.len() >= 2);
    let headless = services
        .iter()
        .find(|s| s["metadata"]["name"].as_str() == Some(service_name))
        .expect("the StatefulSet's serviceName is a Service of the manifests");
    assert_eq!(string(&headless["spec"]["clusterIP"]), "None");
    assert_eq!(
        headless["spec"]["publishNotReadyAddresses"].as_bool(),
        Some(true)
    );
    for service in &services {
        let service_name = string(&service["metadata"]["name"]);
        for (key, value) in service["spec"]["selector"].as_hash().unwrap() {
            assert_eq!(
                &labels[string(key)],
                value,
                "{service_name} selects other pods"
            );
        }
        for service_port in list(&service["spec"]["ports"]) {
            let target = &service_port["targetPort"];
            let (_, number, protocol) = match target.as_str() {
                Some(named) => port(named),
                None => ports
                    .iter()
                    .find(|(_, n, _)| Some(*n) == target.as_i64())
                    .unwrap_or_else(|| panic!("{service_name} aims at {target:?}")),
            };
            assert_eq!(
                service_port["protocol"].as_str().unwrap_or("TCP"),
                protocol,
                "{service_name}: port {number}"
            );
        }
    }
    assert!(list(&headless["spec"]["ports"]).iter().any(
        |p| p["protocol"].as_str() == Some("UDP") && p["targetPort"].as_str() == Some("gossip")
    ));

    // The config: WEIR_CONFIG is a key of the ConfigMap, mounted as a directory. A subPath
    // mount is never updated, so reload would see nothing.
    let config_map = one_of_kind(&docs, "ConfigMap");
    let config = Path::new(env_value(&env, "WEIR_CONFIG"));
    let mounts = list(&container["volumeMounts"]);
    let volumes = list(&pod["volumes"]);
    let mount = mounts
        .iter()
        .find(|m| Path::new(string(&m["mountPath"])) == config.parent().unwrap())
        .expect("WEIR_CONFIG's directory is a volume mount");
    assert!(
        mount["subPath"].is_badvalue(),
        "the config is mounted with subPath"
    );
    let volume = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
    assert_eq!(
        volume["configMap"]["name"], config_map["metadata"]["name"],
        "the config directory is not the ConfigMap"
    );
    let file = config.file_name().unwrap().to_str().unwrap();
    assert!(
        config_map["data"][file].as_str().is_some(),
        "the ConfigMap has no {file}"
    );

    // The data dir is the claim's mount.
    let claims = list(&spec["volumeClaimTemplates"]);
    let data = mounts
        .iter()
        .find(|m| m["mountPath"].as_str() == Some(env_value(&env, "WEIR_DATA_DIR")))
        .expect("WEIR_DATA_DIR is a volume mount");
    assert!(
        claims.iter().any(|c| c["metadata"]["name"] == data["name"]),
        "the data dir is not on a volumeClaimTemplate"
    );

    // The secrets come from the Secret, by keys it has.
    let secret = one_of_kind(&docs, "Secret");
    for variable in SECRETS {
        let (_, entry) = env.iter().find(|(n, _)| n == variable).unwrap();
        let reference = &entry["valueFrom"]["secretKeyRef"];
        assert_eq!(reference["name"], secret["metadata"]["name"], "{variable}");
        let key = string(&reference["key"]);
        assert!(
            secret["stringData"][key].as_str().is_some(),
            "the Secret has no {key}"
        );
    }

    // Stopping: the preStop wait and the drain (connections get up to 10 s) fit in the grace
    // period, with time left for the handover of rate buckets.
    let grace = pod["terminationGracePeriodSeconds"].as_i64().unwrap();
    let pre_stop = list(&container["lifecycle"]["preStop"]["exec"]["command"]);
    let waited: i64 = match pre_stop {
        [sleep, seconds] if string(sleep) == "sleep" => string(seconds).parse().unwrap(),
        other => panic!("preStop: {other:?}"),
    };
    assert!(
        grace >= waited + 10 + 5,
        "a grace period of {grace} s does not cover a {waited} s preStop and the drain"
    );

    // The image runs as the user the pod says, which is not root.
    assert_eq!(
        pod["securityContext"]["runAsUser"].as_i64(),
        Some(dockerfile_user().0)
    );

    if let Some(budget) = of_kind(&docs, "PodDisruptionBudget").first() {
        assert_eq!(&budget["spec"]["selector"]["matchLabels"], labels);
    }
}

/// The ConfigMap's weir.toml is one `weir serve` starts with, and the example Secret cannot
/// start a node: its placeholders are shorter than the 16 characters the server demands.
#[test]
fn the_config_map_passes_check_config_and_the_secret_is_a_placeholder() {
    let docs = manifests();
    let config_map = one_of_kind(&docs, "ConfigMap");
    let toml = string(&config_map["data"]["weir.toml"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("weir.toml");
    std::fs::write(&file, toml).unwrap();
    let check = |env: &[(&str, &str)]| {
        let mut command = weir();
        command.arg("check-config").arg(&file);
        for variable in SECRETS {
            command.env_remove(variable);
        }
        command.envs(env.iter().copied());
        let out = command.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, out) = check(&[]);
    assert!(ok, "the ConfigMap's weir.toml: {out}");
    assert!(out.contains(": ok ("), "{out}");

    let secret = one_of_kind(&docs, "Secret");
    let placeholders: Vec<(&str, &str)> = SECRETS
        .iter()
        .map(|name| (*name, string(&secret["stringData"][*name])))
        .collect();
    for (name, value) in &placeholders {
        assert!(
            value.chars().count() < 16,
            "the example Secret's {name} is a value the server would accept"
        );
    }
    // And the server says so: the placeholder cluster secret is refused outright.
    let (ok, out) = check(&placeholders);
    assert!(!ok && out.contains("WEIR_CLUSTER_SECRET"), "{out}");
}

// --- Dockerfile ------------------------------------------------------------------------------

/// The arguments of each `instruction` of a Dockerfile, continuation lines joined.
fn dockerfile_instructions(text: &str, instruction: &str) -> Vec<String> {
    let mut joined = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') && current.is_empty() {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                joined.push(std::mem::take(&mut current));
            }
        }
    }
    joined
        .iter()
        .filter_map(|l| {
            let (word, rest) = l.split_once(char::is_whitespace)?;
            word.eq_ignore_ascii_case(instruction)
                .then(|| rest.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .collect()
}

/// The Dockerfile's (final) `USER`, as uid and gid.
fn dockerfile_user() -> (i64, i64) {
    let users = dockerfile_instructions(&read("deploy/Dockerfile"), "USER");
    let user = users.last().expect("the Dockerfile sets a USER");
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    let parse = |id: &str| {
        id.parse()
            .unwrap_or_else(|_| panic!("USER {user}: numeric, so runAsNonRoot can verify it"))
    };
    (parse(uid), parse(gid))
}

#[test]
fn the_dockerfile_builds_weir_and_runs_it_unprivileged() {
    let text = read("deploy/Dockerfile");
    let runs = dockerfile_instructions(&text, "RUN");
    assert!(
        runs.iter()
            .any(|r| r.contains("cargo build --release -p weir-cli --locked")),
        "{runs:?}"
    );
    assert_eq!(
        dockerfile_instructions(&text, "FROM").len(),
        2,
        "a build stage and a runtime stage"
    );
    let (uid, gid) = dockerfile_user();
    assert!(uid != 0 && gid != 0, "the image runs as root");

    let env: Vec<(String, String)> = dockerfile_instructions(&text, "ENV")
        .iter()
        .flat_map(|e| {
            e.split_whitespace()
                .map(|pair| {
                    let (name, value) = pair.split_once('=').unwrap();
                    (name.to_owned(), value.to_owned())
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let env_value = |name: &str| {
        env.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("the Dockerfile sets no {name}"))
    };
    // The data dir is the volume, and the ports the image configures are the ones it exposes.
    let volumes = dockerfile_instructions(&text, "VOLUME");
    assert_eq!(
        volumes,
        [format!(r#"["{}"]"#, env_value("WEIR_DATA_DIR"))],
        "the data dir is not the VOLUME"
    );
    let exposed: BTreeSet<String> = dockerfile_instructions(&text, "EXPOSE")
        .iter()
        .flat_map(|e| e.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    for variable in ["WEIR_HTTP", "WEIR_GRPC"] {
        let port = port_of(env_value(variable));
        assert!(
            exposed.contains(&format!("{port}/tcp")) || exposed.contains(&port.to_string()),
            "{variable}'s port {port} is not exposed: {exposed:?}"
        );
    }
    // Gossip has no default address; the image exposes the port the manifests use.
    let statefulset = &documents("deploy/kubernetes/statefulset.yaml")[0];
    let container = &statefulset["spec"]["template"]["spec"]["containers"][0];
    let gossip = port_of(env_value_of_container(container, "WEIR_GOSSIP"));
    assert!(exposed.contains(&format!("{gossip}/udp")), "{exposed:?}");
    // The manifests run the image's ports.
    assert_eq!(
        port_of(env_value_of_container(container, "WEIR_GRPC")),
        port_of(env_value("WEIR_GRPC"))
    );

    let health = dockerfile_instructions(&text, "HEALTHCHECK");
    assert_eq!(health.len(), 1);
    assert!(
        health[0].contains("CMD") && health[0].contains("/healthz"),
        "{health:?}"
    );

    let ignore = read(".dockerignore");
    for excluded in ["target", ".git"] {
        assert!(
            ignore
                .lines()
                .any(|l| l.trim().trim_end_matches('/').trim_start_matches('/') == excluded),
            ".dockerignore does not leave out {excluded}"
        );
    }
}

fn env_value_of_container<'a>(container: &'a Yaml, name: &str) -> &'a str {
    list(&container["env"])
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
        .and_then(|e| e["value"].as_str())
        .unwrap_or_else(|| panic!("the container sets no value for {name}"))
}

// --- systemd ---------------------------------------------------------------------------------

/// The values of `key=` lines in a unit file.
fn directives(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_systemd_unit_keeps_its_data_reloads_and_drains() {
    let unit = read("deploy/systemd/weir.service");
    let environment = directives(&unit, "Environment");
    let data_dir = environment
        .iter()
        .find_map(|e| e.strip_prefix("WEIR_DATA_DIR="))
        .expect("the unit sets WEIR_DATA_DIR");
    let state = directives(&unit, "StateDirectory");
    assert_eq!(
        [format!("/var/lib/{}", state[0])],
        [data_dir],
        "the data dir is not the StateDirectory"
    );
    assert!(environment.contains(&"WEIR_CONFIG=/etc/weir/weir.toml".to_owned()));
    assert_eq!(directives(&unit, "ExecReload"), ["/bin/kill -HUP $MAINPID"]);
    assert_eq!(directives(&unit, "KillSignal"), ["SIGTERM"]);
    assert_eq!(
        directives(&unit, "EnvironmentFile"),
        ["-/etc/weir/weir.env"]
    );
    assert!(
        directives(&unit, "DynamicUser") == ["yes"] || !directives(&unit, "User").is_empty(),
        "the unit runs as root"
    );
    let stop: u64 = directives(&unit, "TimeoutStopSec")[0]
        .trim_end_matches('s')
        .parse()
        .unwrap();
    assert!(
        stop >= 15,
        "TimeoutStopSec={stop}s does not cover the drain"
    );
}

/// Runs `systemd-analyze` on a copy of the unit whose ExecStart is the binary under test (verify
/// checks that it exists). Any complaint fails: verify exits 0 even on an unknown directive.
#[test]
fn systemd_analyze_accepts_the_unit() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("systemd-analyze is not installed here: the unit is not verified");
        return;
    }
    let unit = read("deploy/systemd/weir.service");
    let binary = env!("CARGO_BIN_EXE_weir");
    let rewritten = unit.replace(
        "ExecStart=/usr/local/bin/weir ",
        &format!("ExecStart={binary} "),
    );
    assert_ne!(rewritten, unit, "ExecStart is not /usr/local/bin/weir");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.service");
    std::fs::write(&path, rewritten).unwrap();

    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    assert!(
        verify.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );

    // Its own rating of the sandbox, 0 (locked down) to 10 (exposed); the unit as written rates
    // about 1.5, a unit without the sandboxing options over 8.
    let security = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--threshold=20"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        security.status.success(),
        "systemd-analyze security rates the unit more exposed than 2.0:\n{}",
        String::from_utf8_lossy(&security.stdout)
    );
}

#[test]
fn the_readme_links_the_deployment_guide() {
    assert!(read("README.md").contains("docs/deployment.md"));
}

/// The image's HEALTHCHECK command, run as Docker runs it (`/bin/sh -c`) against real nodes:
/// it fails with nothing listening, and passes against a plain node and against one that
/// requires client certificates (it presents the node's own).
#[test]
fn the_image_healthcheck_passes_against_a_plain_node_and_one_under_mutual_tls() {
    let found = Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("WEIR_REQUIRE_CURL").is_none(),
            "curl is required here"
        );
        eprintln!("skipping: curl is not installed");
        return;
    }
    let text = read("deploy/Dockerfile");
    let health = dockerfile_instructions(&text, "HEALTHCHECK");
    let (_, command) = health[0].split_once("CMD ").expect("HEALTHCHECK CMD …");
    let check = |http: &str, tls: Option<(&Path, &Path)>| {
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(command)
            .env("WEIR_HTTP", http)
            .env_remove("WEIR_TLS_CERT")
            .env_remove("WEIR_TLS_KEY");
        if let Some((cert, key)) = tls {
            sh.env("WEIR_TLS_CERT", cert).env("WEIR_TLS_KEY", key);
        }
        sh.output().unwrap().status.success()
    };
    let dir = tempfile::tempdir().unwrap();
    let unused = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    assert!(
        !check(&unused.to_string(), None),
        "passed with nothing listening"
    );

    let plain = support::Server::start("", &dir.path().join("plain"));
    assert!(check(plain.http.trim_start_matches("http://"), None));

    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut node = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    node.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let node = node.signed_by(&key, &ca, &ca_key).unwrap();
    let (ca_path, cert, key_path) = (
        dir.path().join("ca.crt"),
        dir.path().join("tls.crt"),
        dir.path().join("tls.key"),
    );
    std::fs::write(&ca_path, ca.pem()).unwrap();
    std::fs::write(&cert, node.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let config = format!(
        "[server.tls]\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\n",
        cert.display().to_string(),
        key_path.display().to_string(),
        ca_path.display().to_string()
    );
    let mutual = support::Server::start(&config, &dir.path().join("mutual"));
    let address = mutual.http.trim_start_matches("http://");
    assert!(check(address, Some((&cert, &key_path))));
    // The same check without the node's certificate is refused: TLS was really in use.
    assert!(!check(address, None));
}
