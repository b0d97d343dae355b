//! The real `kubectl` as a process, with a kubeconfig, run in a directory of its own.

use std::path::PathBuf;
use std::process::Command;

/// kubectl with `kubeconfig`, run in `dir` (where [`Kubectl::write`] puts files).
pub struct Kubectl {
    pub kubeconfig: PathBuf,
    pub dir: PathBuf,
}

impl Kubectl {
    /// kubectl with `kubeconfig`, run in its directory.
    pub fn at(kubeconfig: PathBuf) -> Self {
        let dir = kubeconfig
            .parent()
            .map_or_else(|| PathBuf::from("."), PathBuf::from);
        Self { kubeconfig, dir }
    }

    /// Runs kubectl; panics with its output when it fails.
    pub fn ok(&self, args: &[&str]) -> String {
        self.ok_with(args, &[])
    }

    /// [`Kubectl::ok`] with more environment.
    pub fn ok_with(&self, args: &[&str], env: &[(&str, &str)]) -> String {
        let out = self.run_with(args, env);
        assert!(
            out.status.success(),
            "kubectl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs kubectl, whatever its outcome.
    pub fn run(&self, args: &[&str]) -> std::process::Output {
        self.run_with(args, &[])
    }

    /// [`Kubectl::run`] with more environment.
    pub fn run_with(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .envs(env.iter().copied())
            .current_dir(&self.dir)
            .output()
            .unwrap()
    }

    /// Writes `text` to the file `name` of its directory; the name, to pass to kubectl.
    pub fn write(&self, name: &str, text: &str) -> String {
        std::fs::write(self.dir.join(name), text).unwrap();
        name.to_string()
    }
}
