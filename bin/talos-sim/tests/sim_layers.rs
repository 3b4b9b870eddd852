//! The simulator's modules stack in layers: the cluster facade over the
//! control socket, over each node's supervisor, over the API's handlers and
//! the lifecycle, over the shared state. A module may use the layers below
//! it, never one above: a handler queues a power action on its node instead
//! of calling the lifecycle, and the lifecycle never reaches up to the API.

use std::path::Path;

/// Each module's layer; a module may refer to modules of a lower layer
/// only (or its own layer's, for the handlers that share one). The
/// lifecycle sits above the handlers: only the supervisor and the facade
/// run it.
const LAYERS: &[(&str, u8)] = &[
    ("cluster", 7),
    ("control", 6),
    ("supervisor", 5),
    ("lifecycle", 4),
    ("front", 3),
    ("cosi", 3),
    ("machined", 3),
    ("machined_apply", 3),
    ("machined_control", 3),
    ("machined_streams", 3),
    ("machined_upgrade", 3),
    ("maintenance", 3),
    ("health", 3),
    ("cosi_state", 2),
    ("machined_etcd", 1),
    ("shared", 0),
    ("node", 0),
    ("upgrade_state", 0),
    ("ledger", 0),
];

fn layer(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

/// The layered modules `source` refers to (`crate::m` or `super::m`),
/// outside comments.
fn references(source: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for prefix in ["crate::", "super::"] {
            for (at, _) in code.match_indices(prefix) {
                let rest = &code[at + prefix.len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if layer(&name).is_some() {
                    found.push((n + 1, name));
                }
            }
        }
    }
    found
}

#[test]
fn no_module_reaches_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut upward = Vec::new();
    for (module, own) in LAYERS {
        let path = src.join(format!("{module}.rs"));
        let source =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for (line, used) in references(&source) {
            if layer(&used).unwrap() > *own {
                upward.push(format!("{module}.rs:{line} uses {used}"));
            }
        }
    }
    assert!(upward.is_empty(), "upward references: {upward:#?}");
}

#[test]
fn the_scan_sees_an_upward_reference() {
    let found = references("use crate::supervisor::add_node; // crate::cluster\n");
    assert_eq!(found, vec![(1, "supervisor".to_string())]);
}
