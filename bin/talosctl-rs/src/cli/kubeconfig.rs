//! `talosctl-rs kubeconfig [PATH]`: fetch the admin kubeconfig from a
//! control-plane node and write it, or merge it into an existing
//! kubeconfig, as talosctl does (cmd/talosctl/cmd/talos/kubeconfig.go):
//! clashing cluster, user and context names are renamed `NAME-1`, ...
//! unless `--force`, which replaces them; the merged context becomes
//! current. Files are written atomically with mode 0600.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use serde_norway::{Mapping, Value};

use super::Global;

#[derive(clap::Args)]
pub struct KubeconfigArgs {
    /// Where to write: a file, or a directory to write `kubeconfig` into
    /// (default: the first path in $KUBECONFIG, else ~/.kube/config).
    pub path: Option<PathBuf>,
    /// Replace clashing entries (merge) or an existing file (no merge).
    #[arg(short, long)]
    pub force: bool,
    /// Merge into an existing kubeconfig.
    #[arg(short, long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub merge: bool,
}

pub async fn run(global: &Global, args: KubeconfigArgs) -> anyhow::Result<()> {
    let path = target_path(args.path)?;
    let (client, _) = global.connect_one("kubeconfig")?;
    let fetched = client.kubeconfig().await?;
    let exists = path.exists();
    let text = if exists && args.merge {
        let existing = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let (merged, renames) = merge(&existing, &fetched, args.force)
            .with_context(|| format!("merging into {}", path.display()))?;
        for rename in renames {
            eprintln!("renamed {rename}");
        }
        merged
    } else if exists && !args.force {
        bail!(
            "{} already exists: use --force to overwrite it, or --merge to merge into it",
            path.display()
        );
    } else {
        String::from_utf8(fetched).context("the kubeconfig is not UTF-8")?
    };
    talos_client::write_private_file(&path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("kubeconfig written to {}", path.display());
    Ok(())
}

/// The file to write: as given (a directory gets `kubeconfig` inside), else
/// kubectl's default.
fn target_path(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let path = match given {
        Some(path) => path,
        None => match std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
            Some(list) => std::env::split_paths(&list)
                .next()
                .context("$KUBECONFIG names no file")?,
            None => std::env::home_dir()
                .context("no home directory for ~/.kube/config")?
                .join(".kube/config"),
        },
    };
    Ok(if path.is_dir() {
        path.join("kubeconfig")
    } else {
        path
    })
}

/// Merges kubeconfig `new` into `existing`; returns the result and the
/// renames made ("cluster \"a\" -> \"a-1\"").
pub fn merge(existing: &str, new: &[u8], force: bool) -> anyhow::Result<(String, Vec<String>)> {
    let mut base: Value = if existing.trim().is_empty() {
        Value::Mapping(Mapping::new())
    } else {
        serde_norway::from_str(existing).context("the existing kubeconfig is not YAML")?
    };
    let new: Value = serde_norway::from_slice(new).context("the fetched kubeconfig is not YAML")?;
    let base_map = base
        .as_mapping_mut()
        .context("the existing kubeconfig is not a mapping")?;
    let mut renames = Vec::new();
    let mut renamed = |kind: &str, from: &str, to: &str| {
        renames.push(format!("{kind} {from:?} -> {to:?}"));
    };
    let cluster_map = add_entries(base_map, &new, "clusters", force, &mut |a, b| {
        renamed("cluster", a, b)
    })?;
    let user_map = add_entries(base_map, &new, "users", force, &mut |a, b| {
        renamed("user", a, b)
    })?;
    // Contexts refer to clusters and users by name: follow their renames.
    let mut contexts = new.clone();
    if let Some(list) = contexts["contexts"].as_sequence_mut() {
        for entry in list {
            let context = &mut entry["context"];
            for (key, map) in [("cluster", &cluster_map), ("user", &user_map)] {
                if let Some(to) = context[key].as_str().and_then(|n| map.get(n)) {
                    context[key] = Value::String(to.clone());
                }
            }
        }
    }
    let context_map = add_entries(base_map, &contexts, "contexts", force, &mut |a, b| {
        renamed("context", a, b)
    })?;
    if let Some(current) = new["current-context"].as_str() {
        let current = context_map.get(current).cloned().unwrap_or(current.into());
        base_map.insert("current-context".into(), Value::String(current));
    }
    for key in ["apiVersion", "kind"] {
        if !base_map.contains_key(key) {
            base_map.insert(key.into(), new[key].clone());
        }
    }
    Ok((serde_norway::to_string(&base)?, renames))
}

