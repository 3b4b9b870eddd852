//! talosconfig: lookup order, contexts, overrides, endpoints, merge, round
//! trips of unknown keys, atomic 0600 writes, and errors that name the file
//! and the key. Includes an identity issued by upstream Talos.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use talos_client::config::{
    ConfigError, ConfigPath, Context, Overrides, TalosConfig, default_paths_with,
    normalize_endpoint,
};
use talos_sim::pki::{Ca, LeafSpec};

const UPSTREAM: &str = include_str!("fixtures/upstream-talosconfig.yaml");

fn generated_context(endpoints: &[&str]) -> Context {
    let ca = Ca::generate().unwrap();
    let admin = ca.issue(&LeafSpec::client(&["os:admin"])).unwrap();
    Context::new(
        endpoints.iter().map(|e| e.to_string()).collect(),
        ca.cert_pem.as_bytes(),
        admin.cert_pem.as_bytes(),
        admin.key_pem.as_bytes(),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `text` with the line starting (after indentation) with `prefix` replaced.
fn replace_line(text: &str, prefix: &str, with: &str) -> String {
    text.lines()
        .map(|l| {
            if l.trim_start().starts_with(prefix) {
                with
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn reads_an_identity_issued_by_upstream_talos() {
    let path = Path::new("tests/fixtures/upstream-talosconfig.yaml");
    let config = TalosConfig::from_yaml(UPSTREAM.as_bytes(), path).unwrap();
    let context = config.resolve(&Overrides::default(), path).unwrap();
    assert_eq!(context.name, "upstream");
    assert_eq!(context.endpoints, ["127.0.0.1"]);
    assert_eq!(context.nodes, ["127.0.0.1"]);
    assert!(String::from_utf8_lossy(context.credentials.key_pem()).contains("ED25519 PRIVATE KEY"));
    let info = context.credentials.certificate_info().unwrap();
    assert_eq!(info.roles, ["os:admin"]);
    assert_eq!(info.issuer, "O=talos");
    assert_eq!(info.not_after.date().to_string(), "2032-08-09");
    // This 2022 upstream certificate lists ServerAuth and ClientAuth; current
    // apid requires exactly ClientAuth, and the parser must tell the two apart.
    assert!(!info.client_auth_only);
    // The Ed25519 key under Talos's label is accepted by rustls and matches.
    context
        .credentials
        .client_config()
        .expect("usable identity");
}

#[test]
fn overrides_replace_context_endpoints_and_nodes() {
    let mut config = TalosConfig::with_context("a", generated_context(&["10.0.0.1"]));
    config
        .contexts
        .insert("b".into(), generated_context(&["10.0.0.9"]));
    let path = Path::new("mem");
    let overrides = Overrides::default()
        .with_context(Some("b".into()))
        .with_endpoints(vec!["10.1.1.1:50001".into()])
        .with_nodes(vec!["10.2.2.2".into(), "10.2.2.3".into()]);
    let resolved = config.resolve(&overrides, path).unwrap();
    assert_eq!(resolved.name, "b");
    assert_eq!(resolved.endpoints, ["10.1.1.1:50001"]);
    assert_eq!(resolved.nodes, ["10.2.2.2", "10.2.2.3"]);
    let default = config.resolve(&Overrides::default(), path).unwrap();
    assert_eq!(default.name, "a");
    assert_eq!(default.endpoints, ["10.0.0.1"]);
}

#[test]
fn endpoints_follow_upstream_rules() {
    let cases = [
        ("10.0.0.1", "10.0.0.1:50000"),
        ("10.0.0.1:4000", "10.0.0.1:4000"),
        ("localhost", "localhost:50000"),
        ("https://talos.example.com", "talos.example.com:443"),
        ("https://talos.example.com:8443", "talos.example.com:8443"),
        ("http://10.0.0.1", "10.0.0.1:50000"),
        ("2001:db8::1", "[2001:db8::1]:50000"),
        ("[2001:db8::1]:8080", "[2001:db8::1]:8080"),
        ("[2001:db8::1]", "[2001:db8::1]:50000"),
    ];
    for (input, expected) in cases {
        assert_eq!(
            normalize_endpoint(input).unwrap().to_string(),
            expected,
            "{input}"
        );
    }
    for bad in ["", "10.0.0.1:http", "[::1", "host:99999"] {
        let err = normalize_endpoint(bad).unwrap_err();
        assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
    }
}

#[test]
fn deprecated_target_becomes_an_endpoint() {
    let yaml = "context: x\ncontexts:\n  x:\n    target: 10.9.9.9\n    endpoints: [10.0.0.1]\n";
    let config = TalosConfig::from_yaml(yaml.as_bytes(), Path::new("t")).unwrap();
    assert_eq!(config.contexts["x"].endpoints, ["10.0.0.1", "10.9.9.9"]);
    assert!(config.contexts["x"].target.is_empty());
}

#[test]
fn unknown_keys_survive_a_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = UPSTREAM.replace("context: upstream", "context: upstream\nfuture-top: {a: 1}");
    text = text.replace(
        "    endpoints:",
        "    future-context-key: keep-me\n    endpoints:",
    );
    text.push_str("    auth:\n      siderov1:\n        identity: someone@example.com\n");
    let path = write(dir.path(), "config", &text);
    let config = TalosConfig::read(&path).unwrap();
    let location = ConfigPath::new(path.clone());
    config.save(&location).unwrap();
    let again = TalosConfig::read(&path).unwrap();
    assert_eq!(config, again);
    let saved = std::fs::read_to_string(&path).unwrap();
    assert!(saved.contains("future-top:"), "{saved}");
    assert!(saved.contains("future-context-key: keep-me"), "{saved}");
    assert!(saved.contains("identity: someone@example.com"), "{saved}");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // No temporary file is left beside it.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [OsString::from("config")]);
}

#[test]
fn merge_renames_clashing_contexts_and_switches_to_the_merged_one() {
    let mut base = TalosConfig::with_context("prod", generated_context(&["10.0.0.1"]));
    base.contexts
        .insert("prod-1".into(), generated_context(&["10.0.0.2"]));
    let incoming = TalosConfig::with_context("prod", generated_context(&["10.0.0.3"]));
    let renames = base.merge(incoming);
    assert_eq!(renames.len(), 1);
    assert_eq!(renames[0].to_string(), "\"prod\" -> \"prod-2\"");
    assert_eq!(base.context, "prod-2");
    assert_eq!(base.contexts["prod-2"].endpoints, ["10.0.0.3"]);
    assert_eq!(base.contexts["prod"].endpoints, ["10.0.0.1"]);
}

#[test]
fn lookup_order_is_talosconfig_then_talos_home_then_home() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        }
    };
    let paths: Vec<_> = default_paths_with(env(&[
        ("TALOSCONFIG", "/explicit/tc"),
        ("TALOS_HOME", "/th"),
        ("HOME", "/home/u"),
    ]))
    .into_iter()
    .map(|p| (p.path, p.write_allowed))
    .collect();
    assert_eq!(
        paths,
        [
            (PathBuf::from("/explicit/tc"), true),
            (PathBuf::from("/th/config"), true),
            (PathBuf::from("/var/run/secrets/talos.dev/config"), false),
        ]
    );
    // A relative TALOS_HOME is ignored, as upstream does.
    let paths = default_paths_with(env(&[("TALOS_HOME", "rel"), ("HOME", "/home/u")]));
    assert_eq!(paths[0].path, PathBuf::from("/home/u/.talos/config"));
}

#[test]
fn explicit_path_wins_and_missing_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "tc", UPSTREAM);
    let (config, location) = TalosConfig::load(Some(&path)).unwrap();
    assert_eq!(config.context, "upstream");
    assert_eq!(location.path, path);
    let missing = dir.path().join("nope");
    let err = TalosConfig::load(Some(&missing)).unwrap_err();
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );
}

