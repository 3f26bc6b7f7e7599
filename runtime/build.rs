//! Embeds the git commit into the binary so benchmark results name the code that produced them,
//! even when the binary runs on a machine without the repository.
fn main() {
    let commit = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FLASHRT_GIT_COMMIT={commit}");
    println!("cargo:rerun-if-changed=../.git/HEAD");
    // Per commit, not per `git add`: teammates commit often and each rerun recompiles the crate.
    println!("cargo:rerun-if-changed=../.git/refs/heads");
}
