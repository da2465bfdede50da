//! `--install-to DIR`: the binary copies itself onto a node.
//!
//! The image is distroless (no shell, no `cp`), so the binary that is already
//! in it does the copy: a DaemonSet's init container mounts the kubelet's
//! `--image-credential-provider-bin-dir` as a hostPath and runs
//! `/ecr-credential-provider --install-to /host-dir`. The copy is written
//! beside the target and renamed over it, so a kubelet starting the plugin
//! meanwhile runs either the old binary or the new one, never half of one.

use std::path::{Path, PathBuf};

/// The file name the kubelet looks for: the provider's `name` in its
/// `CredentialProviderConfig`.
pub const FILE_NAME: &str = "ecr-credential-provider";

/// Copies the running binary to `dir`/[`FILE_NAME`]; the path written.
pub fn install_to(dir: &Path) -> Result<PathBuf, String> {
    let source =
        std::env::current_exe().map_err(|e| format!("cannot find this binary to copy it: {e}"))?;
    copy_atomically(&source, dir)
}

fn copy_atomically(source: &Path, dir: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt as _;
    if !dir.is_dir() {
        return Err(format!(
            "--install-to {}: not a directory (mount the kubelet's --image-credential-provider-bin-dir there)",
            dir.display()
        ));
    }
    let target = dir.join(FILE_NAME);
    let staging = dir.join(format!(".{FILE_NAME}.{}", std::process::id()));
    let written = std::fs::copy(source, &staging)
        .and_then(|_| std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o755)))
        .and_then(|()| std::fs::rename(&staging, &target));
    if let Err(err) = written {
        let _ = std::fs::remove_file(&staging);
        return Err(format!("cannot install {}: {err}", target.display()));
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn the_copy_replaces_the_old_binary_whole() {
        let dir = std::env::temp_dir().join(format!("ecr-install-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let source = dir.join("source");
        std::fs::write(&source, b"new binary").expect("source");
        std::fs::write(dir.join(FILE_NAME), b"old").expect("old binary");
        let target = copy_atomically(&source, &dir).expect("installed");
        assert_eq!(std::fs::read(&target).expect("read"), b"new binary");
        let mode = std::fs::metadata(&target)
            .expect("metadata")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 2, "no staging file left: {names:?}");
        let err = copy_atomically(&source, &dir.join("missing")).expect_err("no directory");
        assert!(err.contains("not a directory"), "{err}");
        std::fs::remove_dir_all(&dir).expect("cleaned");
    }
}