#[test]
fn broken_files_get_errors_naming_file_and_key() {
    let dir = tempfile::tempdir().unwrap();

    let bad_yaml = write(dir.path(), "bad-yaml", "context: [unclosed\n");
    let err = TalosConfig::read(&bad_yaml).unwrap_err();
    assert!(matches!(err, ConfigError::Parse { .. }));
    let text = err.to_string();
    assert!(text.contains("bad-yaml") && text.contains("line"), "{text}");

    let bad_b64 = write(
        dir.path(),
        "bad-b64",
        &UPSTREAM.replace("ca: LS0t", "ca: !!!LS0t"),
    );
    let config = TalosConfig::read(&bad_b64).unwrap();
    let err = config.resolve(&Overrides::default(), &bad_b64).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("bad-b64")
            && text.contains("contexts.upstream.ca")
            && text.contains("base64"),
        "{text}"
    );

    // The crt holds valid base64 of something that is not PEM.
    let replaced = replace_line(UPSTREAM, "crt:", "    crt: aGVsbG8K");
    let not_pem = write(dir.path(), "not-pem", &replaced);
    let config = TalosConfig::read(&not_pem).unwrap();
    let text = config
        .resolve(&Overrides::default(), &not_pem)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("contexts.upstream.crt") && text.contains("no CERTIFICATE"),
        "{text}"
    );

    let no_key = write(dir.path(), "no-key", &replace_line(UPSTREAM, "key:", ""));
    let config = TalosConfig::read(&no_key).unwrap();
    let text = config
        .resolve(&Overrides::default(), &no_key)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("contexts.upstream.key") && text.contains("missing"),
        "{text}"
    );

    let config = TalosConfig::from_yaml(UPSTREAM.as_bytes(), &bad_yaml).unwrap();
    let err = config
        .resolve(
            &Overrides::default().with_context(Some("staging".into())),
            &bad_yaml,
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("context \"staging\" not found (available: upstream)"),
        "{err}"
    );

    let empty = TalosConfig::from_yaml(b"", Path::new("empty")).unwrap();
    let err = empty
        .resolve(&Overrides::default(), Path::new("empty"))
        .unwrap_err();
    assert!(matches!(err, ConfigError::NoCurrentContext { .. }), "{err}");
}

#[test]
fn a_context_without_endpoints_is_refused() {
    let yaml = UPSTREAM.replace("    endpoints:\n      - 127.0.0.1\n", "");
    let config = TalosConfig::from_yaml(yaml.as_bytes(), Path::new("x")).unwrap();
    let err = config
        .resolve(&Overrides::default(), Path::new("x"))
        .unwrap_err();
    assert!(matches!(err, ConfigError::NoEndpoints { .. }), "{err}");
}

#[test]
fn debug_output_never_contains_the_key() {
    let config = TalosConfig::from_yaml(UPSTREAM.as_bytes(), Path::new("x")).unwrap();
    let key = &config.contexts["upstream"].key;
    let resolved = config
        .resolve(&Overrides::default(), Path::new("x"))
        .unwrap();
    for text in [format!("{config:?}"), format!("{resolved:?}")] {
        assert!(!text.contains(key.as_str()), "key leaked: {text}");
        assert!(
            !text.contains("PRIVATE KEY-----\nMC4"),
            "key leaked: {text}"
        );
    }
}
