//! The Hugging Face hub cache, where a lerobot fine-tune's base model and its backbone usually
//! are (lerobot loads them by repo id): `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub` (`huggingface_hub`'s own
//! order), a repo `org/name` under `models--org--name/snapshots/<revision>/`.

use std::path::{Path, PathBuf};

/// The cache directory `huggingface_hub` would use.
pub fn root() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("HF_HUB_CACHE")
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/huggingface/hub")))
}

/// The cache directory, for messages.
pub fn describe_roots() -> String {
    root().map_or_else(|| "no cache directory: HF_HUB_CACHE, HF_HOME and HOME are unset".into(), |r| r.display().to_string())
}

/// The snapshot of `repo` (`org/name`) in the cache.
pub fn snapshot(repo: &str) -> Option<PathBuf> {
    snapshot_in(&root()?, repo)
}

/// The snapshot of `repo` under `root`: the revision `refs/main` names, else the only (or the
/// first by name) snapshot. `None` for a name that is not a repo id.
pub fn snapshot_in(root: &Path, repo: &str) -> Option<PathBuf> {
    let (org, name) = repo.split_once('/')?;
    let valid = |s: &str| !s.is_empty() && s != "." && !s.contains("..") && !s.contains('/') && !s.contains('\\');
    if !valid(org) || !valid(name) {
        return None;
    }
    let repo_dir = root.join(format!("models--{org}--{name}"));
    let snapshots = repo_dir.join("snapshots");
    if let Ok(rev) = std::fs::read_to_string(repo_dir.join("refs/main")) {
        let named = snapshots.join(rev.trim());
        if !rev.trim().is_empty() && named.is_dir() {
            return Some(named);
        }
    }
    let mut all: Vec<PathBuf> =
        std::fs::read_dir(&snapshots).ok()?.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_dir()).collect();
    all.sort();
    all.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repo_is_found_at_its_main_revision_and_a_path_is_not_a_repo() {
        let root = tempfile::tempdir().unwrap();
        let repo = root.path().join("models--nvidia--GR00T-N1.7-3B");
        assert_eq!(snapshot_in(root.path(), "nvidia/GR00T-N1.7-3B"), None, "not cached");
        for rev in ["aaa", "bbb"] {
            std::fs::create_dir_all(repo.join("snapshots").join(rev)).unwrap();
        }
        assert_eq!(snapshot_in(root.path(), "nvidia/GR00T-N1.7-3B"), Some(repo.join("snapshots/aaa")), "first by name");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "bbb\n").unwrap();
        assert_eq!(snapshot_in(root.path(), "nvidia/GR00T-N1.7-3B"), Some(repo.join("snapshots/bbb")), "refs/main");
        for path in ["../groot", "/abs/path", "a/../b", "single"] {
            assert_eq!(snapshot_in(root.path(), path), None, "{path}");
        }
    }
}
