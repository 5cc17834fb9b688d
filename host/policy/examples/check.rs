//! Checks policy components against specd:policy@0.1.0, like `specd policy check`:
//!     cargo run -p specd-policy --example check -- FILE.wasm...
//! Prints the content hash and exports, or precisely what does not fit
//! (exit status 1).  With no file, lists the built-ins.
use specd_policy::{HostConfig, PolicyHost};

fn main() -> anyhow::Result<()> {
    let host = PolicyHost::new(HostConfig::default())?;
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        for p in host.list() {
            println!(
                "{:<22} {}  {:<22} builtin={}",
                p.name,
                p.sha256,
                p.exports.to_string(),
                p.builtin
            );
        }
        return Ok(());
    }
    let mut ok = true;
    for f in files {
        let bytes = std::fs::read(&f)?;
        match host.check(&bytes) {
            Ok(info) => println!(
                "{f}: ok  sha256 {}  exports {}{}",
                info.sha256,
                info.exports,
                if info.imports_wasi {
                    "  (imports WASI: runs under deny-all WASI)"
                } else {
                    ""
                }
            ),
            Err(e) => {
                ok = false;
                println!("{f}: does not fit: {e}");
            }
        }
    }
    std::process::exit(if ok { 0 } else { 1 })
}