/// Adds the named entries of `new[key]` to `base[key]`; a clashing name is
/// replaced (`force`) or the new entry renamed to the first free `NAME-N`.
/// Returns the renames.
fn add_entries(
    base: &mut Mapping,
    new: &Value,
    key: &str,
    force: bool,
    renamed: &mut dyn FnMut(&str, &str),
) -> anyhow::Result<std::collections::HashMap<String, String>> {
    let mut map = std::collections::HashMap::new();
    let list = base
        .entry(key.into())
        .or_insert_with(|| Value::Sequence(Vec::new()));
    if list.is_null() {
        *list = Value::Sequence(Vec::new());
    }
    let list = list
        .as_sequence_mut()
        .with_context(|| format!("{key} is not a list"))?;
    for entry in new[key].as_sequence().into_iter().flatten() {
        let name = entry["name"]
            .as_str()
            .with_context(|| format!("an entry of {key} has no name"))?
            .to_string();
        let taken = |n: &str, list: &Vec<Value>| list.iter().any(|e| e["name"].as_str() == Some(n));
        let mut entry = entry.clone();
        if taken(&name, list) {
            if force {
                list.retain(|e| e["name"].as_str() != Some(name.as_str()));
            } else {
                let free = (1..)
                    .map(|i| format!("{name}-{i}"))
                    .find(|n| !taken(n, list))
                    .expect("some suffix is free");
                renamed(&name, &free);
                entry["name"] = Value::String(free.clone());
                map.insert(name, free);
            }
        }
        list.push(entry);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://new:6443'}\nusers:\n- name: u\n  user: {token: n}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";

    #[test]
    fn merge_renames_clashes_and_follows_them_in_contexts() {
        let existing = "apiVersion: v1\nkind: Config\npreferences: {colors: true}\nclusters:\n- name: c\n  cluster: {server: 'https://old:6443'}\nusers:\n- name: u\n  user: {token: o}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";
        let (merged, renames) = merge(existing, NEW.as_bytes(), false).unwrap();
        let v: Value = serde_norway::from_str(&merged).unwrap();
        assert_eq!(renames.len(), 3, "{renames:?}");
        assert_eq!(v["clusters"][1]["name"], "c-1");
        assert_eq!(v["clusters"][0]["cluster"]["server"], "https://old:6443");
        assert_eq!(v["contexts"][1]["name"], "x-1");
        assert_eq!(v["contexts"][1]["context"]["cluster"], "c-1");
        assert_eq!(v["contexts"][1]["context"]["user"], "u-1");
        assert_eq!(v["current-context"], "x-1");
        assert_eq!(v["preferences"]["colors"], true, "other keys kept");
    }

    #[test]
    fn forced_merge_replaces_clashes() {
        let (first, _) = merge("", NEW.as_bytes(), false).unwrap();
        let newer = NEW.replace("https://new:6443", "https://newer:6443");
        let (merged, renames) = merge(&first, newer.as_bytes(), true).unwrap();
        let v: Value = serde_norway::from_str(&merged).unwrap();
        assert!(renames.is_empty());
        assert_eq!(v["clusters"].as_sequence().unwrap().len(), 1);
        assert_eq!(v["clusters"][0]["cluster"]["server"], "https://newer:6443");
        assert_eq!(v["current-context"], "x");
    }
}
